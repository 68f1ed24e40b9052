package watch

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/metrics"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/internal/upstream"
)

// A private watch without timeoutSeconds ends cleanly at a lifetime drawn in [max, 2*max), as
// the apiserver ends one: on a fake clock, its first attempt asks the upstream for that
// lifetime; a second before it, the watch is still resumed (a stall), not ended; at it, the
// stream ends without an ERROR event, counted max-lifetime (not client-deadline).
func TestPrivateWatchEndsAtMaxLifetime(t *testing.T) {
	const max = 10 * time.Minute
	up := &upstreamScript{}
	up.steps = []func(http.ResponseWriter, *http.Request){
		thenHang(up, obj("ADDED", "a", "10")), // silent after: the stall timeout resumes it
		thenHang(up),
	}
	clk := newStepClock()
	f := newFixtureClock(t, Config{MaxLifetime: max}, up, clk)
	drawn := make(chan time.Duration, 1)
	go func() {
		// Once its client has read the event, the watch has flushed it and waits for its
		// upstream: the step finds it silent. (It passes the event before writing it: a step
		// then finds it busy, and the watchdog looks again a stall timeout later, after the
		// lifetime.)
		if !testutil.Until(10*time.Second, func() bool { return f.seen.Load() == 1 }) {
			t.Error("the client did not read the first event within 10s")
			return
		}
		s, err := strconv.Atoi(up.query(0).Get("timeoutSeconds"))
		if err != nil {
			t.Errorf("the first attempt's timeoutSeconds %q: want the drawn lifetime", up.query(0).Get("timeoutSeconds"))
			return
		}
		lifetime := time.Duration(s) * time.Second
		drawn <- lifetime
		clk.Step(lifetime - 2*time.Second) // a stall on the way: the watch resumes
		if !testutil.Until(10*time.Second, func() bool { return up.attempts() == 2 }) {
			t.Error("the stalled watch was not resumed within 10s, a second before its lifetime")
			return
		}
		clk.Step(3 * time.Second)
	}()
	gs, err := f.watch(t, "resourceVersion=5")
	expectStream(t, gs, err, "ADDED a 10")
	lifetime := <-drawn
	if lifetime < max || lifetime > 2*max {
		t.Fatalf("the watch's lifetime %v (the upstream's timeoutSeconds): want within [%v, %v)", lifetime, max, 2*max)
	}
	if left := up.query(1).Get("timeoutSeconds"); left != "2" {
		t.Fatalf("the resume a second before the lifetime asked timeoutSeconds=%q, want the 2 s left", left)
	}
	if v := promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndMaxLifetime.String())); v != 1 {
		t.Fatalf("ends{max-lifetime} = %v, want 1", v)
	}
	if v := promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndDeadline.String())); v != 0 {
		t.Fatalf("ends{client-deadline} = %v, want 0: the deadline was watchsan's", v)
	}
}

// A client's own timeoutSeconds shorter than the lifetime is its own: it ends at it, counted
// client-deadline, and the upstream is asked for it.
func TestShortTimeoutSecondsIsTheClients(t *testing.T) {
	up := &upstreamScript{}
	up.steps = []func(http.ResponseWriter, *http.Request){thenHang(up, obj("ADDED", "a", "10"))}
	clk := newStepClock()
	f := newFixtureClock(t, Config{MaxLifetime: time.Minute}, up, clk)
	clk.stepWhen(t, func() bool { return f.passed("ADDED") == 1 }, 30*time.Second)
	gs, err := f.watch(t, "resourceVersion=5&timeoutSeconds=30")
	expectStream(t, gs, err, "ADDED a 10")
	if q := up.query(0).Get("timeoutSeconds"); q != "30" {
		t.Fatalf("first attempt's timeoutSeconds %q, want the client's 30", q)
	}
	if v := promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndDeadline.String())); v != 1 {
		t.Fatalf("ends{client-deadline} = %v, want 1", v)
	}
}

