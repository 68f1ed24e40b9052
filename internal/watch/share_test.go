package watch

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/watchsan/watchsan/internal/budget"
	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/memapi"
	"github.com/watchsan/watchsan/internal/metrics"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/ring"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/internal/upstream"
)

// apiGate is what stands between watchsan and a memapi: it counts the watches watchsan opens
// there and can end every open one at once (a clean end of the response, as an apiserver's
// restart or its watch timeout ends it).
type apiGate struct {
	api     http.Handler
	watches atomic.Int32
	mu      sync.Mutex
	open    map[*context.CancelFunc]chan struct{} // closed when the watch's handler returned
	// wrap, when set, is what the api answers each watch on (set before the first request).
	wrap func(http.ResponseWriter, *http.Request) http.ResponseWriter
}

func (g *apiGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("watch") != "true" {
		g.api.ServeHTTP(w, r)
		return
	}
	g.watches.Add(1)
	ctx, cancel := context.WithCancel(r.Context())
	ended := make(chan struct{})
	g.mu.Lock()
	g.open[&cancel] = ended
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.open, &cancel)
		g.mu.Unlock()
		cancel()
		close(ended)
	}()
	r = r.WithContext(ctx)
	if g.wrap != nil {
		w = g.wrap(w, r)
	}
	g.api.ServeHTTP(w, r)
}

// breakAll ends every watch open through the gate and returns once each has: a change made
// after it is in none of them (a canceled watch's handler may still send what it already had
// until it returns).
func (g *apiGate) breakAll() {
	g.mu.Lock()
	var ended []chan struct{}
	for c, e := range g.open {
		(*c)()
		ended = append(ended, e)
	}
	g.mu.Unlock()
	deadline := time.After(10 * time.Second)
	for _, e := range ended {
		select {
		case <-e:
		case <-deadline:
			panic("a watch broken by the gate did not end in 10s")
		}
	}
}

type shareFixture struct {
	// aggregated: the apiserver serves no group-version itself (Deps.ServedLocally says false).
	aggregated atomic.Bool
	api        *memapi.Server
	gate       *apiGate
	auth       *authAPI         // the apiserver's authentication and authorization, before the gate
	direct     *httptest.Server // memapi itself, for direct watches
	srv        *httptest.Server // watchsan in lending mode: a request with no Authorization is lent
	m          *metrics.Metrics
	h          *Handler
	// attempts is the Handler's way upstream, for another Handler on the same memapi.
	attempts *upstream.Attempter
	// shutdown closes the Handler's Done (once; the cleanup does it too).
	shutdown func()
}

func newShareFixture(t *testing.T, cfg Config) *shareFixture {
	t.Helper()
	return newShareFixtureClock(t, cfg, nil)
}

// newShareFixtureClock is newShareFixture with the Handler's clock clk (nil: the real one).
func newShareFixtureClock(t *testing.T, cfg Config, clk clock.WithDelayedExecution) *shareFixture {
	t.Helper()
	return newShareFixtureBudget(t, cfg, clk, nil)
}

// newShareFixtureBudget is newShareFixtureClock with the Handler's memory budget mem (nil:
// none).
func newShareFixtureBudget(t *testing.T, cfg Config, clk clock.WithDelayedExecution, mem *budget.Budget) *shareFixture {
	t.Helper()
	log := zaptest.NewLogger(t)
	x := &shareFixture{api: memapi.New(log), m: metrics.New(nil)}
	x.gate = &apiGate{api: x.api, open: map[*context.CancelFunc]chan struct{}{}}
	x.auth = newAuthAPI(x.gate)
	gateSrv := httptest.NewServer(x.auth)
	x.direct = httptest.NewServer(x.api)
	t.Cleanup(func() { x.api.Close(); gateSrv.Close(); x.direct.Close() })
	u, _ := url.Parse(gateSrv.URL)
	pool, err := upstream.NewPool([]*url.URL{u}, upstream.PoolOptions{Logger: log,
		Transport: upstream.TransportOptions{Credentials: &rest.Config{BearerToken: "lent"}, Lend: true}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var once sync.Once
	x.shutdown = func() { once.Do(func() { close(done) }) }
	cfg.Share = true
	x.attempts = upstream.NewAttempter(pool, upstream.AttempterOptions{})
	h, err := New(cfg, Deps{Attempts: x.attempts, Metrics: x.m,
		Memory: fix.NewDeleteMemory(0, 0, nil), Logger: log, Done: done, Clock: clk,
		ServedLocally: func(string, string) bool { return !x.aggregated.Load() }, Budget: mem})
	if err != nil {
		t.Fatal(err)
	}
	waitServed(t, h)
	x.h = h
	x.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, cred := reqinfo.Parse(r), upstream.Decide(r.Header, r.TLS, true, upstream.IdentityOff)
		h.Serve(w, r, &info, &cred, "")
	}))
	t.Cleanup(func() {
		x.shutdown() // shutdown ends feeds and subscribers: the servers' Close does not wait on them
		x.srv.Close()
		testutil.Eventually(t, 10*time.Second, "every shared feed ended", func() bool {
			return promtest.ToFloat64(x.m.SharedFeeds) == 0 && promtest.ToFloat64(x.m.SharedSubscribers) == 0
		})
		// A detached member leaves its feed before it logs its end: wait for the last of them,
		// or its line would be written to the test's logger after the test.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := h.WaitDetached(ctx); err != nil {
			t.Errorf("detached watches still open 10 s after the feeds ended: %v", err)
		}
	})
	return x
}

