package watch

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watchsan/watchsan/internal/absorb"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/testutil"
)

// gapUpstream is an apiserver for the absorb tests: watch i is served by watches[i] (the last
// repeats), and every list by the objects of list, two items a page whatever the limit (an
// apiserver may return fewer than asked, with a continue token), at resourceVersion listRV.
// listStatus, when not 0, answers every list with it instead. Its watches and lists are on
// the wire in format (zero: JSON; absorb_proto_test.go), its lists in listFormat when set.
type gapUpstream struct {
	format, listFormat stream.Format
	mu                 sync.Mutex
	watches            []func(w http.ResponseWriter, r *http.Request)
	nwatch             int
	watchRVs           []string
	list               []string // items' JSON, built-in style: no kind, no apiVersion
	listRV             string
	listStatus         int
	lists              []string // each list request's query
	// exact, exactRV: the list at resourceVersionMatch=Exact, at exactRV; nil: 410 (compacted).
	exact   []string
	exactRV string
}

func (g *gapUpstream) step(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	g.mu.Lock()
	if q.Get("watch") != "true" {
		g.lists = append(g.lists, r.URL.RawQuery)
		items, status, rv := g.list, g.listStatus, g.listRV
		prefix := "page-"
		if q.Get("resourceVersionMatch") == "Exact" || strings.HasPrefix(q.Get("continue"), "exact-") {
			items, rv, status, prefix = g.exact, g.exactRV, 0, "exact-page-"
			if items == nil {
				status = http.StatusGone
			}
		}
		g.mu.Unlock()
		if status != 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","code":`+fmt.Sprint(status)+`}`)
			return
		}
		page := 0
		if c := q.Get("continue"); c != "" {
			fmt.Sscanf(strings.TrimPrefix(c, "exact-"), "page-%d", &page)
		}
		end := min(len(items), 2*page+2)
		cont := ""
		if end < len(items) {
			cont = fmt.Sprintf("%s%d", prefix, page+1)
		}
		lf := g.listFormat
		if lf == 0 {
			lf = g.format
		}
		writeList(w, lf, rv, cont, items[min(2*page, len(items)):end])
		return
	}
	i := g.nwatch
	g.nwatch++
	g.watchRVs = append(g.watchRVs, q.Get("resourceVersion"))
	h := g.watches[min(i, len(g.watches)-1)]
	g.mu.Unlock()
	if g.format == stream.Protobuf || g.format == stream.CBOR {
		w = &wireWatchWriter{ResponseWriter: w, format: g.format}
	}
	h(w, r)
}

func (g *gapUpstream) snapshot() (watchRVs, lists []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.watchRVs...), append([]string(nil), g.lists...)
}

// cmU is a watch event of the configmap name with uid uid at rv; cmItem is it as a list item.
func cmU(typ, name, uid, rv string) string {
	return fmt.Sprintf(`{"type":%q,"object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":%q,"namespace":"d","uid":%q,"resourceVersion":%q},"data":{"v":%q}}}`+"\n", typ, name, uid, rv, rv)
}

func cmItem(name, uid, rv string) string {
	return fmt.Sprintf(`{"metadata":{"name":%q,"namespace":"d","uid":%q,"resourceVersion":%q},"data":{"v":%q}}`, name, uid, rv, rv)
}

func initialEnd(rv string) string {
	return `{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"` + rv + `","annotations":{"k8s.io/initial-events-end":"true"}}}}` + "\n"
}

const gone410 = `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old resource version: 14 (15)","reason":"Expired","code":410}}` + "\n"

// seenEvent is one event a test client read, with what the absorb tests compare.
type seenEvent struct {
	Type, Name, UID, RV, Kind, Data string
	Code                            int32
}

func (e seenEvent) String() string {
	if e.Type == "ERROR" {
		return fmt.Sprintf("ERROR %d", e.Code)
	}
	if e.Type == "BOOKMARK" {
		return "BOOKMARK " + e.RV
	}
	return fmt.Sprintf("%s %s/%s %s", e.Type, e.Name, e.UID, e.RV)
}

