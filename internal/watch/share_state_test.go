package watch

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watchsan/watchsan/internal/testutil"
)

// gapFixture is a shareFixture whose memapi keeps a short history, and whose gate can hold
// every new watch (outage) while the writes of an outage are made: a feed's resume then finds
// its resourceVersion older than the history, and memapi answers it 410 (HTTP 200 and an
// ERROR event), as a restarted apiserver's watch cache does.
type gapFixture struct {
	*shareFixture
	held atomic.Pointer[chan struct{}]
}

func newGapFixture(t *testing.T, cfg Config) *gapFixture {
	t.Helper()
	x := &gapFixture{shareFixture: newShareFixture(t, cfg)}
	x.api.HistorySize = 8 // before the first request
	x.gate.wrap = func(w http.ResponseWriter, r *http.Request) http.ResponseWriter {
		if c := x.held.Load(); c != nil {
			select {
			case <-*c:
			case <-r.Context().Done():
			}
		}
		return w
	}
	return x
}

// outage ends every upstream watch, holds their resumes while it makes the gap's changes (more
// than the history holds), and lets them go: b deleted, a new object, a create-then-delete, and
// churn. It returns the resourceVersion after.
func (x *gapFixture) outage(t *testing.T, round int) uint64 {
	t.Helper()
	c := make(chan struct{})
	x.held.Store(&c)
	x.gate.breakAll()
	x.delete(t, "d", fmt.Sprintf("keep-%d", round))
	x.write(t, fmt.Sprintf("new%d", round), 1, 10)
	for i := range 6 {
		name := fmt.Sprintf("brief%d-%d", round, i)
		if err := x.create("d", name); err != nil {
			t.Fatal(err)
		}
		x.delete(t, "d", name)
	}
	after := x.api.ResourceVersion()
	x.held.Store(nil)
	close(c)
	return after
}

