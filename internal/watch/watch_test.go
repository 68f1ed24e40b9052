package watch

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/metrics"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/internal/upstream"
)

// upstreamScript is a scripted apiserver: attempt i of the watch is served by steps[i] (the
// last one repeats). /readyz answers 500 while frozen is set.
type upstreamScript struct {
	mu       sync.Mutex
	queries  []url.Values
	auth     []string // each request's Authorization, as queries
	agents   []string // each request's User-Agent, as queries
	steps    []func(w http.ResponseWriter, r *http.Request)
	frozen   atomic.Bool
	canceled chan struct{}
}

func (u *upstreamScript) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/readyz" {
		if u.frozen.Load() {
			http.Error(w, "frozen", 500)
			return
		}
		io.WriteString(w, "ok")
		return
	}
	u.mu.Lock()
	i := len(u.queries)
	u.queries = append(u.queries, r.URL.Query())
	u.auth = append(u.auth, r.Header.Get("Authorization"))
	u.agents = append(u.agents, r.UserAgent())
	step := u.steps[min(i, len(u.steps)-1)]
	u.mu.Unlock()
	step(w, r)
}

func (u *upstreamScript) query(i int) url.Values {
	u.mu.Lock()
	defer u.mu.Unlock()
	if i >= len(u.queries) {
		return nil
	}
	return u.queries[i]
}

func (u *upstreamScript) agent(i int) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	if i >= len(u.agents) {
		return ""
	}
	return u.agents[i]
}

func (u *upstreamScript) attempts() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.queries)
}

func obj(typ, name, rv string) string {
	return fmt.Sprintf(`{"type":%q,"object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":%q,"namespace":"d","uid":"uid-%s","resourceVersion":%q}}}`+"\n", typ, name, name, rv)
}

// send writes events as a watch response and flushes; it returns after them.
func send(w http.ResponseWriter, events ...string) {
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
	}
	for _, e := range events {
		io.WriteString(w, e)
	}
	w.(http.Flusher).Flush()
}

func events(evs ...string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) { send(w, evs...) }
}

// thenHang keeps the response open until the client goes away.
func thenHang(u *upstreamScript, evs ...string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		send(w, evs...)
		<-r.Context().Done()
		if u.canceled != nil {
			close(u.canceled)
		}
	}
}

type fixture struct {
	h     *Handler
	m     *metrics.Metrics
	srv   *httptest.Server
	up    *upstreamScript
	done  chan struct{}
	upURL string
	seen  atomic.Int32 // events the client of watch read
}

func newFixture(t *testing.T, cfg Config, up *upstreamScript) *fixture {
	t.Helper()
	return newFixtureClock(t, cfg, up, nil)
}

// newFixtureClock is newFixture with clk as the watch's and its Attempter's clock (nil: the
// real one).
func newFixtureClock(t *testing.T, cfg Config, up *upstreamScript, clk *stepClock) *fixture {
	t.Helper()
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	u, _ := url.Parse(upSrv.URL)
	log := zaptest.NewLogger(t)
	pool, err := upstream.NewPool([]*url.URL{u}, upstream.PoolOptions{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{up: up, done: make(chan struct{}), upURL: upSrv.URL, m: metrics.New(nil)}
	deps := Deps{Metrics: f.m, Memory: fix.NewDeleteMemory(0, 0, nil), Done: f.done, Logger: log}
	var ao upstream.AttempterOptions
	if clk != nil {
		ao.Clock, deps.Clock = clk, clk
		t.Cleanup(func() {
			if !testutil.Until(10*time.Second, func() bool { return clk.running.Load() == 0 }) {
				t.Error("the fake clock's callbacks did not return within 10s")
			}
		})
	}
	deps.Attempts = upstream.NewAttempter(pool, ao)
	f.h, err = New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	waitServed(t, f.h)
	f.srv = httptest.NewServer(f.h)
	t.Cleanup(f.srv.Close)
	return f
}

// stepClock is a fake clock that records the duration of every timer made on it (NewTimer:
// the Attempter's waits; the watchdog and deadlines use AfterFunc).
type stepClock struct {
	*clocktesting.FakeClock
	mu    sync.Mutex
	made  []time.Duration
	newed chan time.Duration
	// afters are the durations of the AfterFunc timers made (the watchdogs, the deadlines).
	afters []time.Duration
	// running counts the AfterFunc callbacks that fired and have not returned: a test waits
	// for them before it ends (newFixtureClock), as one step may fire a watch's deadline and
	// its watchdog at once, and the watchdog may log after the watch ended.
	running atomic.Int32
}

func newStepClock() *stepClock {
	return &stepClock{FakeClock: clocktesting.NewFakeClock(time.Now()), newed: make(chan time.Duration, 100)}
}

func (c *stepClock) NewTimer(d time.Duration) clock.Timer {
	t := c.FakeClock.NewTimer(d) // registered before it is told: a Step after it fires it
	c.mu.Lock()
	c.made = append(c.made, d)
	c.mu.Unlock()
	c.newed <- d
	return t
}

// AfterFunc runs f on a goroutine of its own when d has passed, as time.AfterFunc does; the
// FakeClock's own runs it inside Step, holding the clock's lock (a callback that reads the
// clock or resets its timer, as the watchdog's does, would deadlock), and cannot fire a timer
// reset after it fired (its channel is full).
func (c *stepClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	c.mu.Lock()
	c.afters = append(c.afters, d)
	c.mu.Unlock()
	a := &afterTimer{c: c, f: f}
	a.t = c.FakeClock.AfterFunc(d, a.fire)
	return a
}

type afterTimer struct {
	c  *stepClock
	f  func()
	mu sync.Mutex
	t  clock.Timer
}

func (a *afterTimer) fire() {
	a.c.running.Add(1)
	go func() {
		defer a.c.running.Add(-1)
		a.f()
	}()
}
func (a *afterTimer) C() <-chan time.Time { return nil }

func (a *afterTimer) Stop() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.t.Stop()
}

func (a *afterTimer) Reset(d time.Duration) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	active := a.t.Stop()
	a.t = a.c.FakeClock.AfterFunc(d, a.fire)
	return active
}