// watchUntil reads the watch query until it has n events or the stream ends, and returns them.
func (f *fixture) watchUntil(t *testing.T, query string, n int) []seenEvent {
	t.Helper()
	resp := f.openWatch(t, query, "application/json")
	defer resp.Body.Close()
	var out []seenEvent
	dec := json.NewDecoder(resp.Body)
	for len(out) < n {
		var ev struct {
			Type   string
			Object struct {
				Kind     string
				Code     int32
				Metadata struct{ Name, UID, ResourceVersion string }
				Data     struct{ V string }
			}
		}
		if err := dec.Decode(&ev); err != nil {
			if err != io.EOF {
				t.Logf("stream ended: %v", err)
			}
			break
		}
		o := ev.Object
		out = append(out, seenEvent{ev.Type, o.Metadata.Name, o.Metadata.UID, o.Metadata.ResourceVersion, o.Kind, o.Data.V, o.Code})
	}
	return out
}

func joinEvents(es []seenEvent) string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.String()
	}
	return strings.Join(s, ", ")
}

// hangAfter sends evs and keeps the watch open until the client goes.
func hangAfter(evs ...string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		send(w, evs...)
		<-r.Context().Done()
	}
}

// The gap every absorb test's watch resumes across: at R = 14 the watch had a, b, c, d
// (initial state) and a's change; in the gap b was deleted, c modified, d deleted and
// created again (a new uid), e created, and f created and deleted (in no list, in no event).
func gapWatches(resume func(w http.ResponseWriter, r *http.Request)) *gapUpstream {
	return &gapUpstream{
		watches: []func(w http.ResponseWriter, r *http.Request){
			events(cmU("ADDED", "a", "ua", "10"), cmU("ADDED", "b", "ub", "11"), cmU("ADDED", "c", "uc", "12"), cmU("ADDED", "d", "ud", "13"),
				initialEnd("13"), cmU("MODIFIED", "a", "ua", "14")),
			resume,
			hangAfter(cmU("MODIFIED", "a", "ua", "22")),
		},
		list:   []string{cmItem("a", "ua", "14"), cmItem("c", "uc", "20"), cmItem("d", "ud2", "18"), cmItem("e", "ue", "16")},
		listRV: "21",
	}
}

const gapInitial = "ADDED a/ua 10, ADDED b/ub 11, ADDED c/uc 12, ADDED d/ud 13, BOOKMARK 13, MODIFIED a/ua 14"

// The difference, as the client must get it: the deletes (b gone, d's old uid) at exactly R,
// then the adds and changes in resourceVersion order, then a bookmark at the list's; nothing
// for a (unchanged) or f (created and deleted in the gap); then the watch from 21 goes on.
const gapAbsorbed = gapInitial + ", DELETED b/ub 14, DELETED d/ud 14, ADDED e/ue 16, ADDED d/ud2 18, MODIFIED c/uc 20, BOOKMARK 21, MODIFIED a/ua 22"

func testAbsorbed(t *testing.T, format stream.Format, resume func(w http.ResponseWriter, r *http.Request)) {
	g := gapWatches(resume)
	g.format = format
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
	f := newFixture(t, Config{}, up)
	got := f.watchUntilIn(t, format, "resourceVersion=0&allowWatchBookmarks=true", 13)
	if s := joinEvents(got); s != gapAbsorbed {
		t.Fatalf("client saw [%s]\nwant       [%s]", s, gapAbsorbed)
	}
	for _, e := range got {
		if e.Kind != "ConfigMap" {
			t.Fatalf("event %v of kind %q: want every object's and bookmark's kind (a list's items have none)", e, e.Kind)
		}
		if last := map[string]string{"b": "11", "d": "13"}[e.Name]; e.Type == "DELETED" && e.Data != last {
			t.Fatalf("%v carries data %q, want the last known object's (%q)", e, e.Data, last)
		}
	}
	rvs, lists := g.snapshot()
	if len(rvs) < 3 || rvs[1] != "14" || rvs[2] != "21" {
		t.Fatalf("watches from %q, want 0 (or none), 14, then 21 (the list's resourceVersion)", rvs)
	}
	if len(lists) != 2 || !strings.Contains(lists[0], "limit=500") || strings.Contains(lists[0], "continue") ||
		!strings.Contains(lists[1], "continue=page-1") || strings.Contains(lists[0], "resourceVersion") {
		t.Fatalf("list requests %q: want 2 pages, limit=500, the second with the first's continue token, no resourceVersion (a consistent list)", lists)
	}
	m := f.m
	if v := promtest.ToFloat64(m.GoneAbsorbed.WithLabelValues(absorb.Absorbed)); v != 1 {
		t.Fatalf("gone_absorbed{absorbed} = %v, want 1", v)
	}
	if v := promtest.ToFloat64(m.RelistsForced); v != 0 {
		t.Fatalf("relists forced = %v, want 0", v)
	}
	for typ, want := range map[string]float64{"DELETED": 2, "ADDED": 2, "MODIFIED": 1} {
		if v := promtest.ToFloat64(m.AbsorbEvents.WithLabelValues(typ)); v != want {
			t.Fatalf("absorb_events{%s} = %v, want %v", typ, v, want)
		}
	}
	if v := promtest.ToFloat64(m.WatchRegressed.WithLabelValues("configmaps")); v != 0 {
		t.Fatalf("the absorb's events counted as a regression of the stream (%v)", v)
	}
}

