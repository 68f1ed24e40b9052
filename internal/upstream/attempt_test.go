package upstream

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/watchsan/watchsan/internal/testutil"
)

func newPool(t *testing.T, o PoolOptions, urls ...string) *Pool {
	t.Helper()
	var us []*url.URL
	for _, s := range urls {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		us = append(us, u)
	}
	p, err := NewPool(us, o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// deadURL is a loopback address nothing listens on: connections are refused.
func deadURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "http://" + ln.Addr().String()
}

// sleeps records the waits of an Attempter instead of sleeping (ctx still ends them).
type sleeps struct {
	mu  sync.Mutex
	got []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.got = append(s.got, d)
	s.mu.Unlock()
	return context.Cause(ctx)
}

func attempter(p *Pool, o AttempterOptions, sl *sleeps) *Attempter {
	a := NewAttempter(p, o)
	if sl != nil {
		a.sleep = sl.sleep
	}
	return a
}

// do runs one request through Transport and checks the contract: a response or an error.
func do(t *testing.T, a *Attempter, req *http.Request) (*http.Response, error) {
	t.Helper()
	return doPlan(t, a, req, Plan{Credentials: Decide(req.Header, nil, false, IdentityOff)})
}

func doPlan(t *testing.T, a *Attempter, req *http.Request, plan Plan) (*http.Response, error) {
	t.Helper()
	resp, err := a.Transport(plan).RoundTrip(req)
	if (resp == nil) == (err == nil) {
		t.Fatalf("RoundTrip returned response %v and error %v: want exactly one", resp, err)
	}
	return resp, err
}

func TestRetryIdempotentOn503HonoursRetryAfter(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) <= 2 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "apiserver is shutting down", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	var sl sleeps
	var outcomes []string
	a := attempter(newPool(t, PoolOptions{}, srv.URL), AttempterOptions{Budget: 10 * time.Second, OnRetry: func(o string) { outcomes = append(outcomes, o) }}, &sl)
	req, _ := http.NewRequest("GET", "/api/v1/pods", nil)
	resp, err := do(t, a, req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("got %v %v", resp, err)
	}
	resp.Body.Close()
	if n.Load() != 3 || len(sl.got) != 2 || sl.got[0] < time.Second || sl.got[1] < time.Second {
		t.Fatalf("attempts %d, sleeps %v: want 3 attempts, two waits of at least 1s (Retry-After)", n.Load(), sl.got)
	}
	if strings.Join(outcomes, ",") != "retried,retried,recovered" {
		t.Fatalf("outcomes %v", outcomes)
	}
}

func TestNoRetryOfPostAfterItReachedUpstream(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		io.Copy(io.Discard, r.Body)
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	a := attempter(newPool(t, PoolOptions{}, srv.URL), AttempterOptions{Budget: 10 * time.Second}, &sleeps{})
	req, _ := http.NewRequest("POST", "/api/v1/namespaces/d/configmaps", strings.NewReader(`{"a":1}`))
	resp, err := do(t, a, req)
	if err != nil || resp.StatusCode != 503 || n.Load() != 1 {
		t.Fatalf("got %v %v after %d attempts; a POST that reached the upstream must not be retried", resp, err, n.Load())
	}
	resp.Body.Close()
}

func TestPostRetriedOnAnotherBackendWhenDialFailed(t *testing.T) {
	var body atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		body.Store(string(b))
		w.WriteHeader(201)
	}))
	defer srv.Close()
	p := newPool(t, PoolOptions{}, deadURL(t), srv.URL)
	a := attempter(p, AttempterOptions{Budget: 10 * time.Second}, &sleeps{})
	for i := 0; i < 4; i++ { // whichever backend the turn starts with
		req, _ := http.NewRequest("POST", "/x", strings.NewReader(`{"a":1}`))
		resp, err := do(t, a, req)
		if err != nil || resp.StatusCode != 201 {
			t.Fatalf("got %v %v", resp, err)
		}
		resp.Body.Close()
		if body.Load() != `{"a":1}` {
			t.Fatalf("body at upstream %q", body.Load())
		}
	}
	if s := p.Backends()[0].State(); s != Unhealthy {
		t.Fatalf("a refused backend is %v, want unhealthy", s)
	}
}

func TestBudgetSpentReturnsLastAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	var outcomes []string
	a := NewAttempter(newPool(t, PoolOptions{}, srv.URL), AttempterOptions{Budget: 300 * time.Millisecond, OnRetry: func(o string) { outcomes = append(outcomes, o) }})
	req, _ := http.NewRequest("GET", "/x", nil)
	start := time.Now()
	resp, err := do(t, a, req)
	if err != nil || resp.StatusCode != 503 {
		t.Fatalf("got %v %v", resp, err)
	}
	resp.Body.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v with a 300ms budget", d)
	}
	if len(outcomes) == 0 || outcomes[len(outcomes)-1] != "exhausted" {
		t.Fatalf("outcomes %v", outcomes)
	}
}

// a client that leaves (or a shutdown) during the wait between attempts gets an
// error back, never a nil response with a nil error (net/http then panicked).
func TestCancelDuringWaitIsAnError(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Retry-After", "5")
		http.Error(w, "slow down", http.StatusTooManyRequests)
	}))
	defer srv.Close()
	a := NewAttempter(newPool(t, PoolOptions{}, srv.URL), AttempterOptions{Budget: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "/x", nil)
	start := time.Now()
	_, err := do(t, a, req)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second || n.Load() != 1 {
		t.Fatalf("err %v after %v and %d attempts: want the context's error at once, one attempt", err, time.Since(start), n.Load())
	}
}

// with every backend down, a request is answered at once with ErrNoBackend, and
// dials nothing (only the health checker dials a down backend).
func TestNoUsableBackendFailsFastWithoutDialling(t *testing.T) {
	var dials atomic.Int32
	p := newPool(t, PoolOptions{OnDial: func(*Backend, string, error) { dials.Add(1) }}, deadURL(t))
	a := NewAttempter(p, AttempterOptions{Budget: 30 * time.Second})
	req, _ := http.NewRequest("GET", "/x", nil)
	start := time.Now()
	_, err := do(t, a, req) // unknown backend: tried, refused, never healthy: no wait
	if !errors.Is(err, ErrNoBackend) || Name(err) == "upstream" && !strings.Contains(err.Error(), "refused") {
		t.Fatalf("first request: %v, want ErrNoBackend naming the refusal", err)
	}
	if dials.Load() != 1 {
		t.Fatalf("%d dials for the first request, want 1", dials.Load())
	}
	for i := 0; i < 20; i++ {
		if _, err := do(t, a, req); !errors.Is(err, ErrNoBackend) {
			t.Fatalf("request %d: %v, want ErrNoBackend", i, err)
		}
	}
	if d := time.Since(start); d > time.Second || dials.Load() != 1 {
		t.Fatalf("21 requests took %v and %d dials: want well under a second and no dial after the first", d, dials.Load())
	}
}

// A backend that was healthy a moment ago is waited for (within the budget): a sidecar's one
// apiserver restarting. The request goes through once the health checker sees it again. On a
// stepped clock: the request waits (its timer pending) while the backend is down, and the
// checker's round that finds it back is what lets it through.
func TestWaitsForABackendHealthyAMomentAgo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	srv := &http.Server{Handler: ok}
	go srv.Serve(ln)
	const interval, budget = 100 * time.Millisecond, 10 * time.Second
	clk := newStepClock()
	p := newPool(t, PoolOptions{HealthInterval: interval, ProbeInterval: interval, Clock: clk}, "http://"+addr)
	b := p.Backends()[0]
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	clk.await(t, "the backend healthy", p.Ready)
	// The checker between rounds: its timer pending, no probe on the wire (and the request's
	// wait, a timer of the budget, is no round's).
	between := func() bool { return clk.waiting(DefaultProbeTimeout, budget) && clk.pending(DefaultProbeTimeout) == 0 }

	srv.Close() // the apiserver goes away ...
	clk.await(t, "the checker between rounds", between)
	clk.Step(interval + interval/4) // past the round's timer, jittered or not
	clk.await(t, "the backend found down", func() bool { return b.State() == Unhealthy })

	a := NewAttempter(p, AttempterOptions{Budget: budget})
	type answer struct {
		resp *http.Response
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest("GET", "/x", nil)
		resp, err := a.Transport(Plan{Credentials: Decide(req.Header, nil, false, IdentityOff)}).RoundTrip(req)
		got <- answer{resp, err}
	}()
	// It waits: no usable backend, one healthy the moment the checker found it down, so the
	// whole budget is left.
	clk.await(t, "the request waiting for a usable backend", func() bool { return clk.pending(budget) == 1 || len(got) > 0 })
	if len(got) > 0 {
		an := <-got
		t.Fatalf("a request with a backend healthy a moment ago did not wait: %v %v", an.resp, an.err)
	}

	ln2, err := net.Listen("tcp", addr) // ... and comes back on the same port
	if err != nil {
		t.Fatal(err)
	}
	srv2 := &http.Server{Handler: ok}
	go srv2.Serve(ln2)
	defer srv2.Close()
	clk.await(t, "the checker between rounds", between)
	clk.Step(interval + interval/4)
	clk.await(t, "the request through once the backend is back", func() bool { return len(got) > 0 })
	an := <-got
	if an.err != nil {
		t.Fatalf("a restarting backend must be waited for within the budget: %v", an.err)
	}
	an.resp.Body.Close()
}