// afterFuncs counts the AfterFunc timers made with d (Reset makes none): one per attempt's
// watchdog for the stall timeout.
func (c *stepClock) afterFuncs(d time.Duration) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, a := range c.afters {
		if a == d {
			n++
		}
	}
	return n
}

func (c *stepClock) timers() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.made...)
}

// stepTimers passes each timer's duration as soon as the timer is made, until the test ends;
// it returns the durations passed so far.
func (c *stepClock) stepTimers(t *testing.T) func() []time.Duration {
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() { close(stop); <-done })
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case d := <-c.newed:
				c.Step(d)
			}
		}
	}()
	return c.timers
}

// stepWhen passes d on c once cond holds (it fails the test if cond does not within 10 s).
func (c *stepClock) stepWhen(t *testing.T, cond func() bool, d time.Duration) {
	go func() {
		if !testutil.Until(10*time.Second, cond) {
			t.Error("the condition to pass the fake clock did not hold within 10s")
			return
		}
		c.Step(d)
	}()
}

// stepToStall passes the stall timeout on c, once the client has read its first events
// (then the watch has flushed them and waits for its upstream), until the watchdog has found
// n stalls. A step that comes while the watch is still busy with what it read finds no
// silence and is taken again (at most 3 times).
func (f *fixture) stepToStall(t *testing.T, c *stepClock, decided func() bool, stall time.Duration, n float64) {
	go func() {
		if !testutil.Until(10*time.Second, decided) {
			t.Error("the watch did not deliver its first events within 10s")
			return
		}
		stalls := func() bool { return promtest.ToFloat64(f.m.Stalls) >= n }
		for i := 0; i < 3 && !stalls(); i++ {
			c.Step(stall)
			testutil.Until(time.Second, stalls)
		}
	}()
}

// passed counts the events of type typ the watch let through.
func (f *fixture) passed(typ string) float64 {
	return promtest.ToFloat64(f.m.WatchEvents.WithLabelValues("configmaps", typ, "passed"))
}

type got struct {
	Type, Name, RV string
	Code           int32
}

// watch runs a client watch to its end and returns what it saw and how it ended.
func (f *fixture) watch(t *testing.T, query string) ([]got, error) {
	t.Helper()
	return f.watchWith(t, query, nil)
}

// openWatch opens a watch of the fixture's configmaps with query and the Accept header accept,
// for 20 s at most (the deadline is canceled when the test ends); the caller closes the body.
func (f *fixture) openWatch(t *testing.T, query, accept string) *http.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/api/v1/namespaces/d/configmaps?watch=true&"+query, nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// watchWith is watch with the request headers h.
func (f *fixture) watchWith(t *testing.T, query string, h http.Header) ([]got, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/api/v1/namespaces/d/configmaps?watch=true&"+query, nil)
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var out []got
	dec := json.NewDecoder(resp.Body)
	for {
		var ev struct {
			Type   string
			Object struct {
				Code     int32
				Metadata struct{ Name, ResourceVersion string }
			}
		}
		if err := dec.Decode(&ev); err != nil {
			if err == io.EOF {
				return out, nil
			}
			return out, err
		}
		out = append(out, got{ev.Type, ev.Object.Metadata.Name, ev.Object.Metadata.ResourceVersion, ev.Object.Code})
		f.seen.Add(1)
	}
}