// A feed with a complete state (it began with the initial state), answered ERROR 410 at its
// resume, lists its scope and sends the client the difference only, then watches on.
func TestGoneEventAbsorbedWithTheDifference(t *testing.T) {
	forFormats(t, func(t *testing.T, format stream.Format) { testAbsorbed(t, format, events(gone410)) })
}

// The same when the resume is answered HTTP 410.
func TestGoneStatusAbsorbedWithTheDifference(t *testing.T) {
	forFormats(t, func(t *testing.T, format stream.Format) {
		testAbsorbed(t, format, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(410)
			io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old resource version: 14 (15)","reason":"Expired","code":410}`)
		})
	})
}

// A watch that began at a client's resourceVersion holds no complete state: its 410 is the
// client's, as before, and nothing is listed.
func TestGoneNotAbsorbedWithoutCompleteState(t *testing.T) {
	g := &gapUpstream{watches: []func(w http.ResponseWriter, r *http.Request){
		events(cmU("MODIFIED", "a", "ua", "14")), events(gone410)}, listRV: "21"}
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
	f := newFixture(t, Config{}, up)
	got := f.watchUntil(t, "resourceVersion=5", 10)
	if s, want := joinEvents(got), "MODIFIED a/ua 14, ERROR 410"; s != want {
		t.Fatalf("client saw [%s], want [%s]", s, want)
	}
	if _, lists := g.snapshot(); len(lists) != 0 {
		t.Fatalf("listed %q without a complete state", lists)
	}
	if v := promtest.ToFloat64(f.m.GoneAbsorbed.WithLabelValues(absorb.NotComplete)); v != 1 {
		t.Fatalf("gone_absorbed{not-complete} = %v, want 1", v)
	}
	if v := promtest.ToFloat64(f.m.RelistsForced); v != 1 {
		t.Fatalf("relists forced = %v, want 1", v)
	}
}

// Switched off, a complete feed passes the 410 too.
func TestGoneNotAbsorbedWhenDisabled(t *testing.T) {
	g := gapWatches(events(gone410))
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
	f := newFixture(t, Config{DisableAbsorb: true}, up)
	got := f.watchUntil(t, "resourceVersion=0&allowWatchBookmarks=true", 20)
	if s, want := joinEvents(got), gapInitial+", ERROR 410"; s != want {
		t.Fatalf("client saw [%s], want [%s]", s, want)
	}
	if _, lists := g.snapshot(); len(lists) != 0 {
		t.Fatalf("listed %q with absorbing off", lists)
	}
}

// A feed whose state passes its budget drops it (counted, its bytes given back) and passes the
// 410; the budget is real: what the states hold never passes it.
func TestGoneOverBudgetPassesThe410(t *testing.T) {
	forFormats(t, testGoneOverBudgetPassesThe410)
}

