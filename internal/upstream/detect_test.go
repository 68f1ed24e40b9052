package upstream

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/watchsan/watchsan/internal/testutil"
)

// How fast a frozen backend is found, and that a slow one is not (docs/design.md section
// 10.9).

// pingedBackend is one HTTPS HTTP/2 server behind a freezer, in a running pool with o; it
// returns the pool once the backend is healthy.
func pingedBackend(t *testing.T, o PoolOptions) (*Pool, *freezer) {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	fz := newFreezer(t, srv.Listener.Addr().String())
	o.Transport.RootCAs = srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	o.Logger = zaptest.NewLogger(t)
	p := newPool(t, o, "https://"+fz.ln.Addr().String()) // the certificate is for 127.0.0.1
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { fz.frozen.Store(false); fz.stalledBelow.Store(0); cancel(); <-done })
	b := p.Backends()[0]
	testutil.Eventually(t, 5*time.Second, "healthy", func() bool { return b.State() == Healthy })
	return p, fz
}

// A request waiting on a frozen backend starts its detection: with checks only every 10 s, a
// POST sent to the backend once it froze is answered ErrFrozen within a quarter of the ping
// timeout (the wait that asks for a check) and one and a half ping timeouts (the kept
// connection's PING, and from half of it on a fresh connection's), not at the next check.
func TestWaitingRequestStartsDetection(t *testing.T) {
	const ping = time.Second
	p, fz := pingedBackend(t, PoolOptions{HealthInterval: 10 * time.Second, PingTimeout: ping, ProbeInterval: time.Hour})
	b := p.Backends()[0]
	a := attempter(p, AttempterOptions{}, nil)
	warm, _ := http.NewRequest(http.MethodGet, "/api", nil) // the requests' connection, open before the freeze
	at, err := a.Do(warm.Context(), warm, Plan{Credentials: Decide(warm.Header, nil, false, IdentityOff)})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, at.Resp.Body)
	at.Cancel(nil)
	time.Sleep(100 * time.Millisecond) // past the last answer
	fz.frozen.Store(true)
	req, _ := http.NewRequest(http.MethodPost, "/api/v1/namespaces/d/configmaps", strings.NewReader(`{"metadata":{"name":"x"}}`))
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	_, err = a.Do(req.Context(), req, Plan{Credentials: Decide(req.Header, nil, false, IdentityOff)})
	took := time.Since(start)
	t.Logf("a POST on the frozen backend answered after %v: %v", took.Round(time.Millisecond), err)
	if !errors.Is(err, ErrFrozen) {
		t.Fatalf("err %v, want ErrFrozen (cut when the backend was found unhealthy)", err)
	}
	if b.State() != Unhealthy {
		t.Fatalf("backend %s, want unhealthy", b.State())
	}
	// Two ping timeouts one after the other (the check before section 10.9) would take 2.25 s.
	if bound := ping/4 + 3*ping/2 + 400*time.Millisecond; took > bound {
		t.Errorf("answered after %v, want within a quarter and one and a half ping timeouts (+slack): %v", took, bound)
	}
}

// Not dead: a backend whose kept ping connection is stuck while a fresh one answers, or whose
// every answer takes more than half the ping timeout but less than all of it, is never found
// unhealthy.
func TestSlowOrStuckPingNotDead(t *testing.T) {
	// The slow case's answers come after more than half the ping timeout (where a fresh
	// connection is tried, section 10.9) with 600 ms of slack under it: under -race on a loaded
	// two-core CI machine a 280 ms answer to a 400 ms timeout was once late.
	for _, tc := range []struct {
		name  string
		ping  time.Duration
		fault func(*freezer)
	}{
		{"the kept connection stuck", 400 * time.Millisecond, func(fz *freezer) { fz.stallOld() }},
		{"every answer after 0.6 of the ping timeout", 1500 * time.Millisecond, func(fz *freezer) { fz.delay.Store(int64(900 * time.Millisecond)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var unhealthy, dials atomic.Int32
			p, fz := pingedBackend(t, PoolOptions{
				HealthInterval: 100 * time.Millisecond, PingTimeout: tc.ping, ProbeTimeout: 5 * time.Second, ProbeInterval: time.Hour,
				OnState: func(_ *Backend, s State) {
					if s == Unhealthy {
						unhealthy.Add(1)
					}
				},
				OnDial: func(_ *Backend, conn string, err error) {
					if conn == ConnHealth && err == nil {
						dials.Add(1)
					}
				},
			})
			d0, u0 := dials.Load(), unhealthy.Load() // from healthy on (a slow first handshake is not this test's)
			tc.fault(fz)
			time.Sleep(2 * time.Second) // checks every 100 ms meanwhile: this is what is tested
			if n := unhealthy.Load() - u0; n > 0 {
				t.Fatalf("found unhealthy %d times, want never: it answered within the ping timeout", n)
			}
			if st := p.Backends()[0].hc.liveness.Load(); st != livenessAlive {
				t.Fatalf("liveness %d, want alive", st)
			}
			t.Logf("%d health connections dialled meanwhile", dials.Load()-d0)
			if tc.name == "the kept connection stuck" && dials.Load() == d0 {
				t.Fatal("no fresh connection was tried while the kept one was stuck")
			}
		})
	}
}