func gotString(gs []got) string {
	var b []string
	for _, g := range gs {
		s := g.Type + " " + g.Name + " " + g.RV
		if g.Code != 0 {
			s = fmt.Sprintf("%s %d", g.Type, g.Code)
		}
		b = append(b, s)
	}
	return strings.Join(b, ", ")
}

func expectStream(t *testing.T, gs []got, err error, want string) {
	t.Helper()
	if err != nil {
		t.Fatalf("stream ended with %v after [%s], want a clean end", err, gotString(gs))
	}
	if s := gotString(gs); s != want {
		t.Fatalf("client saw [%s]\nwant       [%s]", s, want)
	}
}

func TestRegressingDeleteRewrittenReplayDropped(t *testing.T) {
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){events(
		obj("ADDED", "a", "10"), obj("ADDED", "b", "11"),
		obj("DELETED", "a", "10"), // the 1.7 bug: the delete (really at 12) carries a's old RV
		obj("MODIFIED", "b", "11"), obj("ADDED", "c", "13"),
	)}}
	f := newFixture(t, Config{DisableResume: true}, up)
	gs, err := f.watch(t, "resourceVersion=5")
	expectStream(t, gs, err, "ADDED a 10, ADDED b 11, DELETED a 12, ADDED c 13")
	if v := promtest.ToFloat64(f.m.WatchEvents.WithLabelValues("configmaps", "DELETED", "rewritten")); v != 1 {
		t.Fatalf("rewritten deletes counted %v", v)
	}
	if v := promtest.ToFloat64(f.m.WatchEvents.WithLabelValues("configmaps", "MODIFIED", "dropped")); v != 1 {
		t.Fatalf("dropped replays counted %v", v)
	}
}

func TestObserveModeChangesNothing(t *testing.T) {
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){events(
		obj("ADDED", "a", "10"), obj("DELETED", "a", "10"), obj("MODIFIED", "a", "10"))}}
	f := newFixture(t, Config{DisableResume: true, Mode: fix.Observe}, up)
	gs, err := f.watch(t, "resourceVersion=5")
	expectStream(t, gs, err, "ADDED a 10, DELETED a 10, MODIFIED a 10")
	if v := promtest.ToFloat64(f.m.WatchEvents.WithLabelValues("configmaps", "DELETED", "rewritten")); v != 1 {
		t.Fatalf("observe mode must count what repair would do; rewritten = %v", v)
	}
}

func TestExemptResourcePassesUnsanitized(t *testing.T) {
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){events(
		obj("ADDED", "a", "10"), obj("DELETED", "a", "10"))}}
	f := newFixture(t, Config{DisableResume: true, Exempt: []string{"configmaps"}}, up)
	gs, err := f.watch(t, "resourceVersion=5")
	expectStream(t, gs, err, "ADDED a 10, DELETED a 10")
}

func TestResumeAfterEOFIsSeamless(t *testing.T) {
	up := &upstreamScript{}
	up.steps = []func(http.ResponseWriter, *http.Request){
		events(obj("ADDED", "a", "10"), obj("ADDED", "b", "11")),                                   // then EOF
		thenHang(up, obj("ADDED", "b", "11"), obj("ADDED", "c", "12"), obj("MODIFIED", "a", "13")), // b replayed
	}
	clk := newStepClock()
	f := newFixtureClock(t, Config{}, up, clk)
	clk.stepWhen(t, func() bool { return f.passed("ADDED") == 3 && f.passed("MODIFIED") == 1 }, 3*time.Second) // the client's deadline
	gs, err := f.watch(t, "resourceVersion=5&timeoutSeconds=2")
	expectStream(t, gs, err, "ADDED a 10, ADDED b 11, ADDED c 12, MODIFIED a 13")
	q := up.query(1)
	if q.Get("resourceVersion") != "11" || q.Get("allowWatchBookmarks") != "true" || q.Get("watch") != "true" {
		t.Fatalf("resume query %v: want a watch from 11 with bookmarks", q)
	}
	if v := promtest.ToFloat64(f.m.Resumes.WithLabelValues("eof")); v != 1 {
		t.Fatalf("resumes{eof} = %v", v)
	}
	if v := promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndDeadline.String())); v != 1 {
		t.Fatalf("the client's timeoutSeconds must end the stream; ends{deadline} = %v", v)
	}
}