func testGoneOverBudgetPassesThe410(t *testing.T, format stream.Format) {
	g := gapWatches(events(gone410))
	g.format = format
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
	// Room for three objects (each its frame in the format, key and uid, and the overhead).
	f := newFixture(t, Config{AbsorbStateBytes: 3 * int64(absorb.Overhead+frameLen(t, format)+20)}, up)
	got := f.watchUntilIn(t, format, "resourceVersion=0&allowWatchBookmarks=true", 20)
	if s, want := joinEvents(got), gapInitial+", ERROR 410"; s != want {
		t.Fatalf("client saw [%s], want [%s]", s, want)
	}
	if v := promtest.ToFloat64(f.m.GoneAbsorbed.WithLabelValues(absorb.OverBudget)); v != 1 {
		t.Fatalf("gone_absorbed{over-budget} = %v, want 1", v)
	}
	if v := promtest.ToFloat64(f.m.AbsorbStatesDropped); v != 1 {
		t.Fatalf("absorb_states_dropped = %v, want 1", v)
	}
	if !testutil.Until(5*time.Second, func() bool { return promtest.ToFloat64(f.m.AbsorbStateBytes) == 0 }) {
		t.Fatalf("state bytes held after the watch ended: %v", promtest.ToFloat64(f.m.AbsorbStateBytes))
	}
	if _, lists := g.snapshot(); len(lists) != 0 {
		t.Fatalf("listed %q over budget", lists)
	}
}

// A list that fails is retried with backoff within the resume timeout, then the 410 is the
// client's: a bounded number of list requests, on the fake clock.
func TestGoneListFailingBacksOffThenPassesThe410(t *testing.T) {
	g := gapWatches(events(gone410))
	g.listStatus = http.StatusServiceUnavailable
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
	clk := newStepClock()
	f := newFixtureClock(t, Config{ResumeTimeout: 5 * time.Second}, up, clk)
	waits := clk.stepTimers(t)
	got := f.watchUntil(t, "resourceVersion=0&allowWatchBookmarks=true", 20)
	if s, want := joinEvents(got), gapInitial+", ERROR 410"; s != want {
		t.Fatalf("client saw [%s], want [%s]", s, want)
	}
	_, lists := g.snapshot()
	if len(lists) < 2 || len(lists) > 8 {
		t.Fatalf("%d list requests (waits %v): want a few retries with backoff within the 5 s resume timeout", len(lists), waits())
	}
	if len(waits()) < len(lists)-1 {
		t.Fatalf("%d list requests, %d waits between them: not backed off", len(lists), len(waits()))
	}
	if v := promtest.ToFloat64(f.m.GoneAbsorbed.WithLabelValues(absorb.ListFailed)); v != 1 {
		t.Fatalf("gone_absorbed{list-failed} = %v, want 1", v)
	}
	if v := promtest.ToFloat64(f.m.RelistsForced); v != 1 {
		t.Fatalf("relists forced = %v, want 1", v)
	}
}

// A watch-list (sendInitialEvents=true) is complete at its initial-events-end bookmark too.
func TestGoneAbsorbedForAWatchList(t *testing.T) {
	g := gapWatches(events(gone410))
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
	f := newFixture(t, Config{}, up)
	got := f.watchUntil(t, "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", 13)
	if s := joinEvents(got); s != gapAbsorbed {
		t.Fatalf("client saw [%s]\nwant       [%s]", s, gapAbsorbed)
	}
}

// A client's re-watch from the last resourceVersion its ended watch delivered adopts that
// watch's complete state: its 410 (here on its first attempt, as a reflector's re-watch after
// its timeoutSeconds meets a restarted apiserver) is absorbed too. A re-watch from another
// resourceVersion adopts nothing.
func TestReWatchAdoptsTheEndedWatchsState(t *testing.T) {
	forFormats(t, testReWatchAdoptsTheEndedWatchsState)
}

