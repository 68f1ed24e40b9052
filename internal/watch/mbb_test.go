package watch

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/metrics"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/internal/upstream"
)

// mbb is two scripted apiservers behind one Handler: the watch starts on a (b is degraded
// then, so a is preferred), and removing a from the pool asks the watch to move to b.
type mbb struct {
	a, b     *upstreamScript
	pool     *upstream.Pool
	ua, ub   *url.URL
	m        *metrics.Metrics
	srv      *httptest.Server
	backendB *upstream.Backend
	clk      *clocktesting.FakeClock
}

func newMBB(t *testing.T, cfg Config, a, b *upstreamScript) *mbb {
	t.Helper()
	sa, sb := httptest.NewServer(a), httptest.NewServer(b)
	t.Cleanup(sa.Close)
	t.Cleanup(sb.Close)
	x := &mbb{a: a, b: b, m: metrics.New(nil), clk: clocktesting.NewFakeClock(time.Now())}
	x.ua, _ = url.Parse(sa.URL)
	x.ub, _ = url.Parse(sb.URL)
	log := zaptest.NewLogger(t)
	b.frozen.Store(true)
	var err error
	// Its clients are lent watchsan's identity (the sidecar's default), so every request a
	// watch makes, its moves' and fresh points' too, must carry it (Plan.Credentials).
	x.pool, err = upstream.NewPool([]*url.URL{x.ua, x.ub}, upstream.PoolOptions{Logger: log, HealthInterval: 20 * time.Millisecond, ProbeInterval: 20 * time.Millisecond, RebalanceRate: -1,
		Transport: upstream.TransportOptions{Credentials: &rest.Config{BearerToken: "lent"}, Lend: true}})
	if err != nil {
		t.Fatal(err)
	}
	x.backendB = x.pool.Backends()[1]
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { x.pool.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	if !testutil.Until(10*time.Second, func() bool {
		return x.pool.Backends()[0].State() == upstream.Healthy && x.backendB.State() == upstream.Degraded
	}) {
		t.Fatal("a not healthy and b not degraded")
	}
	h, err := New(cfg, Deps{Attempts: upstream.NewAttempter(x.pool, upstream.AttempterOptions{}), Metrics: x.m,
		Memory: fix.NewDeleteMemory(0, 0, nil), Logger: log, Clock: x.clk})
	if err != nil {
		t.Fatal(err)
	}
	waitServed(t, h)
	x.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, cred := reqinfo.Parse(r), upstream.Decide(r.Header, r.TLS, true, upstream.IdentityOff)
		h.Serve(w, r, &info, &cred, "")
	}))
	t.Cleanup(x.srv.Close)
	return x
}

// lentEverywhere fails the test unless every request u got carried the lent identity.
func (u *upstreamScript) lentEverywhere(t *testing.T, name string) {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	for i, a := range u.auth {
		if a != "Bearer lent" {
			t.Errorf("%s's request %d (%v) went with Authorization %q, want the lent identity", name, i, u.queries[i], a)
		}
	}
}

// removeA takes a out of the pool: its watch is asked to move (reason removed).
func (x *mbb) removeA(t *testing.T) {
	if _, _, err := x.pool.SetUpstreams([]*url.URL{x.ub}); err != nil {
		t.Error(err)
	}
}

// stream opens a client watch and returns its events as they come; the channel closes at
// the stream's end.
func (x *mbb) stream(t *testing.T, query string) <-chan got {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", x.srv.URL+"/api/v1/namespaces/d/configmaps?watch=true&"+query, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan got, 100)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		dec := json.NewDecoder(bufio.NewReader(resp.Body))
		for {
			var ev struct {
				Type   string
				Object struct {
					Code     int32
					Metadata struct{ Name, ResourceVersion string }
				}
			}
			if err := dec.Decode(&ev); err != nil {
				if err != io.EOF {
					out <- got{Type: "BROKEN: " + err.Error()}
				}
				return
			}
			out <- got{ev.Type, ev.Object.Metadata.Name, ev.Object.Metadata.ResourceVersion, ev.Object.Code}
		}
	}()
	return out
}

func collect(ch <-chan got, gs []got) []got {
	for g := range ch {
		gs = append(gs, g)
	}
	return gs
}

// finish waits for the stream's last event, then passes the client's deadline (timeoutSeconds
// 4, on the fake clock) and returns the whole stream: nothing may come after last.
func (x *mbb) finish(t *testing.T, ch <-chan got, gs []got, last string) []got {
	t.Helper()
	waitGot(t, ch, &gs, last)
	x.clk.Step(5 * time.Second)
	return collect(ch, gs)
}

