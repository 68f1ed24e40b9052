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

	"github.com/watchsan/watchsan/internal/absorb"
	"github.com/watchsan/watchsan/internal/testutil"
)

// gapFixture is a shareFixture whose memapi keeps a short history, and whose gate can hold
// every new watch (outage) while the writes of an outage are made: a feed's resume then finds
// its resourceVersion older than the history, and memapi answers it 410 (HTTP 200 and an
// ERROR event), as a restarted apiserver's watch cache does.
type gapFixture struct {
	*shareFixture
	held   atomic.Pointer[chan struct{}]
	listed atomic.Int32 // lists through the gate
	// writesFrom, when set, holds the events of every plain watch from its resourceVersion
	// until its channel closes (heldWriter).
	writesFrom atomic.Pointer[heldFrom]
}

type heldFrom struct {
	rv   string
	hold chan struct{}
}

func newGapFixture(t *testing.T, cfg Config) *gapFixture {
	t.Helper()
	x := &gapFixture{shareFixture: newShareFixture(t, cfg)}
	x.api.HistorySize = 8 // before the first request
	x.auth.next = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Query().Get("watch") != "true" && strings.HasSuffix(r.URL.Path, "/configmaps") {
			x.listed.Add(1)
		}
		x.gate.ServeHTTP(w, r)
	})
	x.gate.wrap = func(w http.ResponseWriter, r *http.Request) http.ResponseWriter {
		if c := x.held.Load(); c != nil {
			select {
			case <-*c:
			case <-r.Context().Done():
			}
		}
		if h := x.writesFrom.Load(); h != nil && r.URL.Query().Get("sendInitialEvents") == "" && r.URL.Query().Get("resourceVersion") == h.rv {
			return &heldWriter{ResponseWriter: w, r: r, hold: h.hold}
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

// Absorbing a 410 on a shared feed: two watch-lists hand off onto one feed (the first opens it with
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
	if v := x.absorbed(absorb.Absorbed); v != 1 {
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
		return promtest.ToFloat64(x.m.SharedFeeds) == 0 && x.h.parked.Len() == 1
	})
	again := []*client{watchAt(t, x.srv.URL, "resourceVersion="+rv(D), nil, true)}
	x.waitSubscribers(t, 1)
	if n := x.h.parked.Len(); n != 0 {
		t.Fatalf("%d states parked after a re-watch from %d opened a feed: want it adopted", n, D)
	}
	again = append(again, watchAt(t, x.srv.URL, "resourceVersion="+rv(D), nil, true))
	x.waitSubscribers(t, 2)
	x.outage(t, 1)
	// The re-watches from D hold the store at D: the list taken before they began.
	want := x.list(t)
	for i, c := range again {
		testutil.Eventually(t, 20*time.Second, fmt.Sprintf("re-watch %d to get the difference", i), func() bool {
			return x.absorbed(absorb.Absorbed) == 2 && len(c.events()) >= 2
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

// parkOwn runs a watch-list of token's own (private: a client with its own credentials does
// not hand off) that ends after a second, and returns the resourceVersion its state is parked
// at: the initial-events-end bookmark's, the last its client got.
func (x *gapFixture) parkOwn(t *testing.T, token string) uint64 {
	t.Helper()
	c := watchAt(t, x.srv.URL, watchList+"&timeoutSeconds=1", bearer(token), true)
	select {
	case <-c.ended:
	case <-time.After(20 * time.Second):
		t.Fatal("the watch-list did not end at its timeoutSeconds")
	}
	evs := c.events()
	var B uint64
	if len(evs) == 0 || !strings.HasPrefix(evs[len(evs)-1], "BOOKMARK initial-events-end ") {
		t.Fatalf("the watch-list got %v, want its initial events and bookmark", evs)
	}
	fmt.Sscan(strings.Fields(evs[len(evs)-1])[2], &B)
	testutil.Eventually(t, 10*time.Second, "the ended watch-list's state to be parked", func() bool { return x.h.parked.Len() == 1 })
	return B
}

// A state is only ever handed to a feed that goes upstream as the principal whose watch built
// it: bob's re-watch from where alice's ended opens a reviewed feed (as bob) that adopts
// nothing, and its 410 is bob's client's.
func TestShareStateNeverAcrossPrincipals(t *testing.T) {
	x := newGapFixture(t, Config{})
	x.write(t, "keep", 4, 10)
	B := x.parkOwn(t, "alice")
	bob := watchAt(t, x.srv.URL, "resourceVersion="+rv(B), bearer("bob"), true)
	x.waitSubscribers(t, 1)
	if n := x.h.parked.Len(); n != 1 {
		t.Fatalf("%d states parked after bob's feed opened: it adopted alice's", n)
	}
	x.outage(t, 0)
	bob.waitFor(t, "bob", 1)
	if got := bob.events(); got[len(got)-1] != "ERROR  " {
		t.Fatalf("bob got %v, want the 410 (an ERROR)", got)
	}
	if v := x.absorbed(absorb.NotComplete); v != 1 {
		t.Fatalf("gone_absorbed{not-complete} = %v, want 1", v)
	}
	if _, lists := x.lists(); lists != 0 {
		t.Fatalf("%d lists for a feed without a state", lists)
	}
}

// lists counts the lists that reached memapi through the gate (an absorb's).
func (x *gapFixture) lists() (reviews []string, lists int) {
	for _, ra := range x.auth.sent() {
		reviews = append(reviews, ra.Verb)
	}
	return reviews, int(x.listed.Load())
}

// A reviewed shared feed's absorb reaches only the subscribers that may list its scope too:
// alice's re-watch opens a feed as alice that adopts her parked state; bob (watch and list)
// gets the absorb with her, while dave (watch, no list) gets the 410 alone, as a direct watch of
// his would, and alice keeps her absorb. The list right is asked after joins are blocked.
func TestShareReviewedAbsorbReachesOnlySubscribersThatMayList(t *testing.T) {
	for _, other := range []string{"bob", "dave"} {
		t.Run(other, func(t *testing.T) {
			x := newGapFixture(t, Config{})
			x.write(t, "keep", 4, 10)
			B := x.parkOwn(t, "alice")
			clients := []*client{watchAt(t, x.srv.URL, "resourceVersion="+rv(B), bearer("alice"), true)}
			x.waitSubscribers(t, 1)
			if n := x.h.parked.Len(); n != 0 {
				t.Fatalf("%d states parked after alice's re-watch opened a feed: want hers adopted", n)
			}
			clients = append(clients, watchAt(t, x.srv.URL, "resourceVersion="+rv(B), bearer(other), true))
			x.waitSubscribers(t, 2)
			x.outage(t, 0)
			for i, c := range clients {
				testutil.Eventually(t, 20*time.Second, fmt.Sprintf("client %d to get the outcome", i), func() bool {
					evs := c.events()
					return len(evs) >= 2 || len(evs) == 1 && evs[0] == "ERROR  "
				})
				evs := c.events()
				gotErr := slices.Contains(evs, "ERROR  ")
				if wantErr := i == 1 && other == "dave"; gotErr != wantErr {
					t.Fatalf("client %d got %v, want the 410: %v", i, evs, wantErr)
				}
				if !gotErr && !slices.ContainsFunc(evs, func(e string) bool { return strings.HasPrefix(e, "DELETED keep-0 ") }) {
					t.Fatalf("client %d got %v: want keep-0 deleted", i, evs)
				}
			}
			wantDenied := map[string]float64{"bob": 0, "dave": 1}[other]
			if v, d := x.absorbed(absorb.Absorbed), x.absorbed(absorb.ListDenied); v != 1 || d != wantDenied {
				t.Fatalf("gone_absorbed{absorbed} = %v, {list-denied} = %v, want 1 and %v", v, d, wantDenied)
			}
			reviews, lists := x.lists()
			if !slices.Contains(reviews, "list") {
				t.Fatalf("reviews %v: want a list review before the absorb", reviews)
			}
			if lists != 1 {
				t.Fatalf("%d lists, want 1 (the absorb's)", lists)
			}
		})
	}
}

// A shared feed's state is bounded by the same budget as a private one's: the handed-off state
// fits, the feed's later events pass the budget, the state is dropped (counted, its bytes given
// back), and the 410 then reaches every subscriber, counted as over-budget.
func TestShareStateOverBudgetDropped(t *testing.T) {
	x := newGapFixture(t, Config{AbsorbStateBytes: 6 * (absorb.Overhead + 400)})
	x.write(t, "keep", 4, 10)
	clients := x.watchLists(t, 2, func(int) string { return watchList })
	if v := promtest.ToFloat64(x.m.AbsorbStatesDropped); v != 0 {
		t.Fatalf("the watch-list's state was dropped before the handoff (%v): the test's budget is too small", v)
	}
	x.write(t, "grow", 10, 10)
	testutil.Eventually(t, 10*time.Second, "the shared feed's state to be dropped", func() bool {
		return promtest.ToFloat64(x.m.AbsorbStatesDropped) == 1 && promtest.ToFloat64(x.m.AbsorbStateBytes) == 0
	})
	x.outage(t, 0)
	for i, c := range clients {
		testutil.Eventually(t, 20*time.Second, fmt.Sprintf("client %d to get the 410", i), func() bool {
			return slices.Contains(c.events(), "ERROR  ")
		})
	}
	if v := x.absorbed(absorb.OverBudget); v != 1 {
		t.Fatalf("gone_absorbed{over-budget} = %v, want 1", v)
	}
	if _, lists := x.lists(); lists != 0 {
		t.Fatalf("%d lists for a dropped state", lists)
	}
}

// A watch-list handed off ahead of its feed (its bookmark above what the feed delivered:
// member.skip) when the feed absorbs a 410 gets the difference too: the feed's DELETEDs at its
// own resourceVersion (never back from it, never skipped), the rest as every member; its store
// then equals a fresh list, as the other member's does.
func TestShareAbsorbReachesAHandoffStillSkipping(t *testing.T) {
	x := newGapFixture(t, Config{})
	r0 := x.write(t, "keep", 3, 10)
	hold := &heldFrom{rv: rv(r0), hold: make(chan struct{})}
	x.writesFrom.Store(hold)
	first := x.watchLists(t, 1, func(int) string { return watchList })
	x.write(t, "z", 1, 10)
	x.delete(t, "d", "z-0")
	clients := append(first, watchAt(t, x.srv.URL, watchList, nil, true))
	x.waitHandedOff(t, 2)
	if j := promtest.ToFloat64(x.m.SharedHandoffs.WithLabelValues(handoffJoined)); j != 1 {
		t.Fatalf("handoffs joined %v, want 1 (ahead of the held feed)", j)
	}
	skip := x.api.ResourceVersion()
	c := make(chan struct{})
	x.held.Store(&c)
	x.gate.breakAll()
	x.writesFrom.Store(nil)
	close(hold.hold)
	x.delete(t, "d", "keep-0")
	x.write(t, "new", 1, 10)
	for i := range 6 {
		name := fmt.Sprintf("brief-%d", i)
		if err := x.create("d", name); err != nil {
			t.Fatal(err)
		}
		x.delete(t, "d", name)
	}
	x.held.Store(nil)
	close(c)
	x.waitStores(t, "after the gap", clients...)
	if v := x.absorbed(absorb.Absorbed); v != 1 {
		t.Fatalf("gone_absorbed{absorbed} = %v, want 1", v)
	}
	if got := clients[1].events(); !slices.Contains(got, "DELETED keep-0 "+rv(skip)) {
		t.Fatalf("the skipping member got %v: want keep-0's DELETED at its own resourceVersion %d", got, skip)
	}
	if got := clients[0].events(); !slices.Contains(got, "DELETED keep-0 "+rv(r0)) {
		t.Fatalf("the other member got %v: want keep-0's DELETED at the feed's last resourceVersion %d", got, r0)
	}
}
