package upstream

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// lease puts a watch attempt of scope on b, as the Attempter does, and returns it with the
// attempt's context.
func lease(p *Pool, b *Backend, scope string, from uint64, movable bool) (*Lease, context.Context) {
	ctx, cancel := context.WithCancelCause(context.Background())
	l := p.newLease(b, Plan{Watch: true, Scope: scope, Resource: "configmaps", From: from}, cancel)
	l.SetMovable(movable)
	return l, ctx
}

func moveReason(ctx context.Context) (MoveReason, bool) {
	var m *MoveError
	if errors.As(context.Cause(ctx), &m) {
		return m.Reason, true
	}
	return 0, false
}

func unlimited() *bucket { return &bucket{rate: -1} }

// short requests go to the backend with the fewest outstanding requests,
// watches to the one with the fewest open watches; preferred backends first.
func TestPickLeastLoaded(t *testing.T) {
	p := newPool(t, PoolOptions{}, "http://a", "http://b", "http://c")
	a, b, c := p.Backends()[0], p.Backends()[1], p.Backends()[2]
	a.inflight.Store(5)
	b.inflight.Store(1)
	c.inflight.Store(3)
	for i := 0; i < 10; i++ {
		if got := p.pick(false, nil); got != b {
			t.Fatalf("request pick = %v, want b (fewest outstanding requests)", got)
		}
	}
	for range 4 {
		lease(p, a, "", 0, true)
	}
	lease(p, b, "", 0, true)
	lease(p, b, "", 0, true)
	for i := 0; i < 10; i++ {
		if got := p.pick(true, nil); got != c {
			t.Fatalf("watch pick = %v, want c (fewest open watches)", got)
		}
	}
	p.setState(c, Degraded, errors.New("readyz 500"))
	if got := p.pick(true, nil); got != b {
		t.Fatalf("watch pick with c degraded = %v, want b (fewest among the preferred)", got)
	}
	p.markLagging(b, time.Now(), "test")
	if got := p.pick(true, nil); got != a {
		t.Fatalf("watch pick with b lagging = %v, want a (the one preferred left)", got)
	}
	// Equal loads: turns spread them.
	q := newPool(t, PoolOptions{}, "http://a", "http://b", "http://c")
	seen := map[*Backend]int{}
	for i := 0; i < 30; i++ {
		seen[q.pick(false, nil)]++
	}
	if len(seen) != 3 {
		t.Fatalf("equal loads went to %d backends, want all 3: %v", len(seen), seen)
	}
}

// Through the Attempter, watches spread over the backends by open watches, and every attempt
// leaves its backend's count when it ends; requests count while outstanding.
func TestAttemptsCountTowardLoad(t *testing.T) {
	hang := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	s1, s2 := httptest.NewServer(hang), httptest.NewServer(hang)
	defer s1.Close()
	defer s2.Close()
	p := newPool(t, PoolOptions{}, s1.URL, s2.URL)
	a := NewAttempter(p, AttempterOptions{})
	var ats []Attempt
	for range 6 {
		req, _ := http.NewRequest("GET", "/api/v1/configmaps?watch=1", nil)
		at, err := a.Do(context.Background(), req, Plan{Watch: true})
		if err != nil {
			t.Fatal(err)
		}
		if at.Lease == nil || at.Lease.Backend() != at.Backend {
			t.Fatalf("a watch attempt without its lease: %+v", at)
		}
		ats = append(ats, at)
	}
	b0, b1 := p.Backends()[0], p.Backends()[1]
	if b0.OpenWatches() != 3 || b1.OpenWatches() != 3 {
		t.Fatalf("open watches %d/%d, want 3/3", b0.OpenWatches(), b1.OpenWatches())
	}
	req, _ := http.NewRequest("GET", "/api/v1/configmaps", nil)
	at, err := a.Do(context.Background(), req, Plan{})
	if err != nil {
		t.Fatal(err)
	}
	if at.Lease != nil || b0.InFlight()+b1.InFlight() != 1 {
		t.Fatalf("a request: lease %v, in flight %d+%d; want no lease, 1 outstanding", at.Lease, b0.InFlight(), b1.InFlight())
	}
	at.Cancel(nil)
	at.Cancel(nil) // twice: counted once
	for _, at := range ats {
		at.Cancel(nil)
	}
	if n := b0.OpenWatches() + b1.OpenWatches() + b0.InFlight() + b1.InFlight(); n != 0 {
		t.Fatalf("%d attempts still counted after every one ended", n)
	}
}