// write creates n configmaps (data of size bytes each) and returns the resourceVersion after.
func (x *shareFixture) write(t *testing.T, prefix string, n, size int) uint64 {
	t.Helper()
	data := strings.Repeat("x", size)
	for i := 0; i < n; i++ {
		body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"%s-%d"},"data":{"k":%q}}`, prefix, i, data)
		if err := x.send(http.MethodPost, "/api/v1/namespaces/d/configmaps", body, http.StatusCreated); err != nil {
			t.Fatal(err)
		}
	}
	return x.api.ResourceVersion()
}

// send sends method with the JSON body to memapi at path, and says so unless it answered want;
// for any goroutine (no t.Fatal).
func (x *shareFixture) send(method, path, body string, want int) error {
	req, err := http.NewRequest(method, x.direct.URL+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	return nil
}

// client is one client watch's stream, as read: each event "TYPE name rv".
type client struct {
	mu     sync.Mutex
	got    []string
	ended  chan struct{}
	cancel context.CancelFunc
	body   io.ReadCloser
	header http.Header // its response's
}

func (c *client) events() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.got...)
}

// watch opens a watch of configmaps in d at base (watchsan or memapi) with query, header
// added; read false opens it and never reads its body.
func watchAt(t *testing.T, base, query string, hdr http.Header, read bool) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/api/v1/namespaces/d/configmaps?watch=true&"+query, nil)
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("watch %s: %s %s", query, resp.Status, b)
	}
	c := &client{ended: make(chan struct{}), cancel: cancel, body: resp.Body, header: resp.Header}
	t.Cleanup(func() { resp.Body.Close() })
	if !read {
		return c
	}
	go func() {
		defer close(c.ended)
		dec := json.NewDecoder(resp.Body)
		for {
			var ev struct {
				Type   string
				Object struct {
					Metadata struct {
						Name, ResourceVersion string
						Annotations           map[string]string
					}
				}
			}
			if dec.Decode(&ev) != nil {
				return
			}
			name := ev.Object.Metadata.Name
			if ev.Type == "BOOKMARK" && ev.Object.Metadata.Annotations[stream.InitialEventsEndAnnotation] == "true" {
				name = "initial-events-end"
			}
			c.mu.Lock()
			c.got = append(c.got, ev.Type+" "+name+" "+ev.Object.Metadata.ResourceVersion)
			c.mu.Unlock()
		}
	}()
	return c
}

// waitFor waits until c has n events.
func (c *client) waitFor(t *testing.T, what string, n int) []string {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("%s to get %d events", what, n), func() bool { return len(c.events()) >= n })
	return c.events()
}

func rv(n uint64) string { return strconv.FormatUint(n, 10) }

// waitSubscribers waits until the shared feeds have n subscribers.
func (x *shareFixture) waitSubscribers(t *testing.T, n int) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("%d subscribers", n), func() bool {
		return promtest.ToFloat64(x.m.SharedSubscribers) == float64(n)
	})
}

// watchers opens n client watches through watchsan and one direct watch, all from the
// resourceVersion from, and waits until the n are subscribers of one feed.
func (x *shareFixture) watchers(t *testing.T, n int, from uint64) ([]*client, *client) {
	t.Helper()
	clients := make([]*client, n)
	for i := range clients {
		clients[i] = watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)
	}
	direct := watchAt(t, x.direct.URL, "resourceVersion="+rv(from), nil, true)
	x.waitSubscribers(t, n)
	return clients, direct
}

func sameEvents(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s got\n%s\nwant (a direct watch's)\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// N identical watches of the lent identity are one upstream watch, and every
// client gets, event for event, what a direct watch from the same resourceVersion gets; a
// client joining later at a resourceVersion inside the ring gets exactly the events after it.
func TestShareOneUpstreamWatch(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "before", 3, 10)
	const n = 5
	clients, direct := x.watchers(t, n, from)
	x.write(t, "cm", 20, 10)
	want := direct.waitFor(t, "the direct watch", 20)
	for i, c := range clients {
		sameEvents(t, fmt.Sprintf("client %d", i), c.waitFor(t, fmt.Sprintf("client %d", i), 20), want)
	}
	if got := x.gate.watches.Load(); got != 1 {
		t.Errorf("%d upstream watches for %d identical client watches, want 1", got, n)
	}
	if got := promtest.ToFloat64(x.m.SharedJoins); got != n-1 {
		t.Errorf("joins %v, want %d", got, n-1)
	}

	// A joiner inside the ring: the events after its resourceVersion, then the live ones.
	mid := from + 10
	late := watchAt(t, x.srv.URL, "resourceVersion="+rv(mid), nil, true)
	directLate := watchAt(t, x.direct.URL, "resourceVersion="+rv(mid), nil, true)
	sameEvents(t, "the late joiner's backlog", late.waitFor(t, "the late joiner", 10), directLate.waitFor(t, "its direct watch", 10))
	x.write(t, "after", 2, 10)
	sameEvents(t, "the late joiner", late.waitFor(t, "the late joiner", 12), directLate.waitFor(t, "its direct watch", 12))
	for i, c := range clients {
		sameEvents(t, fmt.Sprintf("client %d", i), c.waitFor(t, fmt.Sprintf("client %d", i), 22), direct.waitFor(t, "the direct watch", 22))
	}
	if got := x.gate.watches.Load(); got != 1 {
		t.Errorf("%d upstream watches after a join inside the ring, want 1", got)
	}
}

// A resourceVersion older than the ring gets a private feed, and still what a direct watch
// gets; so do "" and "0" and watch-lists, each reason counted.
func TestShareOlderThanRingGoesPrivate(t *testing.T) {
	x := newShareFixture(t, Config{ShareRingEvents: 5})
	from := x.write(t, "before", 1, 10)
	first := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)
	x.waitSubscribers(t, 1)
	x.write(t, "cm", 10, 10)
	first.waitFor(t, "the first client", 10)
	if got := promtest.ToFloat64(x.m.SharedRingEvictions.WithLabelValues(ring.EvictRingEvents)); got != 5 {
		t.Errorf("ring evictions %v, want 5", got)
	}
	old := watchAt(t, x.srv.URL, "resourceVersion="+rv(from+2), nil, true)
	directOld := watchAt(t, x.direct.URL, "resourceVersion="+rv(from+2), nil, true)
	sameEvents(t, "the watch from before the ring", old.waitFor(t, "the old watch", 8), directOld.waitFor(t, "its direct watch", 8))
	watchAt(t, x.srv.URL, "resourceVersion=0", nil, true)
	watchAt(t, x.srv.URL, "", nil, true)
	// A watch-list starts private, and hands off onto the feed at its initial-events-end
	// bookmark (handoff_test.go).
	watchAt(t, x.srv.URL, "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", nil, true)
	for reason, want := range map[string]float64{privateNotCovered: 1, privateInitial: 2, privateWatchList: 0} {
		testutil.Eventually(t, 10*time.Second, "private feeds "+reason, func() bool {
			return promtest.ToFloat64(x.m.PrivateFeeds.WithLabelValues(reason)) == want
		})
	}
	testutil.Eventually(t, 10*time.Second, "the watch-list's handoff", func() bool {
		return promtest.ToFloat64(x.m.SharedHandoffs.WithLabelValues(handoffJoined)) == 1
	})
	if got := x.gate.watches.Load(); got != 5 {
		t.Errorf("%d upstream watches, want 5 (the feed and 4 private)", got)
	}
}

// a subscriber that stops reading is ended once it is its buffer behind; the
// others get every event, never waiting for it.
func TestShareSlowSubscriberEnded(t *testing.T) {
	x := newShareFixture(t, Config{ShareSubscriberBytes: 8 << 20, WriteTimeout: 2 * time.Second})
	from := x.write(t, "before", 1, 10)
	fast := []*client{watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true), watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)}
	slow := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, false)
	x.waitSubscribers(t, 3)
	// More than the kernel's socket buffers on both sides hold for the client that does not
	// read, so that its writes block and its queue fills.
	const n = 600
	x.write(t, "big", n, 64<<10)
	for i, c := range fast {
		got := c.waitFor(t, fmt.Sprintf("fast client %d", i), n)
		if len(got) != n {
			t.Errorf("fast client %d got %d events, want %d", i, len(got), n)
		}
	}
	testutil.Eventually(t, 10*time.Second, "the slow subscriber ended", func() bool {
		return promtest.ToFloat64(x.m.SharedSlowSubscribers) == 1 && promtest.ToFloat64(x.m.SharedSubscribers) == 2
	})
	testutil.Eventually(t, 10*time.Second, "its stream ended (slow-client)", func() bool {
		return promtest.ToFloat64(x.m.StreamEnds.WithLabelValues(EndSlowClient.String())) == 1
	})
	// Its response ends (where its blocked write was cut: the write timeout's rule, as for a
	// private watch); it re-watches from its last resourceVersion.
	if _, err := io.Copy(io.Discard, slow.body); err != nil {
		t.Logf("the slow client's stream ended with %v", err)
	}
	if got := x.gate.watches.Load(); got != 1 {
		t.Errorf("%d upstream watches, want 1", got)
	}
}

// A subscriber's timeoutSeconds ends only its stream; the feed and the others go on.
func TestShareTimeoutEndsOnlyItsSubscriber(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "before", 1, 10)
	short := watchAt(t, x.srv.URL, "timeoutSeconds=1&resourceVersion="+rv(from), nil, true)
	long := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)
	x.waitSubscribers(t, 2)
	select {
	case <-short.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the client with timeoutSeconds=1 still watching after 10s")
	}
	x.write(t, "cm", 3, 10)
	long.waitFor(t, "the other client", 3)
	x.waitSubscribers(t, 1)
	if got := x.gate.watches.Load(); got != 1 {
		t.Errorf("%d upstream watches, want 1", got)
	}
}

// A feed ends (its upstream watch closed) a grace after its last subscriber left.
func TestShareFeedEndsAfterLastSubscriber(t *testing.T) {
	x := newShareFixture(t, Config{ShareGrace: 50 * time.Millisecond})
	from := x.write(t, "before", 1, 10)
	a := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)
	b := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)
	x.waitSubscribers(t, 2)
	testutil.Eventually(t, 10*time.Second, "the feed's upstream watch", func() bool { return x.api.OpenWatches() == 1 })
	a.cancel()
	x.waitSubscribers(t, 1)
	if promtest.ToFloat64(x.m.SharedFeeds) != 1 || x.api.OpenWatches() != 1 {
		t.Fatal("the feed ended with a subscriber left")
	}
	b.cancel()
	testutil.Eventually(t, 10*time.Second, "the feed and its upstream watch ended", func() bool {
		return promtest.ToFloat64(x.m.SharedFeeds) == 0 && x.api.OpenWatches() == 0
	})
	// A watch after that opens a new feed.
	c := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)
	x.write(t, "cm", 1, 10)
	c.waitFor(t, "a client of the new feed", 1)
	if got := x.gate.watches.Load(); got != 2 {
		t.Errorf("%d upstream watches, want 2", got)
	}
}

// a break of the feed's upstream costs one resume however many subscribers,
// and every subscriber's stream is gapless, as a direct watch's that never broke.
func TestShareUpstreamBreakOneResume(t *testing.T) {
	x := newShareFixture(t, Config{})
	from := x.write(t, "before", 1, 10)
	const n = 6
	clients, direct := x.watchers(t, n, from)
	x.write(t, "a", 5, 10)
	for i, c := range clients {
		c.waitFor(t, fmt.Sprintf("client %d", i), 5)
	}
	x.gate.breakAll()
	x.write(t, "b", 5, 10)
	want := direct.waitFor(t, "the direct watch", 10)
	for i, c := range clients {
		sameEvents(t, fmt.Sprintf("client %d", i), c.waitFor(t, fmt.Sprintf("client %d", i), 10), want)
	}
	if got := x.gate.watches.Load(); got != 2 {
		t.Errorf("%d upstream watches, want 2 (the feed and its one resume)", got)
	}
	if got := promtest.ToFloat64(x.m.Resumes.WithLabelValues(ResumeEOF.String())); got != 1 {
		t.Errorf("resumes %v, want 1", got)
	}
}

// A client that asked for no bookmarks gets none from a feed (which always asks for them); one
// that asked gets them.
func TestShareBookmarksPerSubscriber(t *testing.T) {
	x := newShareFixture(t, Config{})
	x.api.BookmarkInterval = 50 * time.Millisecond // before its first request
	from := x.write(t, "before", 1, 10)
	with := watchAt(t, x.srv.URL, "allowWatchBookmarks=true&resourceVersion="+rv(from), nil, true)
	without := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)
	x.waitSubscribers(t, 2)
	testutil.Eventually(t, 10*time.Second, "a bookmark for the client that asked", func() bool {
		for _, e := range with.events() {
			if strings.HasPrefix(e, "BOOKMARK") {
				return true
			}
		}
		return false
	})
	x.write(t, "cm", 1, 10)
	for _, e := range without.waitFor(t, "the client without bookmarks", 1) {
		if strings.HasPrefix(e, "BOOKMARK") {
			t.Errorf("the client that asked for no bookmarks got %s", e)
		}
	}
}

// A feed whose first answer is an ERROR 410 (the resourceVersion is older than the apiserver's
// history) hands it to its subscribers as a direct watch gets it, and ends.
func TestShareTooOldAtTheApiserver(t *testing.T) {
	x := newShareFixture(t, Config{})
	x.api.HistorySize = 3 // before its first request
	from := x.write(t, "cm", 10, 10)
	shared := watchAt(t, x.srv.URL, "resourceVersion="+rv(from-8), nil, true)
	direct := watchAt(t, x.direct.URL, "resourceVersion="+rv(from-8), nil, true)
	for _, c := range []*client{shared, direct} {
		select {
		case <-c.ended:
		case <-time.After(10 * time.Second):
			t.Fatal("a watch from a resourceVersion older than the history still open after 10s")
		}
	}
	sameEvents(t, "the watch from too old a resourceVersion", shared.events(), direct.events())
	if got := direct.events(); len(got) != 1 || !strings.HasPrefix(got[0], "ERROR") {
		t.Errorf("the direct watch got %v, want one ERROR", got)
	}
	testutil.Eventually(t, 10*time.Second, "the feed ended", func() bool { return promtest.ToFloat64(x.m.SharedFeeds) == 0 })
}

// A feed whose first answer is no stream (a 404 here) is no feed: each client asks on its own
// and gets the apiserver's own answer.
func TestShareFeedFailedGoesPrivate(t *testing.T) {
	x := newShareFixture(t, Config{})
	for i := 0; i < 2; i++ {
		resp, err := http.Get(x.srv.URL + "/api/v1/namespaces/d/secrets?watch=true&resourceVersion=1")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("watch of a resource memapi does not serve: %s, want 404", resp.Status)
		}
	}
	if got := promtest.ToFloat64(x.m.PrivateFeeds.WithLabelValues(privateFeedFailed)); got != 2 {
		t.Errorf("private feeds (feed-failed) %v, want 2", got)
	}
	if promtest.ToFloat64(x.m.SharedFeeds) != 0 {
		t.Error("a feed left open")
	}
}

// A feed whose only watch was reset at once (a client gone before the feed's grace) ends at
// once, its upstream watch with it: rapid resets cost no upstream watch that outlives them.
func TestShareFeedOfAResetWatchEndsAtOnce(t *testing.T) {
	x := newShareFixture(t, Config{ShareGrace: time.Minute})
	from := x.write(t, "before", 1, 10)
	a := watchAt(t, x.srv.URL, "resourceVersion="+rv(from), nil, true)
	x.waitSubscribers(t, 1)
	testutil.Eventually(t, 10*time.Second, "the feed's upstream watch", func() bool { return x.api.OpenWatches() == 1 })
	a.cancel()
	testutil.Eventually(t, 10*time.Second, "the young feed and its upstream watch to end, well before its grace", func() bool {
		return promtest.ToFloat64(x.m.SharedFeeds) == 0 && x.api.OpenWatches() == 0
	})
}