// a health checker with manners. An upstream that refuses connections costs about
// one dial per interval (not a hot loop), the backend starts unknown (not ready), and the
// transition is logged once. On a stepped clock: a request every 5 ms for 2 s of it.
func TestHealthCheckerManners(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	var dials atomic.Int32
	interval := 200 * time.Millisecond
	clk := newStepClock()
	p := newPool(t, PoolOptions{HealthInterval: interval, Logger: zap.New(core), OnDial: func(*Backend, string, error) { dials.Add(1) }, Clock: clk}, deadURL(t))
	b := p.Backends()[0]
	if b.State() != Unknown || p.Ready() {
		t.Fatalf("a new backend is %v, ready %v: want unknown, not ready", b.State(), p.Ready())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	// Real traffic keeps failing too: passive failures ask for early re-checks. (Its retry
	// waits are recorded, not waited: the checker is what is counted.)
	a := attempter(p, AttempterOptions{}, &sleeps{})
	window, every := 2*time.Second, 5*time.Millisecond
	for range int(window / every) {
		req, _ := http.NewRequest("GET", "/x", nil)
		_, _ = a.Transport(Plan{Credentials: Decide(req.Header, nil, false, IdentityOff)}).RoundTrip(req)
		clk.await(t, "the checker between rounds", func() bool {
			return clk.waiting(DefaultProbeTimeout) && clk.pending(DefaultProbeTimeout) == 0
		})
		clk.Step(every)
	}
	cancel()
	<-done
	// The checker: probes at 0, then 200ms-capped backoff from 200ms: ~10 in 2s; plus at most
	// one early re-check per interval and the first request's dial.
	if n := dials.Load(); n > int32(2*window/interval)+3 {
		t.Fatalf("%d dials in %v with a %v interval: want about one per interval", n, window, interval)
	}
	if n := logs.FilterMessage("upstream unhealthy").Len(); n != 1 {
		t.Fatalf("%d 'upstream unhealthy' lines, want exactly 1", n)
	}
	if b.State() != Unhealthy || p.Ready() {
		t.Fatalf("state %v ready %v", b.State(), p.Ready())
	}
}

func TestHealthTransitionsLoggedOnce(t *testing.T) {
	var up atomic.Bool
	up.Store(true)
	var probes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		probes.Add(1)
		if !up.Load() {
			http.Error(w, "not ready", 500)
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	core, logs := observer.New(zapcore.InfoLevel)
	var states []State
	var mu sync.Mutex
	p := newPool(t, PoolOptions{HealthInterval: 50 * time.Millisecond, ProbeInterval: 50 * time.Millisecond, Logger: zap.New(core), OnState: func(_ *Backend, s State) {
		mu.Lock()
		states = append(states, s)
		mu.Unlock()
	}}, srv.URL)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)
	testutil.Eventually(t, 5*time.Second, "healthy", p.Ready)
	up.Store(false)
	testutil.Eventually(t, 5*time.Second, "degraded", func() bool { return p.Backends()[0].State() == Degraded })
	up.Store(true)
	testutil.Eventually(t, 5*time.Second, "healthy again", p.Ready)
	after := probes.Load()
	testutil.Eventually(t, 5*time.Second, "5 more probes answered", func() bool { return probes.Load() >= after+5 }) // none may log again
	mu.Lock()
	defer mu.Unlock()
	if len(states) != 3 || states[0] != Healthy || states[1] != Degraded || states[2] != Healthy {
		t.Fatalf("transitions %v, want healthy, degraded (readyz answered 500), healthy", states)
	}
	if h, d := logs.FilterMessage("upstream healthy").Len(), logs.FilterMessageSnippet("upstream degraded").Len(); h != 2 || d != 1 {
		t.Fatalf("logged healthy %d, degraded %d times; want 2 and 1", h, d)
	}
}

func TestPickAvoidsAndSkipsUnhealthy(t *testing.T) {
	p := newPool(t, PoolOptions{}, "http://a", "http://b", "http://c")
	a, b, c := p.Backends()[0], p.Backends()[1], p.Backends()[2]
	p.setState(b, Unhealthy, errors.New("down"))
	for i := 0; i < 10; i++ {
		if got := p.pick(false, a); got != c {
			t.Fatalf("pick(avoid a) with b down = %v, want c", got)
		}
	}
	p.setState(c, Unhealthy, errors.New("down"))
	if got := p.pick(false, a); got != a {
		t.Fatalf("pick(avoid a) with only a usable = %v, want a", got)
	}
	p.setState(b, Degraded, errors.New("readyz 500"))
	for i := 0; i < 10; i++ {
		if got := p.pick(false, nil); got != a {
			t.Fatalf("pick with a healthy and b degraded = %v, want a", got)
		}
	}
	p.setState(a, Unhealthy, errors.New("down"))
	if got := p.pick(false, nil); got != b {
		t.Fatalf("only b degraded: pick = %v, want b (it answers: a last resort)", got)
	}
	p.setState(b, Unhealthy, errors.New("down"))
	if got := p.pick(false, nil); got != nil {
		t.Fatalf("every backend down: pick = %v, want none", got)
	}
}

func TestBackoffGrowsWithJitterAndResets(t *testing.T) {
	b := ResumeBackoff
	want := []time.Duration{800 * time.Millisecond, 1600 * time.Millisecond, 3200 * time.Millisecond, 6400 * time.Millisecond,
		12800 * time.Millisecond, 25600 * time.Millisecond, 30 * time.Second, 30 * time.Second}
	for i, w := range want {
		d := b.Next()
		if d < w*3/4 || d > w*5/4 {
			t.Fatalf("delay %d = %v, want %v +-25%%", i, d, w)
		}
	}
	b.Reset()
	if d := b.Next(); d > time.Second {
		t.Fatalf("after Reset: %v", d)
	}
}

// At shutdown a request waiting out a Retry-After gets the upstream's answer at once, body
// and all, instead of being cut at the shutdown timeout.
func TestDoneEndsTheWaitWithTheLastAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "30")
		http.Error(w, "slow down", http.StatusTooManyRequests)
	}))
	defer srv.Close()
	done := make(chan struct{})
	a := NewAttempter(newPool(t, PoolOptions{}, srv.URL), AttempterOptions{Budget: time.Minute, Done: done})
	go func() { time.Sleep(200 * time.Millisecond); close(done) }()
	req, _ := http.NewRequest("GET", "/x", nil)
	start := time.Now()
	resp, err := do(t, a, req)
	if err != nil || resp.StatusCode != 429 || time.Since(start) > 5*time.Second {
		t.Fatalf("got %v %v after %v: want the 429 at once when Done closes", resp, err, time.Since(start))
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "slow down") || resp.Header.Get("Retry-After") != "30" {
		t.Fatalf("body %q, Retry-After %q: want the upstream's", body, resp.Header.Get("Retry-After"))
	}
}

