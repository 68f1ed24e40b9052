package watch

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/utils/clock"

	"github.com/watchsan/watchsan/internal/absorb"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/stream"
)

// kubectlAccept is kubectl get's Accept (v1.37): Table rows, else whole objects.
const kubectlAccept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"

// tableRow is a configmap's Table row as kube-apiserver sends it (includeObject=Metadata).
func tableRow(name, uid, rv string) string {
	return fmt.Sprintf(`{"cells":[%q,1,"1s"],"object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":%q,"namespace":"d","uid":%q,"resourceVersion":%q}}}`, name, name, uid, rv)
}

// tableEv is a Table watch event of one row; first: a stream's first, with its columns.
func tableEv(typ, name, uid, rv string, first bool) string {
	cols := "null"
	if first {
		cols = `[{"name":"Name","type":"string","format":"name","description":"Name","priority":0}]`
	}
	return fmt.Sprintf(`{"type":%q,"object":{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":%q},"columnDefinitions":%s,"rows":[%s]}}`+"\n", typ, rv, cols, tableRow(name, uid, rv))
}

// tableList is a Table list at rv of rows.
func tableList(rv string, rows ...string) string {
	return fmt.Sprintf(`{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":%q},"columnDefinitions":[{"name":"Name","type":"string","format":"name","description":"Name","priority":0}],"rows":[%s]}`, rv, strings.Join(rows, ","))
}

// A Table watch (kubectl get -w) from its own list's resourceVersion absorbs a 410: its list,
// Table rows read as they were sent, is its state; the absorb lists in the client's Accept
// (and includeObject), and the client gets the difference as Table events of one row, as the
// apiserver sends them after a stream's first event (columnDefinitions null), the deletes with
// the last row it got, keyed by each row's object.
func TestTableWatchAbsorbs(t *testing.T) {
	var mu sync.Mutex
	var listAccepts, listQueries []string
	watches := []func(w http.ResponseWriter, r *http.Request){
		events(tableEv("MODIFIED", "a", "ua", "14", true), gone410), // the client's watch from 13: one change, then 410
		hangAfter(tableEv("MODIFIED", "a", "ua", "22", true)),
	}
	nwatch := 0
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if r.URL.Query().Get("watch") != "true" {
			listAccepts, listQueries = append(listAccepts, r.Header.Get("Accept")), append(listQueries, r.URL.RawQuery)
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, tableList("21", tableRow("a", "ua", "14"), tableRow("c", "uc", "20"), tableRow("d", "ud2", "18"), tableRow("e", "ue", "16")))
			return
		}
		h := watches[min(nwatch, len(watches)-1)]
		nwatch++
		mu.Unlock()
		h(w, r)
	}}}
	f := newFixture(t, Config{}, up)
	// The client's list at 13, in Table rows.
	tableClientList(t, f, "/api/v1/namespaces/d/configmaps?limit=500&includeObject=Metadata", tableList("13",
		tableRow("a", "ua", "10"), tableRow("b", "ub", "11"), tableRow("c", "uc", "12"), tableRow("d", "ud", "13")))
	if v := promtest.ToFloat64(f.m.AbsorbClientLists.WithLabelValues(absorb.ClientListParked)); v != 1 {
		t.Fatalf("client_lists{parked} = %v, want 1 (the Table list)", v)
	}
	got := watchTable(t, f, "includeObject=Metadata&resourceVersion=13&allowWatchBookmarks=true", 8)
	want := "MODIFIED a/ua 14 cols, DELETED b/ub 14, DELETED d/ud 14, ADDED e/ue 16, ADDED d/ud2 18, MODIFIED c/uc 20, BOOKMARK 21, MODIFIED a/ua 22 cols"
	if s := strings.Join(got, ", "); s != want {
		t.Fatalf("client saw [%s]\nwant       [%s]", s, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(listAccepts) != 1 || listAccepts[0] != kubectlAccept || !strings.Contains(listQueries[0], "includeObject=Metadata") {
		t.Fatalf("the absorb listed with Accept %q, query %q: want the client's Accept and includeObject", listAccepts, listQueries)
	}
	if v := promtest.ToFloat64(f.m.GoneAbsorbed.WithLabelValues(absorb.Absorbed)); v != 1 {
		t.Fatalf("gone_absorbed{absorbed} = %v, want 1", v)
	}
}

// tableClientList passes the Table list body through f's TeeList as a client's list in
// kubectl's Accept.
func tableClientList(t *testing.T, f *fixture, pathQuery, body string) {
	t.Helper()
	rec := f.clientListRaw(t, pathQuery, kubectlAccept, func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, body)
	})
	if rec.Body.String() != body {
		t.Fatalf("the client got %q", rec.Body)
	}
}

// watchTable reads a Table watch of f in kubectl's Accept until n events: each as "TYPE
// name/uid rv", " cols" when it carries columnDefinitions, bookmarks as "BOOKMARK rv".
func watchTable(t *testing.T, f *fixture, query string, n int) []string {
	t.Helper()
	resp := f.openWatch(t, query, kubectlAccept)
	defer resp.Body.Close()
	var out []string
	dec := json.NewDecoder(resp.Body)
	for len(out) < n {
		var ev struct {
			Type   string
			Object struct {
				Kind     string
				Code     int
				Metadata struct{ ResourceVersion string }
				Columns  json.RawMessage `json:"columnDefinitions"`
				Rows     []struct {
					Object struct {
						Metadata struct{ Name, UID, ResourceVersion string }
					}
				}
			}
		}
		if err := dec.Decode(&ev); err != nil {
			t.Logf("stream ended: %v", err)
			break
		}
		o := ev.Object
		switch {
		case ev.Type == "ERROR":
			out = append(out, fmt.Sprintf("ERROR %d", o.Code))
			continue
		case ev.Type == "BOOKMARK":
			out = append(out, "BOOKMARK "+o.Metadata.ResourceVersion)
			continue
		case o.Kind != "Table" || len(o.Rows) != 1:
			t.Fatalf("a %s event of %s with %d rows: want a Table of one row", ev.Type, o.Kind, len(o.Rows))
		}
		m := o.Rows[0].Object.Metadata
		s := fmt.Sprintf("%s %s/%s %s", ev.Type, m.Name, m.UID, o.Metadata.ResourceVersion)
		if string(o.Columns) != "null" {
			s += " cols"
		}
		out = append(out, s)
	}
	return out
}

// /debug/feeds shows a feed's format as its watch asked it: kubectl's Table rows are
// "json;as=Table", not "json" (what the apiserver's Content-Type says).
func TestFeedsListingShowsTheFormatAsAsked(t *testing.T) {
	h := &Handler{clk: clock.RealClock{}}
	for accept, want := range map[string]string{kubectlAccept: "json;as=Table", "application/json": "json"} {
		r := httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/d/configmaps?watch=true", nil)
		r.Header.Set("Accept", accept)
		info := reqinfo.Parse(r)
		sf := &sharedFeed{desc: h.describe(r.URL.Query(), accept, &info)}
		sf.snap.Store(&feedSnapshot{format: stream.JSON})
		if got := sf.info(time.Now()).Format; got != want {
			t.Errorf("a watch with Accept %q is listed as %q, want %q", accept, got, want)
		}
	}
}
