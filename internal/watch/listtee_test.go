package watch

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watchsan/watchsan/internal/absorb"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// clientList passes a client's list, answered in format at rv with items (cont: its continue
// token), through f's TeeList as the server's routes do: path and query as sent, Accept as
// watchUntilIn's for format. It returns the recorded response.
func (f *fixture) clientList(t *testing.T, format stream.Format, pathQuery, accept, rv, cont string, items []string) *httptest.ResponseRecorder {
	t.Helper()
	if accept == "" {
		accept = map[stream.Format]string{stream.JSON: "application/json", stream.Protobuf: "application/vnd.kubernetes.protobuf, application/json", stream.CBOR: "application/cbor, application/json"}[format]
	}
	return f.clientListRaw(t, pathQuery, accept, func(w http.ResponseWriter) { writeList(w, format, rv, cont, items) })
}

// clientListRaw passes a client's list request with accept through f's TeeList, answered by
// write.
func (f *fixture) clientListRaw(t *testing.T, pathQuery, accept string, write func(w http.ResponseWriter)) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, pathQuery, nil)
	r.Header.Set("Accept", accept)
	info := reqinfo.Parse(r)
	rec := httptest.NewRecorder()
	w, done := f.h.TeeList(rec, r, &info, upstream.Credentials{})
	write(w)
	done(true)
	return rec
}

// The client's list at 14, as in the completing list's test: what it holds when its watch from
// 14 begins.
var clientListAt14 = []string{cmItem("a", "ua", "14"), cmItem("b", "ub", "11"), cmItem("c", "uc", "12"), cmItem("d", "ud", "13")}

// A client that lists (resourceVersion unset, through watchsan) and then watches from the list's
// resourceVersion gets a 410 at that watch's resume absorbed: its own list, read as it was
// sent, is the state its watch adopts, and the difference it gets is the one a watch that
// began with the initial state would get. Also for a watch by path (/watch/), which is the
// same scope.
func TestClientListMakesItsWatchAbsorb(t *testing.T) {
	forFormats(t, func(t *testing.T, format stream.Format) {
		g := gapWatches(events(gone410))
		g.format = format
		g.watches = g.watches[1:] // the client's watch from 14: answered 410, then from 21
		up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
		f := newFixture(t, Config{}, up)
		rec := f.clientList(t, format, "/api/v1/namespaces/d/configmaps?limit=500", "", "14", "", clientListAt14)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `ub`) {
			t.Fatalf("the client got %d %q: want its list as it was written", rec.Code, rec.Body)
		}
		if v := promtest.ToFloat64(f.m.AbsorbClientLists.WithLabelValues(absorb.ClientListParked)); v != 1 || !f.h.parked.At("14") {
			t.Fatalf("client_lists{parked} = %v, parked at 14: %v; want 1 and true", v, f.h.parked.At("14"))
		}
		got := f.watchUntilIn(t, format, "resourceVersion=14&allowWatchBookmarks=true", 7)
		want := strings.TrimPrefix(gapAbsorbed, gapInitial+", ")
		if s := joinEvents(got); s != want {
			t.Fatalf("client saw [%s]\nwant       [%s]", s, want)
		}
		if v := promtest.ToFloat64(f.m.GoneAbsorbed.WithLabelValues(absorb.Absorbed)); v != 1 {
			t.Fatalf("gone_absorbed{absorbed} = %v, want 1", v)
		}
	})
}