func testReWatchAdoptsTheEndedWatchsState(t *testing.T, format stream.Format) {
	g := gapWatches(events(gone410))
	g.format = format
	g.watches[0] = hangAfter(cmU("ADDED", "a", "ua", "10"), cmU("ADDED", "b", "ub", "11"), cmU("ADDED", "c", "uc", "12"),
		cmU("ADDED", "d", "ud", "13"), initialEnd("13"), cmU("MODIFIED", "a", "ua", "14"))
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
	f := newFixture(t, Config{}, up)
	first := f.watchUntilIn(t, format, "resourceVersion=0&allowWatchBookmarks=true", 6)
	if s := joinEvents(first); s != gapInitial {
		t.Fatalf("first watch saw [%s], want [%s]", s, gapInitial)
	}
	if !testutil.Until(5*time.Second, func() bool { return f.h.parked.Len() == 1 }) {
		t.Fatalf("%d states parked after the first watch ended, want 1", f.h.parked.Len())
	}
	got := f.watchUntilIn(t, format, "resourceVersion=14&allowWatchBookmarks=true", 7)
	want := strings.TrimPrefix(gapAbsorbed, gapInitial+", ")
	if s := joinEvents(got); s != want {
		t.Fatalf("the re-watch saw [%s]\nwant         [%s]", s, want)
	}
	// (The re-watch's own state may be parked by now, at 22, once its client went.)
	if f.h.parked.At("14") {
		t.Fatalf("the state is still parked after its re-watch adopted it")
	}
	if v := promtest.ToFloat64(f.m.GoneAbsorbed.WithLabelValues(absorb.Absorbed)); v != 1 {
		t.Fatalf("gone_absorbed{absorbed} = %v, want 1", v)
	}
}

// A state parked and not adopted is freed after the park time, its bytes given back; a
// re-watch from another resourceVersion does not adopt it.
func TestParkedStateExpires(t *testing.T) {
	g := gapWatches(events(gone410))
	g.watches[0] = hangAfter(cmU("ADDED", "a", "ua", "10"), initialEnd("13"))
	g.watches[1] = events(gone410)
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
	clk := newStepClock()
	f := newFixtureClock(t, Config{}, up, clk)
	f.watchUntil(t, "resourceVersion=0&allowWatchBookmarks=true", 2)
	if !testutil.Until(5*time.Second, func() bool { return f.h.parked.Len() == 1 }) {
		t.Fatalf("%d states parked, want 1", f.h.parked.Len())
	}
	if got := joinEvents(f.watchUntil(t, "resourceVersion=12&allowWatchBookmarks=true", 5)); got != "ERROR 410" {
		t.Fatalf("a re-watch from another resourceVersion saw [%s], want [ERROR 410]", got)
	}
	if f.h.parked.Len() != 1 || promtest.ToFloat64(f.m.AbsorbStateBytes) == 0 {
		t.Fatalf("a re-watch from another resourceVersion took the parked state")
	}
	clk.Step(DefaultAbsorbParkTime)
	if !testutil.Until(5*time.Second, func() bool {
		return f.h.parked.Len() == 0 && promtest.ToFloat64(f.m.AbsorbStateBytes) == 0
	}) {
		t.Fatalf("after the park time: %d parked, %v bytes held; want none", f.h.parked.Len(), promtest.ToFloat64(f.m.AbsorbStateBytes))
	}
}

// absorbTwice runs the gap watch whose resume from 14 is answered 410, then the streams between
// (from the list's 21), then a second 410 from 21, absorbed by a second list of two pages: it
// checks what the client saw and the requests, and returns the fake clock's waits.
func absorbTwice(t *testing.T, clk *stepClock, between ...func(http.ResponseWriter, *http.Request)) []time.Duration {
	t.Helper()
	g := gapWatches(events(gone410))
	g.watches = append(append(g.watches[:2:2], between...), events(strings.Replace(gone410, "14 (15)", "21 (22)", 1)), g.watches[2])
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
	f := newFixtureClock(t, Config{}, up, clk)
	waits := clk.stepTimers(t)
	got := f.watchUntil(t, "resourceVersion=0&allowWatchBookmarks=true", 14)
	want := strings.Replace(gapAbsorbed, "BOOKMARK 21", "BOOKMARK 21, BOOKMARK 21", 1)
	if s := joinEvents(got); s != want {
		t.Fatalf("client saw [%s]\nwant       [%s]", s, want)
	}
	rvs, lists := g.snapshot()
	if n := 4 + len(between); len(lists) != 4 || len(rvs) < n || rvs[1] != "14" || slices.ContainsFunc(rvs[2:n], func(rv string) bool { return rv != "21" }) {
		t.Fatalf("lists %q, watches from %q: want two lists of two pages, watches from 14 then %d from 21", lists, rvs, n-2)
	}
	if v := promtest.ToFloat64(f.m.GoneAbsorbed.WithLabelValues(absorb.Absorbed)); v != 2 {
		t.Fatalf("gone_absorbed{absorbed} = %v, want 2", v)
	}
	return waits()
}

