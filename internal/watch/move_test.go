package watch

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/metrics"
	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/internal/upstream"
)

// when the pool moves a watch (here: its upstream is removed), the session
// resumes it on another upstream from its resume point, at once (a move is no failure: no
// backoff), and the client sees one unbroken stream; the break is counted per upstream.
func TestMovedWatchResumesElsewhereSeamlessly(t *testing.T) {
	first := &upstreamScript{}
	first.steps = []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
		send(w, obj("ADDED", "a", "10"))
		// The second event comes later: a move the moment the watch is open would resume it
		// from 10 (no loss, but not the seamless stream this test asks for).
		select {
		case <-time.After(200 * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		send(w, obj("MODIFIED", "a", "11"))
		<-r.Context().Done()
	}}
	second := &upstreamScript{}
	second.steps = []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
		send(w, obj("MODIFIED", "a", "12"))
		<-r.Context().Done()
	}}
	s1, s2 := httptest.NewServer(first), httptest.NewServer(second)
	defer s1.Close()
	defer s2.Close()
	u1, _ := url.Parse(s1.URL)
	u2, _ := url.Parse(s2.URL)
	log := zaptest.NewLogger(t)
	pool, err := upstream.NewPool([]*url.URL{u1}, upstream.PoolOptions{Logger: log, HealthInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	poolDone := make(chan struct{})
	go func() { pool.Run(ctx); close(poolDone) }()
	defer func() { cancel(); <-poolDone }()
	m := metrics.New(nil)
	var broke []string
	clk := newStepClock()
	h, err := New(Config{}, Deps{Attempts: upstream.NewAttempter(pool, upstream.AttempterOptions{Clock: clk}), Metrics: m,
		Memory: fix.NewDeleteMemory(0, 0, nil), Logger: log, Clock: clk,
		OnBreak: func(b *upstream.Backend, r ResumeReason) { broke = append(broke, b.String()+" "+r.String()) }})
	if err != nil {
		t.Fatal(err)
	}
	waitServed(t, h)
	srv := httptest.NewServer(h)
	defer srv.Close()
	f := &fixture{h: h, m: m, srv: srv}
	clk.stepWhen(t, func() bool { return f.passed("MODIFIED") == 2 }, 4*time.Second) // the client's deadline

	go func() {
		// The move waits for the two events to be decided (the resume point is 11 then), not for
		// a while: counted after fix.Stream.Decide, before the write.
		decided := func(typ string) float64 {
			return promtest.ToFloat64(m.WatchEvents.WithLabelValues("configmaps", typ, "passed"))
		}
		if !testutil.Until(10*time.Second, func() bool {
			return pool.Backends()[0].OpenWatches() == 1 && first.attempts() == 1 && decided("ADDED") == 1 && decided("MODIFIED") == 1
		}) {
			t.Error("the watch did not deliver its first two events on the first upstream within 10s")
			return
		}
		if _, _, err := pool.SetUpstreams([]*url.URL{u2}); err != nil {
			t.Error(err)
		}
	}()
	gs, err := f.watch(t, "resourceVersion=5&timeoutSeconds=3")
	expectStream(t, gs, err, "ADDED a 10, MODIFIED a 11, MODIFIED a 12")
	if q := second.query(0); q.Get("resourceVersion") != "11" {
		t.Fatalf("resumed on the second upstream from %q, want 11", q.Get("resourceVersion"))
	}
	if v := promtest.ToFloat64(m.Resumes.WithLabelValues("moved")); v != 1 {
		t.Fatalf("resumes{moved} = %v, want 1", v)
	}
	if len(broke) != 1 || broke[0] != s1.URL+" moved" {
		t.Fatalf("breaks told: %v, want one on the first upstream, moved", broke)
	}
}