// A shared feed's subscriber without timeoutSeconds, detached (HTTP/1.1, its own connection)
// or on its handler, ends cleanly at a lifetime in [max, 2*max) (one rule for every client
// watch; a reviewed subscriber's review is trusted no longer): a second before max it still
// gets the feed's events; by 2*max its stream has ended, without an ERROR event, counted
// max-lifetime. So does one whose timeoutSeconds is longer than 2*max.
func TestSharedSubscriberEndsAtMaxLifetime(t *testing.T) {
	const max = 10 * time.Minute
	for _, attached := range []bool{false, true} {
		t.Run(map[bool]string{false: "detached", true: "attached"}[attached], func(t *testing.T) {
			clk := newStepClock()
			// No stall within the steps: a watchdog firing at the last one could log after
			// the test.
			cfg := Config{MaxLifetime: max, StallTimeout: 3 * max}
			x := newShareFixtureClock(t, cfg, clk)
			srv, m := x.srv.URL, x.m
			if attached {
				srv, m = attachedHandlerClock(t, x, cfg, clk)
			}
			from := x.write(t, "before", 1, 10)
			forever := watchAt(t, srv, "resourceVersion="+rv(from), nil, true)
			long := watchAt(t, srv, "resourceVersion="+rv(from)+"&timeoutSeconds=36000", nil, true)
			testutil.Eventually(t, 10*time.Second, "two subscribers", func() bool {
				return promtest.ToFloat64(m.SharedSubscribers) == 2
			})
			// An event through each first: a subscriber's writer runs once its deadline's
			// timer is set, so the steps below pass it.
			x.write(t, "cm", 1, 10)
			forever.waitFor(t, "the watch without timeoutSeconds", 1)
			long.waitFor(t, "the watch with a long timeoutSeconds", 1)
			clk.Step(max - time.Second)
			x.write(t, "late", 1, 10)
			forever.waitFor(t, "the watch without timeoutSeconds, a second before the max lifetime", 2)
			long.waitFor(t, "the watch with a long timeoutSeconds, a second before the max lifetime", 2)
			clk.Step(max + time.Second)
			for _, c := range []*client{forever, long} {
				select {
				case <-c.ended:
				case <-time.After(10 * time.Second):
					t.Fatal("a watch without timeoutSeconds, or a longer one, outlived 2x the max lifetime")
				}
				if got := c.events(); len(got) != 2 || got[0] != "ADDED cm-0 "+rv(from+1) || got[1] != "ADDED late-0 "+rv(from+2) {
					t.Fatalf("the client saw %v, want the two events and no ERROR", got)
				}
			}
			testutil.Eventually(t, 10*time.Second, "both ends counted max-lifetime", func() bool {
				return promtest.ToFloat64(m.StreamEnds.WithLabelValues(EndMaxLifetime.String())) == 2
			})
			if v := promtest.ToFloat64(m.StreamEnds.WithLabelValues(EndDeadline.String())); v != 0 {
				t.Fatalf("ends{client-deadline} = %v, want 0", v)
			}
		})
	}
}

// attachedHandlerClock is attachedHandler with cfg and the clock clk; it returns its URL and
// metrics.
func attachedHandlerClock(t *testing.T, x *shareFixture, cfg Config, clk *stepClock) (string, *metrics.Metrics) {
	t.Helper()
	done := make(chan struct{})
	m := metrics.New(nil)
	cfg.Share = true
	h, err := New(cfg, Deps{Attempts: x.attempts, Metrics: m, Memory: fix.NewDeleteMemory(0, 0, nil),
		Logger: zaptest.NewLogger(t), Done: done, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	waitServed(t, h)
	h.noDetach = true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, cred := reqinfo.Parse(r), upstream.Decide(r.Header, r.TLS, true, upstream.IdentityOff)
		h.Serve(w, r, &info, &cred, "")
	}))
	t.Cleanup(func() {
		close(done) // shutdown ends its feeds; none may log after the test
		testutil.Eventually(t, 10*time.Second, "the attached handler's feeds ended", func() bool {
			return promtest.ToFloat64(m.SharedFeeds) == 0 && promtest.ToFloat64(m.SharedSubscribers) == 0
		})
		srv.Close()
	})
	return srv.URL, m
}