func TestResumeDisabledEndsStream(t *testing.T) {
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){events(obj("ADDED", "a", "10"))}}
	f := newFixture(t, Config{DisableResume: true}, up)
	gs, err := f.watch(t, "resourceVersion=5&timeoutSeconds=30")
	expectStream(t, gs, err, "ADDED a 10")
	if up.attempts() != 1 {
		t.Fatalf("%d attempts with resume disabled", up.attempts())
	}
}

func TestGoneOnResumeForcesRelist(t *testing.T) {
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){
		events(obj("ADDED", "a", "10")),
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(410)
			io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old resource version: 10 (20)","reason":"Expired","code":410}`)
		},
	}}
	f := newFixture(t, Config{}, up)
	gs, err := f.watch(t, "resourceVersion=5")
	expectStream(t, gs, err, "ADDED a 10, ERROR 410")
	if v := promtest.ToFloat64(f.m.RelistsForced); v != 1 {
		t.Fatalf("relists forced = %v", v)
	}
}

func TestStalledUpstreamIsResumed(t *testing.T) {
	t.Run("stall timeout below the resume timeout", func(t *testing.T) { testStallResumed(t, 300*time.Millisecond, 0) })
	// The defaults are so (90s > 60s): the resume deadline runs from the stall's discovery, not
	// from the last event, or a stall would always end the client's stream.
	t.Run("stall timeout above the resume timeout", func(t *testing.T) { testStallResumed(t, 1200*time.Millisecond, time.Second) })
}

func testStallResumed(t *testing.T, stall, resume time.Duration) {
	up := &upstreamScript{}
	up.steps = []func(http.ResponseWriter, *http.Request){
		func(w http.ResponseWriter, r *http.Request) {
			send(w, obj("ADDED", "a", "10"))
			up.frozen.Store(true) // the apiserver hangs: the stream goes silent, probes fail
			<-r.Context().Done()
		},
		func(w http.ResponseWriter, r *http.Request) { // the first resume meets a 503: retried
			http.Error(w, "starting", http.StatusServiceUnavailable)
		},
		func(w http.ResponseWriter, r *http.Request) {
			send(w, obj("ADDED", "b", "11"))
		},
	}
	clk := newStepClock()
	f := newFixtureClock(t, Config{StallTimeout: stall, ResumeTimeout: resume}, up, clk)
	clk.stepTimers(t) // the retry's and resumes' waits
	f.stepToStall(t, clk, func() bool { return f.seen.Load() == 1 }, stall, 1)
	go func() { // the apiserver comes back after the stall was noticed
		testutil.Until(10*time.Second, func() bool { return promtest.ToFloat64(f.m.Stalls) > 0 })
		up.frozen.Store(false)
	}()
	gs, err := f.watch(t, "resourceVersion=5&timeoutSeconds=3")
	expectStream(t, gs, err, "ADDED a 10, ADDED b 11")
	if v := promtest.ToFloat64(f.m.Resumes.WithLabelValues("stall")); v != 1 {
		t.Fatalf("resumes{stall} = %v", v)
	}
	if q := up.query(2); q.Get("resourceVersion") != "10" {
		t.Fatalf("resume from %q, want 10", q.Get("resourceVersion"))
	}
}

func bookmark(rv string) string {
	return fmt.Sprintf(`{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":%q}}}`+"\n", rv)
}

// A quiet watch that hears a bookmark within the stall timeout (an apiserver sends one about
// every minute while the watch's resource changes anywhere in the cluster) is never taken for
// stalled. On the step clock: a bookmark every two thirds of the stall timeout, for ten of
// them, to the client's deadline.
func TestQuietUpstreamWithBookmarksIsNotResumed(t *testing.T) {
	const stall, every, n = 300 * time.Millisecond, 200 * time.Millisecond, 10
	tick := make(chan struct{}, n) // a bookmark to send, each
	up := &upstreamScript{}
	up.steps = []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
		send(w, obj("ADDED", "a", "10"))
		for {
			select {
			case <-r.Context().Done():
				return
			case <-tick:
				send(w, bookmark("10"))
			}
		}
	}}
	clk := newStepClock()
	f := newFixtureClock(t, Config{StallTimeout: stall}, up, clk)
	stalled := func() bool { return promtest.ToFloat64(f.m.Stalls) != 0 }
	drove := make(chan struct{})
	go func() {
		defer close(drove)
		steps := 0
		defer func() { clk.Step(time.Duration(n-steps) * every) }() // to the client's deadline, however the steps went
		if !testutil.Until(10*time.Second, func() bool { return f.seen.Load() == 1 }) {
			t.Error("the watch did not deliver its first event within 10s")
			return
		}
		for i := 1; i <= n; i++ {
			tick <- struct{}{}
			// Read, then the time passes: every silence is at most every, below stall.
			if !testutil.Until(10*time.Second, func() bool { return f.passed(stream.Bookmark) == float64(i) || stalled() }) || stalled() {
				t.Errorf("bookmark %d: not read within 10s, or the watch was taken for stalled (%v stalls)", i, promtest.ToFloat64(f.m.Stalls))
				return
			}
			clk.Step(every) // the last one reaches the client's deadline: n*every
			steps++
		}
	}()
	gs, err := f.watch(t, fmt.Sprintf("resourceVersion=5&timeoutSeconds=%d", int((n*every).Seconds())))
	<-drove
	expectStream(t, gs, err, "ADDED a 10")
	if up.attempts() != 1 || promtest.ToFloat64(f.m.Stalls) != 0 {
		t.Fatalf("a quiet watch that gets bookmarks was treated as stalled: %d attempts, %v stalls", up.attempts(), promtest.ToFloat64(f.m.Stalls))
	}
	if v := promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndDeadline.String())); v != 1 {
		t.Fatalf("ends{client-deadline} = %v, want 1", v)
	}
}