// an unhealthy backend's watches all move at once (when another backend is
// usable), a degraded one's movable watches at the drain rate; nothing moves while no other
// backend can take them.
func TestDrain(t *testing.T) {
	p := newPool(t, PoolOptions{}, "http://a", "http://b")
	a, b := p.Backends()[0], p.Backends()[1]
	p.setState(a, Healthy, nil)
	p.setState(b, Healthy, nil)
	var ctxs []context.Context
	for i := range 4 {
		_, ctx := lease(p, a, "", 0, i%2 == 0)
		ctxs = append(ctxs, ctx)
	}
	p.setState(a, Degraded, errors.New("readyz 500"))
	p.drain(p.Backends(), time.Now(), &bucket{rate: 10, tokens: 1})
	moved := 0
	for _, ctx := range ctxs {
		if r, ok := moveReason(ctx); ok {
			moved++
			if r != MoveDegraded {
				t.Fatalf("moved for %v, want degraded", r)
			}
		}
	}
	if moved != 1 {
		t.Fatalf("%d watches moved off a degraded backend with one token, want 1", moved)
	}
	p.setState(b, Unhealthy, errors.New("down"))
	p.setState(a, Unhealthy, errors.New("down"))
	p.drain(p.Backends(), time.Now(), unlimited())
	if a.leases.moving.Load() != 1 {
		t.Fatalf("watches moved while no other backend was usable: %d moving", a.leases.moving.Load())
	}
	p.setState(b, Healthy, nil)
	p.drain(p.Backends(), time.Now(), unlimited())
	for i, ctx := range ctxs {
		if _, ok := moveReason(ctx); !ok {
			t.Fatalf("watch %d (movable %v) still on an unhealthy backend", i, i%2 == 0)
		}
	}
}

// after a recovery, movable watches move onto the emptier healthy backend,
// until the counts differ by at most one, at the rebalance rate; watches in their initial
// phase stay.
func TestRebalanceEvensOut(t *testing.T) {
	p := newPool(t, PoolOptions{}, "http://a", "http://b", "http://c")
	a, b, c := p.Backends()[0], p.Backends()[1], p.Backends()[2]
	for _, x := range p.Backends() {
		p.setState(x, Healthy, nil)
	}
	var ls []*Lease
	for range 8 {
		l, _ := lease(p, a, "", 0, true)
		ls = append(ls, l)
	}
	lease(p, a, "", 0, false) // initial phase: never rebalanced
	lease(p, b, "", 0, true)
	k := &bucket{rate: 2, tokens: 2}
	p.rebalance(p.Backends(), time.Now(), k)
	if n := a.leases.moving.Load(); n != 2 {
		t.Fatalf("%d moved with two tokens, want 2", n)
	}
	k.tokens = 100
	p.rebalance(p.Backends(), time.Now(), k)
	// a: 9 (8 movable), b: 1, c: 0 -> even is 4/3/3: a gives 5.
	if n := a.leases.moving.Load(); n != 5 {
		t.Fatalf("%d moved off a (9 watches, b 1, c 0), want 5", n)
	}
	// The moved watches resume where the Attempter sends them: the fewest watches.
	for _, l := range ls {
		if l.moved.Load() {
			l.release()
			lease(p, p.pick(true, a), "", 0, true)
		}
	}
	if a.OpenWatches() != 4 || b.OpenWatches() != 3 || c.OpenWatches() != 3 {
		t.Fatalf("after the moves: %d/%d/%d, want 4/3/3", a.OpenWatches(), b.OpenWatches(), c.OpenWatches())
	}
	p.rebalance(p.Backends(), time.Now(), k)
	for _, x := range p.Backends() {
		if n := x.leases.moving.Load(); n != 0 {
			t.Fatalf("%d more moved off %v once even: want 0", n, x)
		}
	}
}