// list is the namespace d's configmaps as memapi lists them: "name rv", sorted.
func (x *gapFixture) list(t *testing.T) string {
	t.Helper()
	resp, err := http.Get(x.direct.URL + "/api/v1/namespaces/d/configmaps")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var l struct {
		Items []struct {
			Metadata struct{ Name, ResourceVersion string }
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, it := range l.Items {
		out = append(out, it.Metadata.Name+" "+it.Metadata.ResourceVersion)
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// store is what a client holds after its events ("TYPE name rv"), in list's form; an ERROR
// is kept as one.
func store(evs []string) string {
	objs := map[string]string{}
	var errs []string
	for _, e := range evs {
		f := strings.Fields(e)
		switch f[0] {
		case "ADDED", "MODIFIED":
			objs[f[1]] = f[2]
		case "DELETED":
			delete(objs, f[1])
		case "ERROR":
			errs = append(errs, e)
		}
	}
	var out []string
	for k, v := range objs {
		out = append(out, k+" "+v)
	}
	slices.Sort(out)
	return strings.Join(append(out, errs...), ", ")
}

// monotonic fails unless the resourceVersions a client was sent never go back.
func monotonic(t *testing.T, what string, evs []string) {
	t.Helper()
	var last uint64
	for _, e := range evs {
		f := strings.Fields(e)
		var n uint64
		if _, err := fmt.Sscan(f[len(f)-1], &n); err != nil || f[0] == "ERROR" {
			continue
		}
		if n < last {
			t.Errorf("%s: %q goes back from %d: %v", what, e, last, evs)
			return
		}
		last = n
	}
}

func (x *gapFixture) absorbed(outcome string) float64 {
	return promtest.ToFloat64(x.m.GoneAbsorbed.WithLabelValues(outcome))
}

func (x *gapFixture) waitStores(t *testing.T, what string, clients ...*client) {
	t.Helper()
	want := x.list(t)
	for i, c := range clients {
		testutil.Eventually(t, 20*time.Second, fmt.Sprintf("%s: client %d's store to equal a fresh list [%s]", what, i, want), func() bool {
			return store(c.events()) == want
		})
		monotonic(t, fmt.Sprintf("%s: client %d", what, i), c.events())
	}
}

// Issue 19 on a shared feed: two watch-lists hand off onto one feed (the first opens it with
// its complete state, the second joins), a 410 at the feed's resume is absorbed once for both
// (each gets the difference; each store equals a fresh list; nothing goes back), and after the
// absorb the ring serves no join below the list's resourceVersion L (a watch from the last RV
// before the gap goes private, not-covered) but does at L. When the feed ends, its state is
// parked at its last RV; a re-watch from there opens a feed that adopts it, and that feed
// absorbs the next 410 too.
func TestShareAbsorbsAHandedOffWatchList(t *testing.T) {
	x := newGapFixture(t, Config{ShareGrace: 50 * time.Millisecond})
	x.write(t, "keep", 4, 10)
	clients := x.watchLists(t, 2, func(int) string { return watchList })
	if o, j := promtest.ToFloat64(x.m.SharedHandoffs.WithLabelValues(handoffOpened)), promtest.ToFloat64(x.m.SharedHandoffs.WithLabelValues(handoffJoined)); o != 1 || j != 1 {
		t.Fatalf("handoffs opened %v, joined %v: want 1 and 1", o, j)
	}
	R := x.write(t, "live", 1, 10)
	x.waitStores(t, "before the gap", clients...)

	L := x.outage(t, 0)
	x.waitStores(t, "after the gap", clients...)
	if v := x.absorbed(absorbAbsorbed); v != 1 {
		t.Fatalf("gone_absorbed{absorbed} = %v, want 1 (one absorb for the feed)", v)
	}
	if v := promtest.ToFloat64(x.m.RelistsForced); v != 0 {
		t.Fatalf("relists forced = %v, want 0", v)
	}
	if n := x.gate.watches.Load(); n > 5 { // 2 watch-lists, the feed, its resume (410), its resume from L
		t.Fatalf("%d upstream watches: the feed absorbed more than once, or the clients went private", n)
	}

	// The ring after the absorb: from R (below L), not covered; from L, a join.
	notCovered := promtest.ToFloat64(x.m.PrivateFeeds.WithLabelValues(privateNotCovered))
	below := watchAt(t, x.srv.URL, "resourceVersion="+rv(R), nil, true)
	testutil.Eventually(t, 10*time.Second, "the watch from below L to go private", func() bool {
		return promtest.ToFloat64(x.m.PrivateFeeds.WithLabelValues(privateNotCovered)) == notCovered+1
	})
	below.cancel()
	joins := promtest.ToFloat64(x.m.SharedJoins)
	at := watchAt(t, x.srv.URL, "resourceVersion="+rv(L), nil, true)
	testutil.Eventually(t, 10*time.Second, "the watch from L to join", func() bool { return promtest.ToFloat64(x.m.SharedJoins) == joins+1 })
	x.write(t, "after", 1, 10)
	at.waitFor(t, "the joiner", 1)
	if got := at.events(); !strings.HasPrefix(got[0], "ADDED after-0 ") || len(got) != 1 {
		t.Fatalf("the joiner at L got %v, want only the event after L", got)
	}

	// The feed ends with its last subscriber: its state is parked at its last RV.
	for _, c := range append(clients, at) {
		c.cancel()
	}
	D := x.api.ResourceVersion()
	testutil.Eventually(t, 10*time.Second, "the ended feed's state to be parked", func() bool {
		return promtest.ToFloat64(x.m.SharedFeeds) == 0 && x.h.parkedCount() == 1
	})
	again := []*client{watchAt(t, x.srv.URL, "resourceVersion="+rv(D), nil, true)}
	x.waitSubscribers(t, 1)
	if n := x.h.parkedCount(); n != 0 {
		t.Fatalf("%d states parked after a re-watch from %d opened a feed: want it adopted", n, D)
	}
	again = append(again, watchAt(t, x.srv.URL, "resourceVersion="+rv(D), nil, true))
	x.waitSubscribers(t, 2)
	x.outage(t, 1)
	// The re-watches from D hold the store at D: the list taken before they began.
	want := x.list(t)
	for i, c := range again {
		testutil.Eventually(t, 20*time.Second, fmt.Sprintf("re-watch %d to get the difference", i), func() bool {
			return x.absorbed(absorbAbsorbed) == 2 && len(c.events()) >= 2
		})
		evs := c.events()
		if store(evs) == "" || strings.Contains(strings.Join(evs, ","), "ERROR") {
			t.Fatalf("re-watch %d got %v", i, evs)
		}
		monotonic(t, fmt.Sprintf("re-watch %d", i), evs)
		if !slices.ContainsFunc(evs, func(e string) bool { return strings.HasPrefix(e, "DELETED keep-1 ") }) ||
			!slices.ContainsFunc(evs, func(e string) bool { return strings.HasPrefix(e, "ADDED new1-0 ") }) {
			t.Fatalf("re-watch %d got %v: want keep-1 deleted and new1-0 added (the list: %s)", i, evs, want)
		}
	}
}