// The list is kept under exactly the key its watch looks up: the same path in list form, the
// same parameters but the list's and watch's own (limit, resourceVersion, watch, timeouts), the
// same Accept and principal. A watch of another scope (a selector the list had not), in another
// Accept, or from another resourceVersion adopts nothing, and its 410 is its client's.
func TestClientListKeyedAsItsWatch(t *testing.T) {
	r := func(target, accept string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, target, nil)
		r.Header.Set("Accept", accept)
		return r
	}
	cred := upstream.Decide(http.Header{}, nil, false, upstream.IdentityOff)
	stateKey := func(r *http.Request, cred upstream.Credentials) string { return stateKey(r, r.URL.Query(), cred) }
	list := stateKey(r("/api/v1/namespaces/d/configmaps?limit=500&resourceVersion=&labelSelector=a%3Db&timeout=30s", "application/json"), cred)
	for _, same := range []string{
		"/api/v1/namespaces/d/configmaps?watch=true&resourceVersion=14&labelSelector=a%3Db&timeoutSeconds=300&allowWatchBookmarks=true",
		"/api/v1/watch/namespaces/d/configmaps?resourceVersion=14&labelSelector=a%3Db",
		"/api/v1/namespaces/d/configmaps?labelSelector=a%3Db&watch=1&resourceVersion=14&timeout=7m",
	} {
		if k := stateKey(r(same, "application/json"), cred); k != list {
			t.Errorf("the watch %s is keyed %q, its list %q: want the same", same, k, list)
		}
	}
	for _, other := range []*http.Request{
		r("/api/v1/namespaces/d/configmaps?watch=true&resourceVersion=14", "application/json"),
		r("/api/v1/namespaces/d/configmaps?watch=true&labelSelector=a%3Db&fieldSelector=x", "application/json"),
		r("/api/v1/namespaces/e/configmaps?watch=true&labelSelector=a%3Db", "application/json"),
		r("/api/v1/namespaces/d/configmaps?watch=true&labelSelector=a%3Db", "application/json;as=Table;v=v1;g=meta.k8s.io"),
		r("/api/v1/namespaces/watch/configmaps?watch=true&labelSelector=a%3Db", "application/json"),
	} {
		if k := stateKey(other, cred); k == list {
			t.Errorf("the watch %s %s is keyed as the list", other.URL, other.Header.Get("Accept"))
		}
	}
	if k := stateKey(r("/api/v1/namespaces/d/configmaps?watch=true&labelSelector=a%3Db", "application/json"), upstream.Decide(http.Header{"Authorization": {"Bearer x"}}, nil, false, upstream.IdentityOff)); k == list {
		t.Error("another principal's watch is keyed as the list")
	}
	for path, want := range map[string]string{
		"/api/v1/watch/namespaces/d/pods":        "/api/v1/namespaces/d/pods",
		"/apis/apps/v1/watch/deployments":        "/apis/apps/v1/deployments",
		"/apis/apps/v1/watch/namespaces/watch/x": "/apis/apps/v1/namespaces/watch/x",
		"/api/v1/namespaces/watch/configmaps":    "/api/v1/namespaces/watch/configmaps",
		"/apis/watch/v1/namespaces/d/things":     "/apis/watch/v1/namespaces/d/things",
		"/api/v1/watch":                          "/api/v1",
	} {
		if got := listPath(path); got != want {
			t.Errorf("listPath(%s) = %s, want %s", path, got, want)
		}
	}
}

// Only a whole list at resourceVersion unset or "0" is kept: pages that are not one snapshot
// (a later page at another resourceVersion), a page of a list whose first page was not read, a
// list at another resourceVersion, an error, or one over the state's budget is not (the
// client's watch from it keeps no state, and its 410 is its client's), and what any of them
// held is given back.
func TestClientListKeptOnlyWhenWhole(t *testing.T) {
	g := gapWatches(events(gone410))
	g.watches = g.watches[1:]
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
	f := newFixture(t, Config{AbsorbStateBytes: 4096}, up)
	base := "/api/v1/namespaces/d/configmaps"
	f.clientList(t, stream.JSON, base+"?limit=2", "", "14", "page-1", clientListAt14[:2])                             // a first page
	f.clientList(t, stream.JSON, base+"?limit=2&continue=page-1", "", "15", "", clientListAt14[2:])                   // its last, at another resourceVersion
	f.clientList(t, stream.JSON, base+"?limit=2&continue=page-7", "", "14", "", clientListAt14[2:])                   // a page of no list read
	f.clientList(t, stream.JSON, base+"?resourceVersion=14&resourceVersionMatch=Exact", "", "14", "", clientListAt14) // not "" or 0
	f.clientList(t, stream.JSON, base+"?resourceVersion=0", "", "14", "", []string{strings.Repeat("x", 5000)})        // over the budget (and no object)
	r := httptest.NewRequest(http.MethodGet, base, nil)
	info := reqinfo.Parse(r)
	rec := httptest.NewRecorder()
	w, done := f.h.TeeList(rec, r, &info, upstream.Credentials{})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	_, _ = w.Write([]byte(`{"kind":"Status"}`))
	done(true)
	if f.h.parked.Len() != 0 || f.h.stateBudget.Held() != 0 {
		t.Fatalf("%d parked, %d bytes held: want none", f.h.parked.Len(), f.h.stateBudget.Held())
	}
	for result, want := range map[string]float64{absorb.ClientListParked: 0, absorb.ClientListUnread: 2, absorb.ClientListOverBudget: 1} {
		if v := promtest.ToFloat64(f.m.AbsorbClientLists.WithLabelValues(result)); v != want {
			t.Errorf("client_lists{%s} = %v, want %v", result, v, want)
		}
	}
	if s := joinEvents(f.watchUntil(t, "resourceVersion=14&allowWatchBookmarks=true", 7)); s != "ERROR 410" {
		t.Fatalf("client saw [%s], want [ERROR 410]", s)
	}
}