// a watch that does not deliver, within the lag timeout, an event a watch of
// the same scope on another backend delivered is moved and its backend counted lagging; a
// watch that keeps up (even a little late), or a quiet scope, is left alone.
func TestLagDetection(t *testing.T) {
	var detected atomic.Int32
	p := newPool(t, PoolOptions{LagTimeout: time.Second, OnDetect: func(_ *Backend, what string, _ time.Duration) {
		if what == "lagging" {
			detected.Add(1)
		}
	}}, "http://a", "http://b")
	a, b := p.Backends()[0], p.Backends()[1]
	slow, slowCtx := lease(p, a, "/api/v1/namespaces/x/configmaps", 100, true)
	fast, _ := lease(p, b, "/api/v1/namespaces/x/configmaps", 100, true)
	_, otherCtx := lease(p, a, "/api/v1/namespaces/y/configmaps", 50, true) // a quiet scope
	t0 := time.Now()
	fast.Progress(110, 110)
	p.findLag(p.Backends(), t0)
	slow.Progress(110, 110) // a moment late: fine
	fast.Progress(120, 120)
	p.findLag(p.Backends(), t0.Add(900*time.Millisecond))
	p.findLag(p.Backends(), t0.Add(1500*time.Millisecond)) // behind 120 only since 0.9s
	if _, ok := moveReason(slowCtx); ok || a.Lagging() {
		t.Fatal("a watch that kept up within the lag timeout was moved")
	}
	p.findLag(p.Backends(), t0.Add(2000*time.Millisecond))
	if r, ok := moveReason(slowCtx); !ok || r != MoveLagging {
		t.Fatalf("a watch behind its peer for 1.1s (timeout 1s): moved %v %v, want lagging", r, ok)
	}
	if !a.Lagging() || b.Lagging() || detected.Load() != 1 {
		t.Fatalf("lagging: a %v b %v, detections %d; want a only, once", a.Lagging(), b.Lagging(), detected.Load())
	}
	if _, ok := moveReason(otherCtx); ok {
		t.Fatal("a quiet watch of another scope was moved")
	}
	if hw, ok := p.HighWater("configmaps"); !ok || hw != 120 {
		t.Fatalf("high-water mark %d %v, want 120", hw, ok)
	}
	p.ForgetHighWater("configmaps")
	if _, ok := p.HighWater("configmaps"); ok {
		t.Fatal("a forgotten mark is still known")
	}
}

// a watch behind its peers while it is busy writing to its client (a client
// that stopped reading) is behind because of its client: it is not moved, and its backend is
// not counted lagging, however long it stays so. Once it waits for its upstream again, its lag
// clock starts from then.
func TestLagNotCountedWhileBusyOnClient(t *testing.T) {
	p := newPool(t, PoolOptions{LagTimeout: time.Second}, "http://a", "http://b")
	a, b := p.Backends()[0], p.Backends()[1]
	slow, slowCtx := lease(p, a, "/api/v1/namespaces/x/configmaps", 100, true)
	fast, _ := lease(p, b, "/api/v1/namespaces/x/configmaps", 100, true)
	t0 := time.Now()
	slow.Busy()
	fast.Progress(110, 110)
	for _, d := range []time.Duration{0, 1500 * time.Millisecond, 5 * time.Second} {
		p.findLag(p.Backends(), t0.Add(d))
	}
	if _, ok := moveReason(slowCtx); ok || a.Lagging() {
		t.Fatalf("a watch busy on its client for 5s was moved (%v) or its backend counted lagging (%v)", ok, a.Lagging())
	}
	slow.Waiting(t0.Add(5 * time.Second).UnixNano())
	p.findLag(p.Backends(), t0.Add(5*time.Second))
	p.findLag(p.Backends(), t0.Add(5800*time.Millisecond))
	if _, ok := moveReason(slowCtx); ok {
		t.Fatal("a watch waiting for its upstream for 0.8s behind its peer (timeout 1s) was moved")
	}
	p.findLag(p.Backends(), t0.Add(6100*time.Millisecond))
	if r, ok := moveReason(slowCtx); !ok || r != MoveLagging || !a.Lagging() || b.Lagging() {
		t.Fatalf("a watch waiting 1.1s for its upstream behind its peer: moved %v %v, lagging a %v b %v; want lagging, a only", r, ok, a.Lagging(), b.Lagging())
	}
}