// A healthy backend's /readyz is asked at most every ProbeInterval, however short the
// HealthInterval (the pings' period): /readyz goes through the apiserver's handler chain. On a
// stepped clock: each round is stepped to once the last is over, and each probe's arrival is
// timed on that clock.
func TestReadyzAtMostEveryProbeInterval(t *testing.T) {
	const interval, probeInterval = 20 * time.Millisecond, 400 * time.Millisecond
	clk := newStepClock()
	var mu sync.Mutex
	var arrivals []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			mu.Lock()
			arrivals = append(arrivals, clk.Now())
			mu.Unlock()
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	p := newPool(t, PoolOptions{HealthInterval: interval, ProbeInterval: probeInterval, Clock: clk}, srv.URL)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	clk.await(t, "healthy", p.Ready)
	// between: the loop waits for its next round, no probe in flight (DefaultProbeTimeout).
	between := func() bool { return clk.waiting(DefaultProbeTimeout) && clk.pending(DefaultProbeTimeout) == 0 }
	for range 2 * 5 * int(probeInterval/interval) { // two seconds of rounds: about five probes
		clk.await(t, "the round over", between)
		clk.Step(interval)
	}
	clk.await(t, "the last round over", between)
	mu.Lock()
	at := append([]time.Time(nil), arrivals...)
	mu.Unlock()
	if len(at) < 5 {
		t.Fatalf("%d probes in %v of rounds every %v, want about one per %v", len(at), 10*probeInterval, interval, probeInterval)
	}
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < probeInterval {
			t.Fatalf("/readyz probes %v apart with a %v probe interval (%v health interval): want at least the interval", gap, probeInterval, interval)
		}
	}
}