func waitGot(t *testing.T, ch <-chan got, gs *[]got, want string) {
	t.Helper()
	for g := range ch {
		*gs = append(*gs, g)
		if g.Type+" "+g.Name+" "+g.RV == want {
			return
		}
	}
	t.Fatalf("stream ended after [%s] before %s", gotString(*gs), want)
}

const gone = `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 11 (20)","reason":"Expired","code":410}}` + "\n"

// a move whose target cannot serve the resume point (a real apiserver's
// watch cache answers 200 and an ERROR 410 at once) leaves the watch where it was: the client
// sees no ERROR and no break, the old upstream goes on serving it, and the pool learns the
// target's floor from the 410's "(N)".
func TestMoveRefusedByTargetKeepsWatch(t *testing.T) {
	tried := make(chan struct{})
	a := &upstreamScript{}
	a.steps = []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "" || r.URL.Query().Get("timeoutSeconds") == freshWatchSeconds {
			// The fresh-point probe (10.3): it finds nothing newer here.
			send(w)
			return
		}
		send(w, obj("ADDED", "a", "10"), obj("MODIFIED", "a", "11"))
		select {
		case <-tried:
		case <-r.Context().Done():
			return
		}
		send(w, obj("MODIFIED", "a", "12"))
		<-r.Context().Done()
	}}
	b := &upstreamScript{}
	b.steps = []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
		send(w, gone)
		if b.attempts() == 1 {
			close(tried)
		}
	}}
	x := newMBB(t, Config{}, a, b)
	ch := x.stream(t, "resourceVersion=5&timeoutSeconds=4")
	var gs []got
	waitGot(t, ch, &gs, "MODIFIED a 11")
	b.frozen.Store(false)
	x.removeA(t)
	// The move fails on its own goroutine, and a's next event does not wait for it.
	if !testutil.Until(10*time.Second, func() bool { return promtest.ToFloat64(x.m.WatchMovesFailed.WithLabelValues("removed")) >= 1 }) {
		t.Fatal("the move did not fail within 10s")
	}
	gs = x.finish(t, ch, gs, "MODIFIED a 12")
	expectStream(t, gs, nil, "ADDED a 10, MODIFIED a 11, MODIFIED a 12")
	if q := b.query(0); q.Get("resourceVersion") != "11" {
		t.Fatalf("the move tried b from %q, want 11", q.Get("resourceVersion"))
	}
	if n := a.watches(); n != 1 {
		t.Fatalf("a was asked for the watch %d times, want once: the watch never left it", n)
	}
	if x.backendB.CanServe("configmaps", 19) || !x.backendB.CanServe("configmaps", 20) {
		t.Fatal("b's floor is not the 410's 20")
	}
	if v := promtest.ToFloat64(x.m.RelistsForced); v != 0 {
		t.Fatalf("relists forced = %v, want 0", v)
	}
	if v := promtest.ToFloat64(x.m.WatchMovesFailed.WithLabelValues("removed")); v < 1 {
		t.Fatalf("moves failed{removed} = %v, want at least 1", v)
	}
	if v := promtest.ToFloat64(x.m.Resumes.WithLabelValues("moved")); v != 0 {
		t.Fatalf("resumes{moved} = %v, want 0", v)
	}
}

// a target that accepts the resume point (its first frame is no ERROR) takes
// the watch over, and only then is the old attempt ended; what the old one delivered while
// the target was being opened comes again from the target and is not written twice, in
// Observe mode too (where fix repairs nothing).
func TestMoveAcceptedByTargetSwitchesWithoutDuplicates(t *testing.T) {
	for _, mode := range []fix.Mode{fix.Repair, fix.Observe} {
		t.Run(mode.String(), func(t *testing.T) { testMoveAccepted(t, Config{Mode: mode}) })
	}
}