// a live membership change adds backends (tried once probed) and removes
// others, whose watches move at the drain rate; a drained removed backend is forgotten.
func TestSetUpstreams(t *testing.T) {
	var forgotten, added []string
	var mu sync.Mutex
	p := newPool(t, PoolOptions{
		OnForget: func(b *Backend) { mu.Lock(); forgotten = append(forgotten, b.String()); mu.Unlock() },
		OnAdd:    func(b *Backend) { mu.Lock(); added = append(added, b.String()); mu.Unlock() },
	}, "http://a", "http://b")
	a := p.Backends()[0]
	p.setState(a, Healthy, nil)
	p.setState(p.Backends()[1], Healthy, nil)
	l, ctx := lease(p, a, "", 0, true)
	u := func(s string) *url.URL { x, _ := url.Parse(s); return x }
	if _, _, err := p.SetUpstreams(nil); err == nil {
		t.Fatal("an empty set was accepted")
	}
	add, rm, err := p.SetUpstreams([]*url.URL{u("http://b"), u("http://c")})
	if err != nil || len(add) != 1 || add[0] != "http://c" || len(rm) != 1 || rm[0] != "http://a" {
		t.Fatalf("added %v removed %v err %v", add, rm, err)
	}
	c := p.Backends()[1]
	if c.String() != "http://c" || c.usable() || a.State() != Removed || a.usable() {
		t.Fatalf("after the change: %s", p.describe())
	}
	p.setState(a, Healthy, nil) // a removed backend's checks change nothing
	if a.State() != Removed {
		t.Fatal("a removed backend's state changed")
	}
	p.drain(p.Backends(), time.Now(), unlimited())
	if r, ok := moveReason(ctx); !ok || r != MoveRemoved {
		t.Fatalf("the removed backend's watch: moved %v %v, want removed", r, ok)
	}
	if len(forgotten) != 0 {
		t.Fatal("forgotten while a watch was still on it")
	}
	l.release()
	p.drain(p.Backends(), time.Now(), unlimited())
	if len(forgotten) != 0 {
		t.Fatal("forgotten at once: its last counts could not be scraped")
	}
	p.drain(p.Backends(), time.Now().Add(RemoveGrace+time.Second), unlimited())
	mu.Lock()
	defer mu.Unlock()
	if len(forgotten) != 1 || forgotten[0] != "http://a" || len(added) != 1 || len(p.Backends()) != 2 {
		t.Fatalf("forgotten %v added %v backends %s", forgotten, added, p.describe())
	}
}

// freezer is a TCP proxy that can stop forwarding (a SIGSTOPped apiserver: connections are
// accepted by the kernel, nothing answers), stop forwarding on the connections it accepted
// before a moment only (stallOld: one stuck connection), or hold back every answer (delay: a
// slow one).
type freezer struct {
	ln     net.Listener
	target string
	frozen atomic.Bool
	conns  atomic.Int64 // connections accepted
	// stalledBelow: connections numbered below it forward nothing.
	stalledBelow atomic.Int64
	delay        atomic.Int64 // ns each chunk from the target waits
	// delayOn, when set, times delay (a stepped clock); nil: the real clock.
	delayOn atomic.Pointer[stepClock]
	// oldHolds counts the chunks delay held (on delayOn) on connections numbered below
	// oldBelow (markOld).
	oldBelow, oldHolds atomic.Int64
}

func newFreezer(t *testing.T, target string) *freezer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, target: target}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serve(t, c, f.conns.Add(1))
		}
	}()
	return f
}

// markOld marks every connection accepted so far as old (oldHolds).
func (f *freezer) markOld() { f.oldBelow.Store(f.conns.Load() + 1) }

// stallOld makes every connection accepted so far forward nothing from now on.
func (f *freezer) stallOld() { f.stalledBelow.Store(f.conns.Load() + 1) }