// A proxy in front of a dead apiserver answers 502 (Envoy's "upstream connect error", the
// fault layer's): a GET is tried on another backend, not relayed (the soak found a watch's
// client getting that 502 and relisting).
func TestBadGatewayRetriedOnAnotherBackend(t *testing.T) {
	var gw, ok atomic.Int32
	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			gw.Add(1)
		}
		http.Error(w, "upstream connect error", http.StatusBadGateway)
	}))
	defer dead.Close()
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok.Add(1)
		io.WriteString(w, "ok")
	}))
	defer live.Close()
	a := attempter(newPool(t, PoolOptions{}, dead.URL, live.URL), AttempterOptions{Budget: 10 * time.Second}, &sleeps{})
	for i := 0; i < 4; i++ { // whichever backend the turn starts with
		req, _ := http.NewRequest("GET", "/api/v1/pods", nil)
		resp, err := do(t, a, req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("got %v %v: a 502 from a gateway must be retried on the other backend", resp, err)
		}
		resp.Body.Close()
	}
	if gw.Load() == 0 {
		t.Fatal("the 502 backend was never tried: the test proves nothing")
	}
}

// A watch's resumes are one loop (docs/design.md section 5): a call of Do after the caller's
// own attempt failed (Plan.AfterFailure) waits the caller's backoff first, and the retries
// within it go on with the same backoff; a wait that would pass the deadline makes no attempt.
func TestAfterFailureBacksOffBeforeTheFirstAttempt(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	var sl sleeps
	a := attempter(newPool(t, PoolOptions{}, srv.URL), AttempterOptions{}, &sl)
	bo := ResumeBackoff
	req, _ := http.NewRequest("GET", "/api/v1/pods?watch=1", nil)
	plan := Plan{Watch: true, Backoff: &bo, AfterFailure: true, Deadline: time.Now().Add(time.Minute)}
	at, err := a.Do(context.Background(), req, plan)
	if err != nil {
		t.Fatal(err)
	}
	at.Resp.Body.Close()
	at.Cancel(nil)
	// 0.8 s (+-25%) before the first attempt, 1.6 s (+-25%) before the retry of its 503.
	if n.Load() != 2 || len(sl.got) != 2 || sl.got[0] < 600*time.Millisecond || sl.got[0] > time.Second ||
		sl.got[1] < 1200*time.Millisecond || bo.Failures() != 2 {
		t.Fatalf("attempts %d, sleeps %v, failures %d: want 2 attempts after waits of ~0.8s and ~1.6s", n.Load(), sl.got, bo.Failures())
	}

	plan.Deadline = time.Now().Add(time.Second) // the next wait, 3.2 s (+-25%), passes it
	if _, err := a.Do(context.Background(), req, plan); !errors.Is(err, ErrDeadline) || n.Load() != 2 || len(sl.got) != 2 {
		t.Fatalf("got %v after %d attempts and sleeps %v: want ErrDeadline, no attempt, no wait", err, n.Load(), sl.got)
	}
}
