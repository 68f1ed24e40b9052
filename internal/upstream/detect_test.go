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
// On a stepped clock, the steps are those times.
func TestWaitingRequestStartsDetection(t *testing.T) {
	const ping = time.Second
	clk := newStepClock()
	p, fz := pingedBackend(t, PoolOptions{HealthInterval: 10 * time.Second, PingTimeout: ping, ProbeInterval: time.Hour, Clock: clk})
	b := p.Backends()[0]
	a := attempter(p, AttempterOptions{}, nil)
	warm, _ := http.NewRequest(http.MethodGet, "/api", nil) // the requests' connection, open before the freeze
	at, err := a.Do(warm.Context(), warm, Plan{Credentials: Decide(warm.Header, nil, false, IdentityOff)})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, at.Resp.Body)
	at.Cancel(nil)
	clk.await(t, "the first round over", func() bool { return clk.pending(ping) == 0 && clk.pending(10*time.Second) == 1 })
	clk.Step(100 * time.Millisecond) // past the last answer
	fz.frozen.Store(true)
	// Its body is sent before the freeze is found: a POST cut before any of its body left is
	// retried elsewhere (section 10.8), which is not what this test is about.
	body := &readBody{r: strings.NewReader(`{"metadata":{"name":"x"}}`)}
	req, _ := http.NewRequest(http.MethodPost, "/api/v1/namespaces/d/configmaps", body)
	req.Header.Set("Content-Type", "application/json")
	start := clk.Now()
	errc := make(chan error, 1)
	go func() {
		_, err := a.Do(req.Context(), req, Plan{Credentials: Decide(req.Header, nil, false, IdentityOff)})
		errc <- err
	}()
	clk.await(t, "the POST waiting, its body sent", func() bool { return clk.pending(ping/4) == 1 && body.done.Load() })
	clk.Step(ping / 4) // nothing came from the backend meanwhile: it asks for a check now
	clk.await(t, "the early check's ping", func() bool { return clk.pending(ping) == 1 && clk.pending(ping/2) == 1 })
	clk.Step(ping / 2)
	clk.await(t, "the fresh connection's ping", func() bool { return clk.pending(ping) == 2 })
	clk.Step(ping / 2)
	clk.await(t, "the kept connection's ping given up", func() bool { return clk.pending(ping) == 1 })
	select {
	case err := <-errc:
		t.Fatalf("answered %v after one ping timeout, while the fresh connection's ping had time left", err)
	default:
	}
	clk.Step(ping / 2)
	select {
	case err = <-errc:
	case <-time.After(20 * time.Second):
		t.Fatal("the POST waiting on the frozen backend was not cut")
	}
	took := clk.Since(start)
	t.Logf("a POST on the frozen backend answered after %v of the clock: %v", took, err)
	if !errors.Is(err, ErrFrozen) {
		t.Fatalf("err %v, want ErrFrozen (cut when the backend was found unhealthy)", err)
	}
	if b.State() != Unhealthy {
		t.Fatalf("backend %s, want unhealthy", b.State())
	}
	// Two ping timeouts one after the other (the check before section 10.9) would take 2.25 s.
	if bound := ping/4 + 3*ping/2; took > bound {
		t.Errorf("answered after %v, want within a quarter and one and a half ping timeouts: %v", took, bound)
	}
}

// Not dead: a backend whose kept ping connection is stuck while a fresh one answers, or whose
// every answer takes more than half the ping timeout but less than all of it, is never found
// unhealthy. On a stepped clock: it moves only where the pings wait (half a timeout, an
// answer's delay), never past a timeout while an answer is on its way.
func TestSlowOrStuckPingNotDead(t *testing.T) {
	const interval = 100 * time.Millisecond
	for _, tc := range []struct {
		name  string
		ping  time.Duration
		fault func(*freezer)
		// round steps the clock through one round, from the loop's wait to the next.
		round func(t *testing.T, clk *stepClock, fz *freezer, ping time.Duration)
	}{
		{"the kept connection stuck", 400 * time.Millisecond, func(fz *freezer) { fz.stallOld() },
			func(t *testing.T, clk *stepClock, _ *freezer, ping time.Duration) {
				// While the kept connection's ping is stuck (or queued behind a stuck one), a
				// fresh connection is tried at half the timeout, and answers; the stuck ping ends
				// at its timeout as the rounds go by, and the next kept connection answers.
				clk.Step(interval)
				between := func() bool { return clk.waiting(ping/2, ping, 5*time.Second) }
				clk.await(t, "the round's ping", func() bool { return clk.pending(ping/2) == 1 || between() })
				if !between() {
					clk.Step(ping / 2)
				}
			}},
		{"every answer after 0.6 of the ping timeout", 1500 * time.Millisecond, func(fz *freezer) { fz.markOld(); fz.delay.Store(int64(900 * time.Millisecond)) },
			func(t *testing.T, clk *stepClock, fz *freezer, ping time.Duration) {
				const delay = 900 * time.Millisecond
				held := fz.oldHolds.Load()
				clk.Step(interval)
				clk.await(t, "the kept connection's answer held back", func() bool {
					return clk.pending(ping/2) == 1 && fz.oldHolds.Load() > held
				})
				clk.Step(ping / 2)       // a fresh connection is tried too (its answers held back as well)
				clk.Step(delay - ping/2) // the kept connection's answer comes, within its timeout
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var unhealthy, dials atomic.Int32
			clk := newStepClock()
			p, fz := pingedBackend(t, PoolOptions{
				HealthInterval: interval, PingTimeout: tc.ping, ProbeTimeout: 5 * time.Second, ProbeInterval: time.Hour,
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
				Clock: clk,
			})
			fz.delayOn.Store(clk)
			// between says the loop waits for its next round and no ping of the last is on
			// its way but stuck ones (they end at their timeouts).
			between := func() bool { return clk.waiting(tc.ping/2, tc.ping, 5*time.Second, 900*time.Millisecond) }
			clk.await(t, "the first round over", between)
			d0, u0 := dials.Load(), unhealthy.Load() // from healthy on (a slow first handshake is not this test's)
			tc.fault(fz)
			for range 20 { // what was two seconds of checks every 100 ms
				tc.round(t, clk, fz, tc.ping)
				clk.await(t, "the round over", between)
				if n := unhealthy.Load() - u0; n > 0 {
					t.Fatalf("found unhealthy %d times, want never: it answered within the ping timeout", n)
				}
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

// readBody is a request body that tells when it was read to its end.
type readBody struct {
	r    io.Reader
	done atomic.Bool
}

func (b *readBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.done.Store(true)
	}
	return n, err
}