// A caught-up watch of a resource nothing changes hears nothing, not even a bookmark
// (docs/design.md section 2): every stall resumes it, and it stays open until the client's own
// deadline. A stall is no failure: counted as one, it ended such a watch at its second stall,
// once --watch-resume-timeout had passed since the first. On the step clock: stalls stalls,
// each resumed by one request, then the client's deadline.
func TestQuietWatchOutlivesTheResumeTimeout(t *testing.T) {
	up := &upstreamScript{}
	up.steps = []func(http.ResponseWriter, *http.Request){
		thenHang(up, obj("ADDED", "a", "10")),
		thenHang(up), // every resume: accepted, then silent
	}
	const stall, resume, stalls = time.Second, 500 * time.Millisecond, 4
	const deadline = 60 * time.Second // far beyond the stalls' steps
	clk := newStepClock()
	f := newFixtureClock(t, Config{StallTimeout: stall, ResumeTimeout: resume}, up, clk)
	clk.stepTimers(t) // the Attempter's and the brake's waits, if any
	drove := make(chan struct{})
	go func() {
		defer close(drove)
		defer clk.Step(deadline) // the client's deadline, however the stalls went
		if !testutil.Until(10*time.Second, func() bool { return f.seen.Load() == 1 }) {
			t.Error("the watch did not deliver its first event within 10s")
			return
		}
		for k := 1; k <= stalls; k++ {
			// Attempt k waits for its upstream: its watchdog is armed (a timer of the stall
			// timeout's each attempt), then the stall timeout passes; a step that comes while
			// the watch is still busy with the attempt's start finds no silence and is taken
			// again.
			if !testutil.Until(10*time.Second, func() bool { return clk.afterFuncs(stall) >= k }) {
				t.Errorf("attempt %d's watchdog was not armed within 10s", k)
				return
			}
			found := func() bool { return promtest.ToFloat64(f.m.Stalls) >= float64(k) }
			for i := 0; i < 3 && !found(); i++ {
				clk.Step(stall)
				testutil.Until(time.Second, found)
			}
			if !found() {
				t.Errorf("stall %d was not found", k)
				return
			}
			// Resumed at once, by one request: no failure's backoff, no resume timeout.
			if !testutil.Until(10*time.Second, func() bool { return up.attempts() == k+1 }) {
				t.Errorf("stall %d: %d upstream attempts, want %d", k, up.attempts(), k+1)
				return
			}
		}
	}()
	gs, err := f.watch(t, fmt.Sprintf("resourceVersion=5&timeoutSeconds=%d", int(deadline.Seconds())))
	<-drove
	expectStream(t, gs, err, "ADDED a 10")
	if v := promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndDeadline.String())); v != 1 {
		t.Fatalf("ends{client-deadline} = %v, want 1 (ends{resume-timeout} = %v)", v,
			promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndResumeTimeout.String())))
	}
	// Resumed at each stall, and no faster: one upstream request per stall (the deadline's
	// step may find one more stall, which the deadline ends without a request).
	s := promtest.ToFloat64(f.m.Stalls)
	if n := up.attempts(); n != stalls+1 || s < stalls || s > stalls+1 {
		t.Fatalf("%d upstream attempts and %v stalls, want %d attempts for %d stalls (or one more stall at the deadline)", n, s, stalls+1, stalls)
	}
	// Stalls, but none of them a hang: no resume delivered anything held back.
	if h := promtest.ToFloat64(f.m.StallsHung); h != 0 {
		t.Fatalf("hung stalls %v, want 0", h)
	}
}