func testMoveAccepted(t *testing.T, cfg Config) {
	tried, aSent, clientSaw := make(chan struct{}), make(chan struct{}), make(chan struct{})
	a := &upstreamScript{canceled: make(chan struct{})}
	a.steps = []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
		send(w, obj("ADDED", "a", "10"), obj("MODIFIED", "a", "11"))
		select {
		case <-tried:
		case <-r.Context().Done():
			return
		}
		send(w, obj("MODIFIED", "a", "12")) // while b is being opened
		close(aSent)
		<-r.Context().Done()
		close(a.canceled)
	}}
	b := &upstreamScript{}
	b.steps = []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
		close(tried)
		<-clientSaw
		// From 11: the bookmark and 12 were delivered by a already.
		send(w, bookmark("11"), obj("MODIFIED", "a", "12"), obj("MODIFIED", "a", "13"))
		<-r.Context().Done()
	}}
	x := newMBB(t, cfg, a, b)
	ch := x.stream(t, "resourceVersion=5&timeoutSeconds=4")
	var gs []got
	waitGot(t, ch, &gs, "MODIFIED a 11")
	b.frozen.Store(false)
	x.removeA(t)
	waitGot(t, ch, &gs, "MODIFIED a 12")
	<-aSent
	close(clientSaw)
	select {
	case <-a.canceled:
	case <-time.After(10 * time.Second):
		t.Fatal("the old attempt was not ended after the target accepted")
	}
	gs = x.finish(t, ch, gs, "MODIFIED a 13")
	expectStream(t, gs, nil, "ADDED a 10, MODIFIED a 11, MODIFIED a 12, MODIFIED a 13")
	if q := b.query(0); q.Get("resourceVersion") != "11" {
		t.Fatalf("moved to b from %q, want 11", q.Get("resourceVersion"))
	}
	if v := promtest.ToFloat64(x.m.Resumes.WithLabelValues("moved")); v != 1 {
		t.Fatalf("resumes{moved} = %v, want 1", v)
	}
	if v := promtest.ToFloat64(x.m.RelistsForced); v != 0 {
		t.Fatalf("relists forced = %v, want 0", v)
	}
}