// A quiet watch whose upstream restarts again is absorbed again, the second list after a wait
// of the absorb backoff (no upstream event came between the two): a run of absorbs is paced.
func TestGoneAbsorbedAgainAfterABackoff(t *testing.T) {
	if w := absorbTwice(t, newStepClock()); len(w) != 1 || w[0] < 600*time.Millisecond || w[0] > time.Second {
		t.Fatalf("waits %v: want one of the absorb backoff's first step (~800ms) before the second list", w)
	}
}

// A quiet watch (no events, no bookmarks: a resource without the watch cache) whose resumed
// stream lived the brake's old age before it ended, then was answered 410 again, is absorbed
// again at once: the stream that lived is the upstream's progress, so the second 410 starts a
// run of its own. Independent 410s a quiet watch meets never add up to the run's bound (a soak
// relisted three quiet watches after eight compactions 8 to 55 s apart, with no event between).
func TestGoneAbsorbedAtOnceAfterAStreamThatLived(t *testing.T) {
	clk := newStepClock()
	lived := func(w http.ResponseWriter, r *http.Request) { // from 21: open and quiet past brakeOld, then ends
		armed := clk.afterFuncs(DefaultStallTimeout)
		send(w)
		// The feed's watchdog on this stream is armed once the stream is the feed's own.
		if !testutil.Until(10*time.Second, func() bool { return clk.afterFuncs(DefaultStallTimeout) > armed }) {
			t.Error("the watchdog on the quiet stream was not armed within 10s")
			return
		}
		clk.Step(brakeOld + time.Second)
	}
	// One wait: the resume after the quiet stream, which delivered nothing (the resume
	// backoff's first step). None before the second list: it is a run of its own.
	if w := absorbTwice(t, clk, lived); len(w) != 1 {
		t.Fatalf("waits %v: want one (the resume backoff after the quiet stream), none before the second list", w)
	}
}

// With --watch-absorb-complete-by-list, a watch from a client's resourceVersion (its first
// after its own list) lists the scope at exactly it before its first event: its state is then
// complete, and a 410, here on its first attempt, is absorbed as for a watch-list.
func TestCompletingListMakesAWatchFromAClientRVAbsorb(t *testing.T) {
	forFormats(t, testCompletingListMakesAWatchFromAClientRVAbsorb)
}

func testCompletingListMakesAWatchFromAClientRVAbsorb(t *testing.T, format stream.Format) {
	g := gapWatches(events(gone410))
	g.format = format
	g.watches = g.watches[1:] // the client's watch from 14: answered 410, then from 21
	g.exact, g.exactRV = []string{cmItem("a", "ua", "14"), cmItem("b", "ub", "11"), cmItem("c", "uc", "12"), cmItem("d", "ud", "13")}, "14"
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
	f := newFixture(t, Config{AbsorbCompleteByList: true}, up)
	got := f.watchUntilIn(t, format, "resourceVersion=14&allowWatchBookmarks=true", 7)
	want := strings.TrimPrefix(gapAbsorbed, gapInitial+", ")
	if s := joinEvents(got); s != want {
		t.Fatalf("client saw [%s]\nwant       [%s]", s, want)
	}
	_, lists := g.snapshot()
	if len(lists) != 4 || !strings.Contains(lists[0], "resourceVersion=14") || !strings.Contains(lists[0], "resourceVersionMatch=Exact") ||
		!strings.Contains(lists[1], "continue=exact-page-1") || strings.Contains(lists[1], "resourceVersion=") {
		t.Fatalf("lists %q: want the exact list at 14 in two pages (the second by its continue token alone), then the absorb's two", lists)
	}
	if v := promtest.ToFloat64(f.m.AbsorbCompletingLists.WithLabelValues(absorb.CompleteDone)); v != 1 {
		t.Fatalf("completing_lists{complete} = %v, want 1", v)
	}
}