// a watch on which bookmarks were asked for and nothing arrived for the stall timeout
// is stalled even though its upstream answers probes (the hop between may be what hangs); it
// is resumed, losslessly.
func TestSilentUpstreamIsResumedThoughItAnswersProbes(t *testing.T) {
	up := &upstreamScript{}
	up.steps = []func(http.ResponseWriter, *http.Request){thenHang(up, obj("ADDED", "a", "10")), events(obj("ADDED", "b", "11"))}
	clk := newStepClock()
	f := newFixtureClock(t, Config{StallTimeout: 300 * time.Millisecond}, up, clk)
	clk.stepTimers(t) // the waits of the resumes after b, which the deadline ends
	f.stepToStall(t, clk, func() bool { return f.seen.Load() == 1 }, 300*time.Millisecond, 1)
	gs, err := f.watch(t, "resourceVersion=5&timeoutSeconds=2")
	expectStream(t, gs, err, "ADDED a 10, ADDED b 11")
	if q := up.query(0); q.Get("allowWatchBookmarks") != "true" {
		t.Fatalf("the upstream watch did not ask for bookmarks: %v", q)
	}
	if v := promtest.ToFloat64(f.m.Resumes.WithLabelValues("stall")); v < 1 {
		t.Fatalf("resumes{stall} = %v, want at least 1", v)
	}
	if q := up.query(1); q.Get("resourceVersion") != "10" {
		t.Fatalf("resume from %q, want 10", q.Get("resourceVersion"))
	}
	// The resume delivered at once what the silent stream had held back: a hang, not a quiet
	// watch.
	if v := promtest.ToFloat64(f.m.StallsHung); v != 1 {
		t.Fatalf("stalls hung = %v, want 1", v)
	}
}

func TestGarbageEndsCleanlyWithNothingPartial(t *testing.T) {
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){events(
		obj("ADDED", "a", "10"), `{"type":"ADDED","object":{"metadata":{"name":"b","resourceVersion":"11"}}`+"]]]garbage")}}
	f := newFixture(t, Config{}, up)
	gs, err := f.watch(t, "resourceVersion=5")
	expectStream(t, gs, err, "ADDED a 10")
	if v := promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndMalformed.String())); v != 1 {
		t.Fatalf("ends{malformed} = %v", v)
	}
}

func TestInitialPhaseBreakEndsStream(t *testing.T) {
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){events(obj("ADDED", "a", "10"))}}
	f := newFixture(t, Config{}, up)
	gs, err := f.watch(t, "resourceVersion=0")
	expectStream(t, gs, err, "ADDED a 10")
	if up.attempts() != 1 {
		t.Fatalf("a break in the initial phase was resumed (%d attempts); the synthetic ADDEDs cannot be resumed", up.attempts())
	}
}

func TestHiddenBookmarkAdvancesResumePoint(t *testing.T) {
	up := &upstreamScript{}
	up.steps = []func(http.ResponseWriter, *http.Request){
		events(obj("ADDED", "a", "10"), `{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"15"}}}`+"\n"),
		thenHang(up, obj("ADDED", "b", "16")),
	}
	clk := newStepClock()
	f := newFixtureClock(t, Config{}, up, clk)
	clk.stepWhen(t, func() bool { return f.passed("ADDED") == 2 }, 3*time.Second) // the client's deadline
	gs, err := f.watch(t, "resourceVersion=5&timeoutSeconds=2")
	expectStream(t, gs, err, "ADDED a 10, ADDED b 16")
	if q := up.query(0); q.Get("allowWatchBookmarks") != "true" {
		t.Fatal("watchsan must ask upstream for bookmarks")
	}
	if q := up.query(1); q.Get("resourceVersion") != "15" {
		t.Fatalf("resumed from %q, want the bookmark's 15", q.Get("resourceVersion"))
	}
}

func TestShutdownEndsCleanly(t *testing.T) {
	up := &upstreamScript{}
	up.steps = []func(http.ResponseWriter, *http.Request){thenHang(up, obj("ADDED", "a", "10"))}
	f := newFixture(t, Config{}, up)
	go func() { // shut down once the watch is open (or after the deadline: the test then fails)
		testutil.Until(10*time.Second, func() bool { return promtest.ToFloat64(f.m.OpenWatches.WithLabelValues("configmaps")) > 0 })
		close(f.done)
	}()
	gs, err := f.watch(t, "resourceVersion=5")
	expectStream(t, gs, err, "ADDED a 10")
	if v := promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndShutdown.String())); v != 1 {
		t.Fatalf("ends{shutdown} = %v", v)
	}
}

