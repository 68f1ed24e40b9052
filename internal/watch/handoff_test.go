package watch

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watchsan/watchsan/internal/review"
	"github.com/watchsan/watchsan/internal/testutil"
)

// watchList is what client-go's informers send (watch-list, the default since v0.35).
const watchList = "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"

// handedOff is how many watch-lists moved onto a shared feed.
func (x *shareFixture) handedOff() float64 {
	return promtest.ToFloat64(x.m.SharedHandoffs.WithLabelValues(handoffJoined)) +
		promtest.ToFloat64(x.m.SharedHandoffs.WithLabelValues(handoffOpened))
}

func (x *shareFixture) waitHandedOff(t *testing.T, n int) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("%d watch-lists handed off", n), func() bool {
		return x.handedOff() == float64(n)
	})
}

// watchLists opens n watch-lists through watchsan, the i-th with query(i), and waits until
// all have handed off.
func (x *shareFixture) watchLists(t *testing.T, n int, query func(i int) string) []*client {
	t.Helper()
	clients := make([]*client, n)
	for i := range clients {
		clients[i] = watchAt(t, x.srv.URL, query(i), nil, true)
	}
	x.waitHandedOff(t, n)
	return clients
}

// create creates the configmap name in namespace ns; for a writer's goroutine (no t.Fatal).
func (x *shareFixture) create(ns, name string) error {
	body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q},"data":{"k":"v"}}`, name)
	return x.send(http.MethodPost, "/api/v1/namespaces/"+ns+"/configmaps", body, http.StatusCreated)
}

// N watch-lists of the same watch (client-go informers) end on one upstream watch:
// each starts on its own, and at its initial-events-end bookmark moves onto the shared feed of
// the plain watch, its own upstream watch closed. Each gets exactly what a direct watch-list
// gets: the initial events, the bookmark, then every later event once, in order.
func TestHandoffWatchListsOntoOneFeed(t *testing.T) {
	x := newShareFixture(t, Config{})
	x.write(t, "before", 3, 10)
	direct := watchAt(t, x.direct.URL, watchList, nil, true)
	direct.waitFor(t, "the direct watch-list", 4)
	const n = 5
	// As client-go's typed clients send it: timeoutSeconds and timeout, random per watch.
	clients := x.watchLists(t, n, func(i int) string {
		return fmt.Sprintf("%s&timeoutSeconds=%d&timeout=%dm%ds", watchList, 300+i, 5, i)
	})
	x.waitSubscribers(t, n)
	testutil.Eventually(t, 10*time.Second, "one upstream watch for the watch-lists (and the direct one)", func() bool {
		return x.api.OpenWatches() == 2
	})
	if got := promtest.ToFloat64(x.m.SharedHandoffs.WithLabelValues(handoffOpened)); got != 1 {
		t.Errorf("handoffs that opened a feed: %v, want 1", got)
	}
	if got := promtest.ToFloat64(x.m.PrivateFeeds.WithLabelValues(privateWatchList)); got != 0 {
		t.Errorf("private feeds (watch-list) %v, want 0", got)
	}
	x.write(t, "cm", 20, 10)
	want := direct.waitFor(t, "the direct watch-list", 24)
	if !strings.HasPrefix(want[3], "BOOKMARK initial-events-end ") {
		t.Fatalf("the direct watch-list's 4th event is %s, want its initial-events-end bookmark", want[3])
	}
	for i, c := range clients {
		sameEvents(t, fmt.Sprintf("watch-list %d", i), c.waitFor(t, fmt.Sprintf("watch-list %d", i), 24), want)
	}
	// One more event: had anything come twice, it would be there before it.
	x.write(t, "last", 1, 10)
	want = direct.waitFor(t, "the direct watch-list", 25)
	for i, c := range clients {
		sameEvents(t, fmt.Sprintf("watch-list %d", i), c.waitFor(t, fmt.Sprintf("watch-list %d", i), 25), want)
	}
	if got := x.gate.watches.Load(); got != n+1 {
		t.Errorf("%d upstream watches opened, want %d (one private per watch-list, and the feed)", got, n+1)
	}
}

// checkWatchList checks one watch-list's stream against a direct watch of every event since
// before the first write (ref, RVs strictly increasing): its initial events are exactly the
// objects at its bookmark's resourceVersion B (those created before, and ref's up to B), once
// each, then come exactly ref's events after B, in order: nothing missed, nothing twice, no
// resourceVersion going back (bookmarks after the first never below the last delivered).
func checkWatchList(t *testing.T, what string, got, before, ref []string) {
	t.Helper()
	end := slices.IndexFunc(got, func(e string) bool { return strings.HasPrefix(e, "BOOKMARK initial-events-end ") })
	if end < 0 {
		t.Errorf("%s: no initial-events-end bookmark in %d events", what, len(got))
		return
	}
	b, _ := strconv.ParseUint(strings.Fields(got[end])[2], 10, 64)
	rvOf := func(e string) uint64 {
		n, _ := strconv.ParseUint(strings.Fields(e)[len(strings.Fields(e))-1], 10, 64)
		return n
	}
	state := map[string]bool{}
	for _, name := range before {
		state[name] = true
	}
	var wantAfter []string
	for _, e := range ref {
		f := strings.Fields(e)
		switch {
		case rvOf(e) > b:
			wantAfter = append(wantAfter, e)
		case f[0] == "DELETED":
			delete(state, f[1])
		default:
			state[f[1]] = true
		}
	}
	var wantInitial []string
	for name := range state {
		wantInitial = append(wantInitial, name)
	}
	var initial []string
	for _, e := range got[:end] {
		if !strings.HasPrefix(e, "ADDED ") || rvOf(e) > b {
			t.Errorf("%s: initial event %s (bookmark at %d)", what, e, b)
		}
		initial = append(initial, strings.Fields(e)[1])
	}
	slices.Sort(initial)
	slices.Sort(wantInitial)
	if !slices.Equal(initial, wantInitial) {
		t.Errorf("%s: initial events %v, want %v", what, initial, wantInitial)
	}
	var after []string
	last := b
	for _, e := range got[end+1:] {
		if strings.HasPrefix(e, "BOOKMARK ") {
			if rvOf(e) < last {
				t.Errorf("%s: bookmark %s after %d", what, e, last)
			}
			continue
		}
		last = rvOf(e)
		after = append(after, e)
	}
	sameEvents(t, what+" after its bookmark", after, wantAfter)
}

// A busy writer while watch-lists hand off: none loses or doubles an event, and each ends on
// the one feed. Half the writes are to another namespace: they raise the resourceVersion
// without an event of the watched scope, so a bookmark may be above what the feed delivered
// (member.skip), as on a real cluster.
func TestHandoffBusyWriter(t *testing.T) {
	x := newShareFixture(t, Config{})
	r0 := x.write(t, "before", 3, 10)
	ref := watchAt(t, x.direct.URL, "resourceVersion="+rv(r0), nil, true)
	var written atomic.Int64
	stop, stopped := make(chan struct{}), make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				stopped <- nil
				return
			default:
			}
			ns := "d"
			if i%2 == 1 {
				ns = "o"
			}
			if err := x.create(ns, fmt.Sprintf("busy-%d", i)); err != nil {
				stopped <- err
				return
			}
			written.Add(1)
		}
	}()
	const n = 8
	clients := make([]*client, n)
	for i := range clients {
		testutil.Eventually(t, 30*time.Second, "the writer to go on", func() bool { return written.Load() >= int64(20*(i+1)) })
		clients[i] = watchAt(t, x.srv.URL, watchList, nil, true)
	}
	x.waitHandedOff(t, n)
	testutil.Eventually(t, 30*time.Second, "the writer to go on after the handoffs", func() bool { return written.Load() >= int64(20*(n+2)) })
	close(stop)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if err := x.create("d", "zz-last"); err != nil {
		t.Fatal(err)
	}
	all := ref.events()
	testutil.Eventually(t, 30*time.Second, "the direct watch to get the last write", func() bool {
		all = ref.events()
		return len(all) > 0 && strings.Contains(all[len(all)-1], " zz-last ")
	})
	t.Logf("%d writes, %d of the watched namespace; handoffs joined %v, opened %v", written.Load()+1, len(all),
		promtest.ToFloat64(x.m.SharedHandoffs.WithLabelValues(handoffJoined)), promtest.ToFloat64(x.m.SharedHandoffs.WithLabelValues(handoffOpened)))
	for i, c := range clients {
		what := fmt.Sprintf("watch-list %d", i)
		testutil.Eventually(t, 30*time.Second, what+" to get the last write", func() bool {
			got := c.events()
			return len(got) > 0 && strings.Contains(got[len(got)-1], " zz-last ")
		})
		checkWatchList(t, what, c.events(), []string{"before-0", "before-1", "before-2"}, all)
	}
	x.waitSubscribers(t, n)
	testutil.Eventually(t, 10*time.Second, "one upstream watch for the watch-lists (and the direct one)", func() bool {
		return x.api.OpenWatches() == 2
	})
}

// heldWriter holds the first write of a watch's body until hold is closed: the watch's
// snapshot is taken and its headers sent, its events wait.
type heldWriter struct {
	http.ResponseWriter
	r    *http.Request
	hold <-chan struct{}
	once bool
}

func (w *heldWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *heldWriter) Write(p []byte) (int, error) {
	if !w.once {
		w.once = true
		select {
		case <-w.hold:
		case <-w.r.Context().Done():
			return 0, w.r.Context().Err()
		}
	}
	return w.ResponseWriter.Write(p)
}

// holdWatches makes the gate hold the events of every watch that match selects until the
// returned func is called (once).
func (x *shareFixture) holdWatches(match func(q url.Values) bool) (release func()) {
	hold := make(chan struct{})
	x.gate.wrap = func(w http.ResponseWriter, r *http.Request) http.ResponseWriter {
		if !match(r.URL.Query()) {
			return w
		}
		return &heldWriter{ResponseWriter: w, r: r, hold: hold}
	}
	return func() { close(hold) }
}

func (x *shareFixture) holdWatchLists() (release func()) {
	return x.holdWatches(func(q url.Values) bool { return q.Get("sendInitialEvents") == "true" })
}

// holdFeedFrom holds the first attempt of a plain watch from resourceVersion from.
func (x *shareFixture) holdFeedFrom(from uint64) (release func()) {
	return x.holdWatches(func(q url.Values) bool {
		return q.Get("sendInitialEvents") == "" && q.Get("resourceVersion") == rv(from)
	})
}

func (x *shareFixture) delete(t *testing.T, ns, name string) {
	t.Helper()
	if err := x.send(http.MethodDelete, "/api/v1/namespaces/"+ns+"/configmaps/"+name, "", http.StatusOK); err != nil {
		t.Fatal(err)
	}
}

// A watch-list whose bookmark is above what the feed delivered, and whose initial events are
// all older than that (the writes after were a create and a delete the feed has not delivered
// yet, and others' namespace's), joins the feed at once and skips what the feed then delivers
// up to its bookmark: its snapshot holds it already.
func TestHandoffSkipsWhatItsSnapshotHolds(t *testing.T) {
	x := newShareFixture(t, Config{})
	r0 := x.write(t, "before", 2, 10)
	release := x.holdFeedFrom(r0)
	plain := watchAt(t, x.srv.URL, "resourceVersion="+rv(r0), nil, true)
	x.waitSubscribers(t, 1)
	ref := watchAt(t, x.direct.URL, "resourceVersion="+rv(r0), nil, true)
	x.write(t, "z", 1, 10)
	x.delete(t, "d", "z-0")
	if err := x.create("o", "elsewhere"); err != nil {
		t.Fatal(err)
	}
	wl := watchAt(t, x.srv.URL, watchList, nil, true)
	x.waitHandedOff(t, 1)
	release()
	x.write(t, "w", 1, 10)
	plain.waitFor(t, "the plain watch", 3)
	all := ref.waitFor(t, "the direct watch", 3)
	got := wl.waitFor(t, "the watch-list", 2+1+1)
	checkWatchList(t, "the watch-list", got, []string{"before-0", "before-1"}, all)
	x.write(t, "last", 1, 10)
	all = ref.waitFor(t, "the direct watch", 4)
	checkWatchList(t, "the watch-list", wl.waitFor(t, "the watch-list", 2+1+2), []string{"before-0", "before-1"}, all)
	if got := x.api.OpenWatches(); got != 2 {
		t.Errorf("%d upstream watches open, want 2 (the feed, the direct one)", got)
	}
}

// A watch-list whose initial events are newer than anything the feed delivered (the feed is
// behind: its upstream is held here) waits a bounded time for it, then stays on its own
// upstream watch, and still gets everything.
func TestHandoffFeedBehindStaysPrivate(t *testing.T) {
	x := newShareFixture(t, Config{})
	r0 := x.write(t, "before", 1, 10)
	release := x.holdFeedFrom(r0)
	defer release()
	watchAt(t, x.srv.URL, "resourceVersion="+rv(r0), nil, true)
	x.waitSubscribers(t, 1)
	ref := watchAt(t, x.direct.URL, "resourceVersion="+rv(r0), nil, true)
	x.write(t, "y", 1, 10)
	wl := watchAt(t, x.srv.URL, watchList, nil, true)
	testutil.Eventually(t, 10*time.Second, "the handoff given up (behind)", func() bool {
		return promtest.ToFloat64(x.m.SharedHandoffs.WithLabelValues(handoffBehind)) == 1
	})
	x.write(t, "after", 2, 10)
	all := ref.waitFor(t, "the direct watch", 3)
	checkWatchList(t, "the watch-list", wl.waitFor(t, "the watch-list", 2+1+2), []string{"before-0"}, all)
	if x.handedOff() != 0 {
		t.Error("a watch-list handed off onto a feed behind it")
	}
	if got := x.api.OpenWatches(); got != 3 {
		t.Errorf("%d upstream watches open, want 3 (the feed, the private watch-list, the direct one)", got)
	}
}

// A watch-list whose stream is behind the feed by more than its ring (the feed evicted events
// after the watch-list's bookmark) stays on its own upstream watch, and still gets everything.
func TestHandoffNotCoveredStaysPrivate(t *testing.T) {
	x := newShareFixture(t, Config{ShareRingEvents: 2})
	release := x.holdWatchLists()
	r0 := x.write(t, "before", 2, 10)
	plain := watchAt(t, x.srv.URL, "resourceVersion="+rv(r0), nil, true)
	x.waitSubscribers(t, 1)
	wl := watchAt(t, x.srv.URL, watchList, nil, true) // its snapshot is at r0; its events are held
	ref := watchAt(t, x.direct.URL, "resourceVersion="+rv(r0), nil, true)
	x.write(t, "cm", 5, 10)
	plain.waitFor(t, "the plain watch", 5)
	release()
	testutil.Eventually(t, 10*time.Second, "the handoff found not covered", func() bool {
		return promtest.ToFloat64(x.m.SharedHandoffs.WithLabelValues(handoffNotCovered)) == 1
	})
	x.write(t, "after", 2, 10)
	all := ref.waitFor(t, "the direct watch", 7)
	checkWatchList(t, "the watch-list", wl.waitFor(t, "the watch-list", 2+1+7), []string{"before-0", "before-1"}, all)
	if x.handedOff() != 0 {
		t.Error("a watch-list handed off onto a feed whose ring does not cover its bookmark")
	}
	if got := x.api.OpenWatches(); got != 3 {
		t.Errorf("%d upstream watches open, want 3 (the feed, the private watch-list, the direct one)", got)
	}
}

// A watch-list whose upstream breaks before its initial-events-end bookmark is ended as today
// (the client starts over), counted as ended-before.
func TestHandoffBreakBeforeBookmark(t *testing.T) {
	x := newShareFixture(t, Config{})
	release := x.holdWatchLists()
	defer release()
	x.write(t, "before", 2, 10)
	wl := watchAt(t, x.srv.URL, watchList, nil, true)
	testutil.Eventually(t, 10*time.Second, "the watch-list upstream", func() bool { return x.api.OpenWatches() == 1 })
	x.gate.breakAll()
	select {
	case <-wl.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch-list broken in its initial phase still open after 10s")
	}
	testutil.Eventually(t, 10*time.Second, "counted as ended-before", func() bool {
		return promtest.ToFloat64(x.m.SharedHandoffs.WithLabelValues(handoffEndedBefore)) == 1
	})
	if got := promtest.ToFloat64(x.m.StreamEnds.WithLabelValues(EndNoResume.String())); got != 1 {
		t.Errorf("streams ended upstream-broke: %v, want 1", got)
	}
	if x.handedOff() != 0 || promtest.ToFloat64(x.m.SharedFeeds) != 0 {
		t.Error("a watch-list broken before its bookmark handed off")
	}
}

// A handed-off watch-list's own timeoutSeconds ends its stream, as the apiserver ends it;
// the feed goes on for the others.
func TestHandoffOwnTimeout(t *testing.T) {
	x := newShareFixture(t, Config{})
	r0 := x.write(t, "before", 1, 10)
	plain := watchAt(t, x.srv.URL, "resourceVersion="+rv(r0), nil, true)
	x.waitSubscribers(t, 1)
	short := watchAt(t, x.srv.URL, "timeoutSeconds=2&"+watchList, nil, true)
	x.waitHandedOff(t, 1)
	x.waitSubscribers(t, 2)
	select {
	case <-short.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch-list with timeoutSeconds=2 still open after 10s")
	}
	testutil.Eventually(t, 10*time.Second, "its stream ended at its deadline", func() bool {
		return promtest.ToFloat64(x.m.StreamEnds.WithLabelValues(EndDeadline.String())) == 1
	})
	x.waitSubscribers(t, 1)
	x.write(t, "cm", 2, 10)
	plain.waitFor(t, "the plain watch", 2)
	if got := x.api.OpenWatches(); got != 1 {
		t.Errorf("%d upstream watches open, want 1 (the feed)", got)
	}
}

// An exempt resource's watch-lists (their policy passes everything, judging nothing) hand off
// too, and get every event once.
func TestHandoffExemptResource(t *testing.T) {
	x := newShareFixture(t, Config{Exempt: []string{"configmaps"}})
	x.write(t, "before", 2, 10)
	direct := watchAt(t, x.direct.URL, watchList, nil, true)
	direct.waitFor(t, "the direct watch-list", 3)
	const n = 3
	clients := x.watchLists(t, n, func(int) string { return watchList })
	x.write(t, "cm", 4, 10)
	want := direct.waitFor(t, "the direct watch-list", 7)
	for i, c := range clients {
		sameEvents(t, fmt.Sprintf("watch-list %d", i), c.waitFor(t, fmt.Sprintf("watch-list %d", i), 7), want)
	}
	testutil.Eventually(t, 10*time.Second, "one upstream watch for the watch-lists (and the direct one)", func() bool {
		return x.api.OpenWatches() == 2
	})
}

// TestHandoffFeedLimit: a watch-list whose handoff would open a feed while --share-max-feeds
// are open stays on its own upstream watch (feed-limit) and still gets everything.
func TestHandoffFeedLimit(t *testing.T) {
	x := newShareFixture(t, Config{ShareMaxFeeds: 1})
	r0 := x.write(t, "before", 2, 10)
	watchAt(t, x.srv.URL, "resourceVersion="+rv(r0)+"&fieldSelector=metadata.name%3Dnone", nil, true)
	x.waitSubscribers(t, 1) // the one feed the cap allows, of another scope
	wl := watchAt(t, x.srv.URL, watchList, nil, true)
	testutil.Eventually(t, 10*time.Second, "the handoff refused by the cap", func() bool {
		return promtest.ToFloat64(x.m.SharedHandoffs.WithLabelValues(handoffFeedLimit)) == 1
	})
	ref := watchAt(t, x.direct.URL, "resourceVersion="+rv(r0), nil, true)
	x.write(t, "after", 2, 10)
	all := ref.waitFor(t, "the direct watch", 2)
	checkWatchList(t, "the watch-list", wl.waitFor(t, "the watch-list", 2+1+2), []string{"before-0", "before-1"}, all)
	if x.handedOff() != 0 {
		t.Error("a watch-list handed off beyond --share-max-feeds")
	}
}

// With ShareReviewedWatchLists, watch-lists of clients with tokens of their own hand off too,
// each once an access review sent at its bookmark allowed it to watch the scope: two tokens' informers end on one upstream
// watch, and each gets what a direct watch-list gets. A client whose rights were taken away
// after the apiserver began its watch-list is refused at its bookmark: it stays on its own
// stream, which the apiserver authorized, and joins no feed.
func TestHandoffReviewedTokens(t *testing.T) {
	x := newShareFixture(t, Config{ShareReviewedWatchLists: true})
	x.write(t, "before", 3, 10)
	direct := watchAt(t, x.direct.URL, watchList, nil, true)
	direct.waitFor(t, "the direct watch-list", 4)
	clients := []*client{watchAt(t, x.srv.URL, watchList, bearer("alice"), true), watchAt(t, x.srv.URL, watchList, bearer("bob"), true)}
	x.waitHandedOff(t, 2)
	testutil.Eventually(t, 10*time.Second, "one upstream watch for both tokens' watch-lists (and the direct one)", func() bool {
		return x.api.OpenWatches() == 2
	})
	var watches int
	for _, ra := range x.auth.sent() {
		if ra.Verb == "watch" {
			watches++
		}
	}
	if watches != 2 || x.reviews(review.ResultAllowed) != 2 {
		t.Errorf("%d watch reviews sent (%v allowed), want 2: one per handoff", watches, x.reviews(review.ResultAllowed))
	}
	x.write(t, "cm", 2, 10)
	want := direct.waitFor(t, "the direct watch-list", 6)
	for i, c := range clients {
		sameEvents(t, fmt.Sprintf("watch-list %d", i), c.waitFor(t, fmt.Sprintf("watch-list %d", i), 6), want)
	}

	release := x.holdWatches(func(q url.Values) bool { return q.Get("labelSelector") == "held" })
	opened := x.gate.watches.Load()
	revoked := watchAt(t, x.srv.URL, watchList+"&labelSelector=held", bearer("bob"), true)
	testutil.Eventually(t, 10*time.Second, "bob's watch-list sent upstream", func() bool { return x.gate.watches.Load() == opened+1 })
	x.auth.unbind("bob")
	release()
	testutil.Eventually(t, 10*time.Second, "bob's handoff refused", func() bool {
		return promtest.ToFloat64(x.m.SharedHandoffs.WithLabelValues(handoffDenied)) == 1
	})
	revoked.waitFor(t, "bob's watch-list, on its own stream", 1) // its initial-events-end bookmark
	if got := x.handedOff(); got != 2 {
		t.Errorf("%v handoffs, want the 2 allowed ones", got)
	}
}