// a resume that meets "too old resource version" on one backend while
// another can still serve the resume point goes there; the client never sees the 410.
func TestGoneOnOneBackendResumesOnAnother(t *testing.T) {
	a := &upstreamScript{}
	a.steps = []func(http.ResponseWriter, *http.Request){events(obj("ADDED", "a", "10")), thenHang(a, obj("MODIFIED", "a", "11"))}
	b := &upstreamScript{}
	b.steps = []func(http.ResponseWriter, *http.Request){events(gone)}
	sa, sb := httptest.NewServer(a), httptest.NewServer(b)
	defer sa.Close()
	defer sb.Close()
	ua, _ := url.Parse(sa.URL)
	ub, _ := url.Parse(sb.URL)
	log := zaptest.NewLogger(t)
	pool, err := upstream.NewPool([]*url.URL{ua, ub}, upstream.PoolOptions{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New(nil)
	clk := newStepClock()
	h, err := New(Config{}, Deps{Attempts: upstream.NewAttempter(pool, upstream.AttempterOptions{Clock: clk}), Metrics: m,
		Memory: fix.NewDeleteMemory(0, 0, nil), Logger: log, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	waitServed(t, h)
	f := &fixture{h: h, m: m, srv: httptest.NewServer(h)}
	defer f.srv.Close()
	clk.stepTimers(t)                                                                // a resume's backoff after b's 410
	clk.stepWhen(t, func() bool { return f.passed("MODIFIED") == 1 }, 3*time.Second) // the client's deadline
	gs, err := f.watch(t, "resourceVersion=5&timeoutSeconds=2")
	expectStream(t, gs, err, "ADDED a 10, MODIFIED a 11")
	if q := a.query(1); q.Get("resourceVersion") != "10" {
		t.Fatalf("a's second attempt from %q, want 10", q.Get("resourceVersion"))
	}
	if v := promtest.ToFloat64(m.RelistsForced); v != 0 {
		t.Fatalf("relists forced = %v, want 0", v)
	}
	if pool.Backends()[1].CanServe("configmaps", 19) {
		t.Fatal("b's floor not learnt")
	}
}

// a quiet watch whose resume point the only target cannot serve (its 410
// names a newer floor) gets a fresh one from its own backend: after a consistent list, a
// same-scope watch from the resume point whose first frame is a bookmark at 25 proves that
// nothing happened in (11, 25]; the move then opens the target from 25, and the client gets
// that bookmark and goes on there.
func TestQuietWatchMovesFromAFreshResumePoint(t *testing.T) {
	a := &upstreamScript{}
	a.steps = []func(http.ResponseWriter, *http.Request){
		thenHang(a, obj("ADDED", "a", "10"), obj("MODIFIED", "a", "11")),
		func(w http.ResponseWriter, r *http.Request) { // the consistent list
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"25"},"items":[]}`)
		},
		events(bookmark("25")), // the probe watch
	}
	b := &upstreamScript{}
	b.steps = []func(http.ResponseWriter, *http.Request){
		events(gone), // from 11: too old, floor 20
		func(w http.ResponseWriter, r *http.Request) {
			send(w, obj("MODIFIED", "a", "26"))
			<-r.Context().Done()
		},
	}
	x := newMBB(t, Config{}, a, b)
	ch := x.stream(t, "resourceVersion=5&timeoutSeconds=4&allowWatchBookmarks=true")
	var gs []got
	waitGot(t, ch, &gs, "MODIFIED a 11")
	b.frozen.Store(false)
	x.removeA(t)
	gs = x.finish(t, ch, gs, "MODIFIED a 26")
	expectStream(t, gs, nil, "ADDED a 10, MODIFIED a 11, BOOKMARK  25, MODIFIED a 26")
	if q := a.query(1); q.Get("limit") != "1" || q.Get("watch") != "" || q.Has("resourceVersion") {
		t.Fatalf("the probe's list was %v, want a consistent list with limit 1", q)
	}
	if q := a.query(2); q.Get("resourceVersion") != "11" || q.Get("timeoutSeconds") != freshWatchSeconds {
		t.Fatalf("the probe watch was %v, want from 11 with timeoutSeconds %s", q, freshWatchSeconds)
	}
	if q := b.query(1); q.Get("resourceVersion") != "25" {
		t.Fatalf("moved to b from %q, want 25", q.Get("resourceVersion"))
	}
	if v := promtest.ToFloat64(x.m.WatchFreshPoints); v != 1 {
		t.Fatalf("fresh resume points = %v, want 1", v)
	}
	a.lentEverywhere(t, "a") // the fresh point's list and watch included
	b.lentEverywhere(t, "b")
	// The probe says what it is in the audit log; the watch and its move are the client's.
	a.mu.Lock()
	agents := append([]string(nil), a.agents...)
	a.mu.Unlock()
	client := "Go-http-client/1.1"
	for i, want := range []string{client, freshAgent + " (for " + client + ")", freshAgent + " (for " + client + ")"} {
		if agents[i] != want {
			t.Errorf("a's request %d (%v) went as User-Agent %q, want %q", i, a.query(i), agents[i], want)
		}
	}
	if ua := b.agent(1); ua != client {
		t.Errorf("the moved watch went as User-Agent %q, want the client's %q", ua, client)
	}
	if v := promtest.ToFloat64(x.m.RelistsForced); v != 0 {
		t.Fatalf("relists forced = %v, want 0", v)
	}
}

// watches counts the watch requests u got, the fresh-point probe's aside.
func (u *upstreamScript) watches() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, q := range u.queries {
		if q.Get("watch") != "" && q.Get("timeoutSeconds") != freshWatchSeconds {
			n++
		}
	}
	return n
}

// an apiserver in its shutdown delay (readyz failing, still serving) is
// degraded, and its watches move make-before-break: the target accepts first, then the old
// attempt ends, and the client sees one unbroken stream.
func TestDegradedBackendDrainsMakeBeforeBreak(t *testing.T) {
	a := &upstreamScript{canceled: make(chan struct{})}
	a.steps = []func(http.ResponseWriter, *http.Request){thenHang(a, obj("ADDED", "a", "10"), obj("MODIFIED", "a", "11"))}
	b := &upstreamScript{}
	asked, release := make(chan struct{}), make(chan struct{})
	b.steps = []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
		close(asked)
		<-release
		send(w, obj("MODIFIED", "a", "12"))
		<-r.Context().Done()
	}}
	x := newMBB(t, Config{}, a, b)
	ch := x.stream(t, "resourceVersion=5&timeoutSeconds=4")
	var gs []got
	waitGot(t, ch, &gs, "MODIFIED a 11")
	b.frozen.Store(false)
	a.frozen.Store(true) // its shutdown delay: /readyz fails, the watch goes on
	<-asked
	// Make before break: while b is being asked, the watch still holds its place on a.
	onA := x.pool.Backends()[0].OpenWatches()
	close(release)
	if onA != 1 {
		t.Errorf("%d watches on the degraded backend while the target was asked, want 1 (break before make)", onA)
	}
	gs = x.finish(t, ch, gs, "MODIFIED a 12")
	expectStream(t, gs, nil, "ADDED a 10, MODIFIED a 11, MODIFIED a 12")
	select { // the attempt's cancel reaches a's handler when its request is torn down
	case <-a.canceled:
	case <-time.After(10 * time.Second):
		t.Fatal("the degraded backend's attempt was not ended after the move")
	}
	if q := b.query(0); q.Get("resourceVersion") != "11" {
		t.Fatalf("moved to b from %q, want 11", q.Get("resourceVersion"))
	}
	if v := promtest.ToFloat64(x.m.Resumes.WithLabelValues("moved")); v != 1 {
		t.Fatalf("resumes{moved} = %v, want 1", v)
	}
}