// A completing list whose resourceVersion is compacted (410) leaves the watch without state:
// its 410 is the client's, as before.
func TestCompletingListGoneLeavesTheWatchIncomplete(t *testing.T) {
	g := gapWatches(events(gone410))
	g.watches = g.watches[1:]
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
	f := newFixture(t, Config{AbsorbCompleteByList: true}, up)
	if s, want := joinEvents(f.watchUntil(t, "resourceVersion=14&allowWatchBookmarks=true", 7)), "ERROR 410"; s != want {
		t.Fatalf("client saw [%s], want [%s]", s, want)
	}
	if v := promtest.ToFloat64(f.m.AbsorbCompletingLists.WithLabelValues(absorb.CompleteGone)); v != 1 {
		t.Fatalf("completing_lists{gone} = %v, want 1", v)
	}
	if v := promtest.ToFloat64(f.m.GoneAbsorbed.WithLabelValues(absorb.NotComplete)); v != 1 {
		t.Fatalf("gone_absorbed{not-complete} = %v, want 1", v)
	}
}

// frameLen is the length of a configmap's watch event frame of the fixtures in format.
func frameLen(t *testing.T, format stream.Format) int {
	t.Helper()
	b := []byte(cmU("ADDED", "a", "ua", "10"))
	if format != stream.JSON {
		var err error
		if b, err = wireFrames(format, b); err != nil {
			t.Fatal(err)
		}
	}
	return len(b)
}

// A list answered in another format than the feed's (a protobuf watch answered in protobuf,
// its list in JSON) is a failed list: the client gets the 410, as without absorbing.
func TestGoneListInAnotherFormatPassesThe410(t *testing.T) {
	forFormats(t, func(t *testing.T, format stream.Format) {
		g := gapWatches(events(gone410))
		g.format, g.listFormat = format, stream.Protobuf
		if format == stream.Protobuf {
			g.listFormat = stream.JSON
		}
		up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
		f := newFixture(t, Config{}, up)
		f.requireListedThenGone(t, g, format, absorb.ListFailed)
	})
}

// requireListedThenGone watches g's gap in format and requires that the feed listed, and its
// client got the 410 after the initial events, counted as outcome and as a forced relist.
func (f *fixture) requireListedThenGone(t *testing.T, g *gapUpstream, format stream.Format, outcome string) {
	t.Helper()
	got := f.watchUntilIn(t, format, "resourceVersion=0&allowWatchBookmarks=true", 20)
	if s, want := joinEvents(got), gapInitial+", ERROR 410"; s != want {
		t.Fatalf("client saw [%s], want [%s]", s, want)
	}
	if _, lists := g.snapshot(); len(lists) == 0 {
		t.Fatalf("no list asked")
	}
	if v := promtest.ToFloat64(f.m.GoneAbsorbed.WithLabelValues(outcome)); v != 1 {
		t.Fatalf("gone_absorbed{%s} = %v, want 1", outcome, v)
	}
	if v := promtest.ToFloat64(f.m.RelistsForced); v != 1 {
		t.Fatalf("relists forced = %v, want 1", v)
	}
}

// A list larger than the feed's budget, its state within it, fails the absorb (counted
// over-budget, what it read given back): the client gets the 410.
func TestGoneListOverBudgetPassesThe410(t *testing.T) {
	forFormats(t, func(t *testing.T, format stream.Format) {
		g := gapWatches(events(gone410))
		g.format = format
		for i := range 20 {
			g.list = append(g.list, cmItem(fmt.Sprint("x", i), fmt.Sprint("ux", i), "17"))
		}
		up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
		// Room for the state's four objects and two more; the list has 24.
		f := newFixture(t, Config{AbsorbStateBytes: 6 * int64(absorb.Overhead+frameLen(t, format)+10)}, up)
		f.requireListedThenGone(t, g, format, absorb.OverBudget) // the list, not the state, passed the budget
		// The ended watch's state is parked (its client may re-watch from 14); the list's
		// bytes, at least its items' overhead, are given back.
		if !testutil.Until(5*time.Second, func() bool { return f.h.parked.Len() == 1 }) {
			t.Fatalf("%d states parked after the watch ended, want 1", f.h.parked.Len())
		}
		if held := promtest.ToFloat64(f.m.AbsorbStateBytes); held >= 24*absorb.Overhead {
			t.Fatalf("%v bytes held after the list failed: the list's not given back", held)
		}
	})
}