// A list in pages (limit and continue, kubectl's and client-go's for more than 500 objects) is
// kept once its last page is read: each page onto the ones before, by the continue token the
// client's next request carries.
func TestClientListInPagesMakesItsWatchAbsorb(t *testing.T) {
	g := gapWatches(events(gone410))
	g.watches = g.watches[1:]
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
	f := newFixture(t, Config{}, up)
	base := "/api/v1/namespaces/d/configmaps"
	f.clientList(t, stream.JSON, base+"?limit=2", "", "14", "page-1", clientListAt14[:2])
	if f.h.parked.Len() != 0 {
		t.Fatal("a first page was parked as the whole list")
	}
	f.clientList(t, stream.JSON, base+"?limit=2&continue=page-1", "", "14", "", clientListAt14[2:])
	if v := promtest.ToFloat64(f.m.AbsorbClientLists.WithLabelValues(absorb.ClientListParked)); v != 1 || !f.h.parked.At("14") {
		t.Fatalf("client_lists{parked} = %v, parked at 14: %v; want 1 and true", v, f.h.parked.At("14"))
	}
	got := f.watchUntil(t, "resourceVersion=14&allowWatchBookmarks=true", 7)
	if s, want := joinEvents(got), strings.TrimPrefix(gapAbsorbed, gapInitial+", "); s != want {
		t.Fatalf("client saw [%s]\nwant       [%s]", s, want)
	}
}

// A list the apiserver gzipped (over 128 KiB, to a client that accepts gzip: kubectl's and
// client-go's requests do) is read as its client gets it, decoded, and kept as any other.
func TestClientListGzippedMakesItsWatchAbsorb(t *testing.T) {
	g := gapWatches(events(gone410))
	g.watches = g.watches[1:]
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){g.step}}
	f := newFixture(t, Config{}, up)
	var plain httptest.ResponseRecorder
	plain.Body = new(bytes.Buffer)
	writeList(&plain, stream.JSON, "14", "", clientListAt14)
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	_, _ = zw.Write(plain.Body.Bytes())
	_ = zw.Close()
	rec := f.clientListRaw(t, "/api/v1/namespaces/d/configmaps?limit=500", "application/json", func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		for b := z.Bytes(); len(b) > 0; b = b[min(len(b), 16):] { // in several writes, as a proxy copies it
			_, _ = w.Write(b[:min(len(b), 16)])
		}
	})
	if !bytes.Equal(rec.Body.Bytes(), z.Bytes()) {
		t.Fatal("the client did not get the gzipped body as it was")
	}
	if v := promtest.ToFloat64(f.m.AbsorbClientLists.WithLabelValues(absorb.ClientListParked)); v != 1 {
		t.Fatalf("client_lists{parked} = %v, want 1", v)
	}
	got := f.watchUntil(t, "resourceVersion=14&allowWatchBookmarks=true", 7)
	if s, want := joinEvents(got), strings.TrimPrefix(gapAbsorbed, gapInitial+", "); s != want {
		t.Fatalf("client saw [%s]\nwant       [%s]", s, want)
	}
}

// Two identical lists of one principal in flight at once (a relist storm's coalesced members)
// are copied once: the second is answered through the writer it came with, uncopied, and the
// first is still parked whole. A list of another scope is copied alongside.
func TestClientListCopiedOnceWhileInFlight(t *testing.T) {
	f := newFixture(t, Config{}, &upstreamScript{})
	list := func(pathQuery string) (*http.Request, *reqinfo.Info) {
		r := httptest.NewRequest(http.MethodGet, pathQuery, nil)
		r.Header.Set("Accept", "application/json")
		info := reqinfo.Parse(r)
		return r, &info
	}
	r1, i1 := list("/api/v1/namespaces/d/configmaps")
	rec1 := httptest.NewRecorder()
	w1, done1 := f.h.TeeList(rec1, r1, i1, upstream.Credentials{})
	if w1 == http.ResponseWriter(rec1) {
		t.Fatal("the first list is not copied")
	}
	r2, i2 := list("/api/v1/namespaces/d/configmaps?limit=500")
	rec2 := httptest.NewRecorder()
	if w2, done2 := f.h.TeeList(rec2, r2, i2, upstream.Credentials{}); w2 != http.ResponseWriter(rec2) {
		t.Error("an identical list in flight is copied a second time")
		done2(false)
	}
	r3, i3 := list("/api/v1/namespaces/e/configmaps")
	rec3 := httptest.NewRecorder()
	w3, done3 := f.h.TeeList(rec3, r3, i3, upstream.Credentials{})
	if w3 == http.ResponseWriter(rec3) {
		t.Error("another scope's list is not copied")
	}
	done3(false)
	writeList(w1, stream.JSON, "14", "", clientListAt14)
	done1(true)
	if f.h.parked.Len() != 1 {
		t.Fatalf("%d parked, want the first list's", f.h.parked.Len())
	}
}