func (f *freezer) serve(t *testing.T, c net.Conn, n int64) {
	up, err := net.Dial("tcp", f.target)
	if err != nil {
		c.Close()
		return
	}
	pipe := func(dst, src net.Conn, answers bool) {
		defer dst.Close()
		defer src.Close()
		buf := make([]byte, 32<<10)
		for {
			n2, err := src.Read(buf)
			for f.frozen.Load() || n < f.stalledBelow.Load() {
				time.Sleep(10 * time.Millisecond)
			}
			if d := f.delay.Load(); answers && d > 0 && n2 > 0 {
				if c := f.delayOn.Load(); c != nil {
					ch := c.After(time.Duration(d))
					if n < f.oldBelow.Load() {
						f.oldHolds.Add(1) // once the clock holds it
					}
					<-ch
				} else {
					time.Sleep(time.Duration(d))
				}
			}
			if n2 > 0 {
				if _, err := dst.Write(buf[:n2]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go pipe(up, c, false)
	go pipe(c, up, true)
}

// a frozen backend (nothing answers, not even the TLS handshake) is found
// unhealthy within a health interval and one and a half ping timeouts (docs/design.md
// section 10.9); one that answers pings while its
// /readyz is slower than the probe timeout (etcd slow) is degraded, never unhealthy. On a
// stepped clock: the clock moves only while no ping to the live backend is unanswered, so a
// loaded machine cannot make it late, and the frozen one's detection is counted in steps.
func TestPingTellsFrozenFromSlow(t *testing.T) {
	const interval, pingTO, probeTO = 200 * time.Millisecond, 300 * time.Millisecond, 500 * time.Millisecond
	var slow atomic.Bool
	unblock := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" && slow.Load() {
			select { // slower than any probe timeout: answers only once the probe gave up
			case <-r.Context().Done():
			case <-unblock:
			}
		}
		io.WriteString(w, "ok")
	})
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	defer close(unblock)
	fz := newFreezer(t, srv.Listener.Addr().String())
	front := "https://" + fz.ln.Addr().String()
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	var detect atomic.Int64
	clk := newStepClock()
	p := newPool(t, PoolOptions{
		HealthInterval: interval, PingTimeout: pingTO, ProbeTimeout: probeTO,
		ProbeInterval: interval, Transport: TransportOptions{RootCAs: roots}, Logger: zaptest.NewLogger(t),
		OnDetect: func(_ *Backend, what string, d time.Duration) { detect.Store(int64(d)) },
		Clock:    clk,
	}, front)
	// The certificate is for 127.0.0.1 (the freezer's address too).
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	b := p.Backends()[0]
	clk.await(t, "healthy", func() bool { return b.State() == Healthy })
	if !b.pingable() {
		t.Fatal("an HTTPS HTTP/2 backend is not pinged")
	}
	// round steps to the next round once the last one is over: the loop waits, and no ping
	// is unanswered (a /readyz probe may be: only the steps time it out).
	round := func(what string) {
		t.Helper()
		clk.await(t, what, func() bool {
			return clk.waiting(pingTO/2, pingTO, probeTO) && clk.pending(pingTO) == 0 && clk.pending(pingTO/2) == 0
		})
		clk.Step(interval + interval/4) // past the loop's timer, jittered or not
	}
	rounds := func(what string, n int, until func() bool) {
		t.Helper()
		for i := 0; i < n && (until == nil || !until()); i++ {
			round(what)
			if b.State() == Unhealthy {
				t.Fatalf("%s: a backend that answers pings was judged unhealthy", what)
			}
		}
	}

	slow.Store(true)
	rounds("slow /readyz", 20, func() bool { return b.State() == Degraded })
	clk.await(t, "degraded by a slow /readyz", func() bool { return b.State() == Degraded })
	rounds("slow /readyz, degraded", 10, nil) // what was two quiet seconds
	if b.State() != Degraded {
		t.Fatalf("state %s after a slow /readyz, want degraded", b.State())
	}
	slow.Store(false)
	rounds("quick /readyz", 20, func() bool { return b.State() == Healthy })
	clk.await(t, "healthy again", func() bool { return b.State() == Healthy })

	// Frozen: the next round's ping (kept connection) gets no answer within half its timeout,
	// a fresh connection is tried then, and neither answers: unhealthy one and a half ping
	// timeouts after the round began, not two. The last quick round's /readyz probe is over
	// first, its verdict included (readyBusy is cleared after it): on a loaded machine its
	// goroutine could judge after the frozen round's pings, and its answer, which the backend
	// sent before the freeze, revived the backend.
	clk.await(t, "between rounds", func() bool {
		return clk.waiting(pingTO/2, pingTO, probeTO) && clk.pending(pingTO) == 0 && clk.pending(pingTO/2) == 0 &&
			!b.hc.readyBusy.Load()
	})
	fz.frozen.Store(true)
	start := clk.Now()
	clk.Step(interval + interval/4)
	clk.await(t, "the frozen round's ping", func() bool { return clk.pending(pingTO) == 1 && clk.pending(pingTO/2) == 1 })
	clk.Step(pingTO / 2)
	clk.await(t, "the fresh connection's ping", func() bool { return clk.pending(pingTO) == 2 })
	clk.Step(pingTO / 2) // the kept connection's ping times out; the fresh one's has half left
	clk.await(t, "the kept connection's ping given up", func() bool { return clk.pending(pingTO) == 1 })
	if s := b.State(); s == Unhealthy {
		t.Fatal("unhealthy after one ping timeout, while the fresh connection's ping had time left")
	}
	clk.Step(pingTO / 2)
	clk.await(t, "unhealthy when frozen", func() bool { return b.State() == Unhealthy })
	took := clk.Since(start)
	t.Logf("frozen backend found unhealthy after %v of the clock", took)
	if bound := interval + interval/4 + 3*pingTO/2; took > bound {
		t.Errorf("found after %v, want within an interval and one and a half ping timeouts: %v", took, bound)
	}
	clk.await(t, "the detection told (OnDetect, after the state)", func() bool { return detect.Load() != 0 })
	if d := time.Duration(detect.Load()); d > took {
		t.Errorf("detection told %v, more than the %v it took", d, took)
	}
	fz.frozen.Store(false)
	for i := 0; i < 40 && b.State() != Healthy; i++ {
		// Down, it is checked with backoff; the stuck pings of the freeze end at their timeouts.
		clk.await(t, "a check of the thawed backend", func() bool { return clk.waiting(pingTO/2, pingTO, probeTO) })
		clk.Step(interval / 2)
	}
	clk.await(t, "healthy after the thaw", func() bool { return b.State() == Healthy })
}

// a list sent at watchsan's high-water mark that a lagging backend answers
// with 504 is tried on another backend, and the lagging one is held back.
func TestTooLargeTriedElsewhere(t *testing.T) {
	behind := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, `{"kind":"Status","code":504,"message":"Too large resource version"}`, http.StatusGatewayTimeout)
	}))
	defer behind.Close()
	fresh := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "fresh") }))
	defer fresh.Close()
	p := newPool(t, PoolOptions{}, behind.URL, fresh.URL)
	a := attempter(p, AttempterOptions{Budget: 10 * time.Second}, &sleeps{})
	for i := 0; i < 4; i++ {
		req, _ := http.NewRequest("GET", "/api/v1/configmaps?resourceVersion=5&resourceVersionMatch=NotOlderThan", nil)
		resp, err := doPlan(t, a, req, Plan{RetryTooLarge: true})
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("got %v %v, want the fresh backend's answer", resp, err)
		}
		resp.Body.Close()
	}
	if !p.Backends()[0].Lagging() {
		t.Fatal("the backend that answered 504 is not held back")
	}
	// Without the guard's plan a 504 is an answer like any other.
	p2 := newPool(t, PoolOptions{}, behind.URL)
	req, _ := http.NewRequest("GET", "/api/v1/configmaps", nil)
	resp, err := do(t, attempter(p2, AttempterOptions{}, &sleeps{}), req)
	if err != nil || resp.StatusCode != 504 {
		t.Fatalf("got %v %v, want the 504", resp, err)
	}
	resp.Body.Close()
}