// TestShutdownRefusesRetriably: a watch that reaches watchsan after its watches were ended (a
// client re-watching at once on the same connection) is answered as the apiserver answers after
// its shutdown delay, so that client-go repeats it elsewhere instead of relisting: 429 with
// Retry-After and the connection closed, and the upstream is not asked.
func TestShutdownRefusesRetriably(t *testing.T) {
	up := &upstreamScript{}
	up.steps = []func(http.ResponseWriter, *http.Request){events(obj("ADDED", "a", "10"))}
	f := newFixture(t, Config{}, up)
	close(f.done)
	resp, err := http.Get(f.srv.URL + "/api/v1/namespaces/d/configmaps?watch=1&resourceVersion=5")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st metav1.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" || !resp.Close {
		t.Fatalf("answered %d, Retry-After %q, connection closed %v; want 429, 1, true", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Close)
	}
	// What client-go makes of it: a 429 (the Reflector backs off and watches again from its
	// resourceVersion, isWatchErrorRetriable) with a delay (its REST client repeats it first).
	err = apierrors.FromObject(&st)
	if secs, ok := apierrors.SuggestsClientDelay(err); !apierrors.IsTooManyRequests(err) || !ok || secs != 1 {
		t.Fatalf("client-go reads %v: 429 %v, delay %d %v", err, apierrors.IsTooManyRequests(err), secs, ok)
	}
	if n := up.attempts(); n != 0 {
		t.Fatalf("the upstream was asked %d times after shutdown", n)
	}
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	up := &upstreamScript{canceled: make(chan struct{})}
	up.steps = []func(http.ResponseWriter, *http.Request){thenHang(up, obj("ADDED", "a", "10"))}
	f := newFixture(t, Config{}, up)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/api/v1/namespaces/d/configmaps?watch=1&resourceVersion=5", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var ev map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&ev); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-up.canceled:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream watch outlived the client by 5s")
	}
}

func TestUpstreamErrorStatusRelayed(t *testing.T) {
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(403)
		io.WriteString(w, `{"kind":"Status","code":403}`)
	}}}
	f := newFixture(t, Config{}, up)
	resp, err := http.Get(f.srv.URL + "/api/v1/namespaces/d/configmaps?watch=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || string(body) != `{"kind":"Status","code":403}` {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
}

// A real apiserver answers a resume from an expired RV with HTTP 200 and an ERROR 410 event;
// the client's stream must end after it (the client relists), not resume into the same ERROR.
func TestErrorEventOnResumeEndsStream(t *testing.T) {
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){
		events(obj("ADDED", "a", "10")),
		events(`{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old resource version: 10 (20)","reason":"Expired","code":410}}` + "\n"),
	}}
	f := newFixture(t, Config{}, up)
	gs, err := f.watch(t, "resourceVersion=5")
	expectStream(t, gs, err, "ADDED a 10, ERROR 410")
	if up.attempts() != 2 {
		t.Fatalf("%d upstream attempts, want 2 (the first, one resume)", up.attempts())
	}
	if v := promtest.ToFloat64(f.m.RelistsForced); v != 1 {
		t.Fatalf("relists forced = %v", v)
	}
}

// An upstream that ends every watch at once (a resume storm once measured: 15,209 requests in 10 s)
// gets resumes paced by the reflector-like backoff, and the client's stream ends cleanly once
// the resume timeout passes without progress. On a fake clock: every wait is the Attempter's
// (the one place the backoff is stepped), and passes when the test steps it.
func TestResumeWithoutProgressBacksOffAndGivesUp(t *testing.T) {
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){
		events(obj("ADDED", "a", "10")), // progress, then EOF
		events(),                        // every resume: 200, no event, EOF
	}}
	clk := newStepClock()
	f := newFixtureClock(t, Config{ResumeTimeout: 3 * time.Second}, up, clk)
	waits := clk.stepTimers(t)
	gs, err := f.watch(t, "resourceVersion=5")
	expectStream(t, gs, err, "ADDED a 10")
	if v := promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndResumeTimeout.String())); v != 1 {
		t.Fatalf("ends{resume-timeout} = %v", v)
	}
	// The first attempt; at once a resume after progress; then waits of 0.8 s and 1.6 s (+-25%,
	// together at most 3 s) before the next two; the next, 3.2 s (+-25%), would pass the 3 s
	// resume timeout: no attempt, the stream ends.
	w := waits()
	if n := up.attempts(); n != 4 || len(w) != 2 {
		t.Fatalf("%d upstream attempts, waits %v: want 4 attempts and 2 waits", n, w)
	}
	if w[0] < 600*time.Millisecond || w[0] > time.Second || w[1] < 1200*time.Millisecond || w[1] > 2*time.Second {
		t.Fatalf("waits %v, want ~800ms then ~1.6s", w)
	}
}

// Progress resets the backoff: a watch whose upstream ends after an event, each carrying a
// new RV, is resumed at once, without waits (the first brakeFree times; after that the brake
// paces it, TestBrakeBoundsResumesThatDeliver).
func TestResumeAfterProgressIsImmediate(t *testing.T) {
	var n atomic.Int32
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		if i > brakeFree {
			<-r.Context().Done()
			return
		}
		send(w, obj("ADDED", fmt.Sprint("o", i), fmt.Sprint(10+i)))
	}}}
	clk := newStepClock()
	f := newFixtureClock(t, Config{}, up, clk)
	go func() { // the client's deadline passes once the last attempt is open
		if testutil.Until(10*time.Second, func() bool { return up.attempts() == brakeFree+1 }) {
			clk.Step(3 * time.Second)
		}
	}()
	gs, err := f.watch(t, "resourceVersion=5&timeoutSeconds=2")
	expectStream(t, gs, err, "ADDED o1 11, ADDED o2 12")
	if w := clk.timers(); len(w) != 0 {
		t.Fatalf("waited %v between resumes that made progress", w)
	}
}

// A negative timeoutSeconds is over before it starts: the apiserver ends such a watch at once,
// and so does watchsan, without a resume.
func TestNegativeTimeoutSecondsIsNotResumed(t *testing.T) {
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){events()}}
	f := newFixture(t, Config{}, up)
	gs, err := f.watch(t, "resourceVersion=5&timeoutSeconds=-1")
	expectStream(t, gs, err, "")
	if up.attempts() != 1 || up.query(0).Get("timeoutSeconds") != "-1" {
		t.Fatalf("%d attempts, first with timeoutSeconds=%q: want one, as the client sent it", up.attempts(), up.query(0).Get("timeoutSeconds"))
	}
	if v := promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndDeadline.String())); v != 1 {
		t.Fatalf("ends{client-deadline} = %v", v)
	}
}

// A throttled upstream (429 with Retry-After) and a client that leaves during the wait: the
// handler returns quietly (this panicked in net/http).
func TestClientLeavesDuringRetryAfterWait(t *testing.T) {
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "5")
		http.Error(w, "throttled", http.StatusTooManyRequests)
	}}}
	f := newFixture(t, Config{}, up)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, "GET", "/api/v1/namespaces/d/configmaps?watch=1&resourceVersion=5", nil)
	rec := httptest.NewRecorder()
	start := time.Now()
	f.h.ServeHTTP(rec, req) // a panic here fails the test
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the handler returned %v after its client left, want at once", took)
	}
	if up.attempts() != 1 {
		t.Fatalf("%d attempts: Retry-After 5 must hold the retry", up.attempts())
	}
}

// TestEventsFlushedWhileUpstreamWaits: events are batched, but never held while the pump
// waits for the upstream: a burst followed by silence reaches the client at once.
func TestEventsFlushedWhileUpstreamWaits(t *testing.T) {
	up := &upstreamScript{}
	up.steps = []func(http.ResponseWriter, *http.Request){thenHang(up, obj("ADDED", "a", "10"), obj("ADDED", "b", "11"))}
	f := newFixture(t, Config{}, up)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/api/v1/namespaces/d/configmaps?watch=true&resourceVersion=5", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got := make(chan string, 2)
	go func() { // ends when the response body is closed
		dec := json.NewDecoder(resp.Body)
		for {
			var ev struct {
				Object struct{ Metadata struct{ Name string } }
			}
			if dec.Decode(&ev) != nil {
				return
			}
			got <- ev.Object.Metadata.Name
		}
	}()
	for _, want := range []string{"a", "b"} {
		select {
		case name := <-got:
			if name != want {
				t.Fatalf("got %q, want %q", name, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("event %q not delivered while the upstream is silent", want)
		}
	}
}

// waitServed makes the test's end wait for h's watches that own their connection or detached
// from their handler: httptest.Server.Close does not wait for hijacked connections, and such a
// watch logs to the test as it ends (its client closed the connection at the test's cleanup).
// Registered right after New, it runs after the cleanups of the servers and clients made
// later. A watch still open 10 seconds on is an error: its client is gone, or the test never
// let it end.
func waitServed(t *testing.T, h *Handler) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := h.WaitDetached(ctx); err != nil {
			t.Errorf("watches were still open on their own connections 10s after the test: %v", err)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = h.WaitDetached(ctx) // closed by the first: they end now
		}
	})
}
