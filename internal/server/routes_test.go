package server

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest/observer"

	"github.com/watchsan/watchsan/internal/reqinfo"
	wtestutil "github.com/watchsan/watchsan/internal/testutil"
)

// routeUpstream answers a watch with one ADDED event and holds it open until the client goes,
// and anything else with {}.
func routeUpstream(t *testing.T) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"d","resourceVersion":"5"}}}`+"\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		w.Header().Set("Audit-Id", "audit-1")
		_, _ = io.WriteString(w, "{}")
	}))
	t.Cleanup(up.Close)
	return up
}

// accessLine waits for the access log line of the request with this id.
func accessLine(t *testing.T, logs *observer.ObservedLogs, id string) map[string]any {
	t.Helper()
	var line map[string]any
	wtestutil.Eventually(t, 5*time.Second, "the access log line of request "+id, func() bool {
		for _, e := range logs.FilterMessage("request").All() {
			if m := e.ContextMap(); m["requestID"] == id {
				line = m
				return true
			}
		}
		return false
	})
	return line
}

// TestRouteTable: each kind of request is served by its route of the table, the path reaches
// the guard as sent (mux neither cleans nor redirects it), and every response carries the
// request id that its access log line has.
func TestRouteTable(t *testing.T) {
	s, logs := newTestServer(t, routeUpstream(t).URL)
	front := httptest.NewServer(s.Handler())
	defer front.Close()
	ids := map[string]bool{}
	for _, tc := range []struct {
		path, route string
		code        int
	}{
		{"/api/v1/namespaces/d/configmaps?watch=1&timeoutSeconds=1", "watch", 200},
		{"/api/v1/namespaces/d/configmaps", "list", 200},
		{"/api/v1/namespaces/d/configmaps/a", "pass-through", 200},
		{"/version", "pass-through", 200},
		{"/healthz", "pass-through", 200}, // the apiserver's, not watchsan's
		{"/api/v1/namespaces/d/../../../secrets", "refused", 400},
		{"/api/v1/namespaces/%2e%2e/secrets", "refused", 400},
	} {
		resp, err := http.Get(front.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		id := resp.Header.Get("X-Request-Id")
		if resp.StatusCode != tc.code || id == "" || ids[id] {
			t.Fatalf("%s: %d, request id %q (seen before: %v); want %d and a new id", tc.path, resp.StatusCode, id, ids[id], tc.code)
		}
		ids[id] = true
		line := accessLine(t, logs, id)
		if line["route"] != tc.route {
			t.Errorf("%s: route %v, want %s", tc.path, line["route"], tc.route)
		}
		if tc.route == "pass-through" && line["auditID"] != "audit-1" {
			t.Errorf("%s: auditID %v, want the upstream's Audit-Id", tc.path, line["auditID"])
		}
	}
}

// TestRequestIDOnWatchLines: a caller's X-Request-Id is kept (one that is not an id is
// replaced), echoed, and carried with the client's address by the watch's own log lines.
func TestRequestIDOnWatchLines(t *testing.T) {
	s, logs := newTestServer(t, routeUpstream(t).URL)
	front := httptest.NewServer(s.Handler())
	defer front.Close()

	req, _ := http.NewRequest("GET", front.URL+"/api/v1/namespaces/d/configmaps?watch=1", nil)
	req.Header.Set("X-Request-Id", "caller-42")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Header.Get("X-Request-Id"); got != "caller-42" {
		t.Fatalf("X-Request-Id %q, want the caller's", got)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // the client goes: the watch ends and says so
	var ended map[string]any
	wtestutil.Eventually(t, 5*time.Second, "the watch's end to be logged", func() bool {
		if l := logs.FilterMessage("watch ended").All(); len(l) == 1 {
			ended = l[0].ContextMap()
			return true
		}
		return false
	})
	line := accessLine(t, logs, "caller-42")
	if ended["requestID"] != "caller-42" || ended["remote"] == "" || ended["remote"] != line["remote"] {
		t.Fatalf("watch line %v does not carry the request id and client address of access line %v", ended, line)
	}

	req, _ = http.NewRequest("GET", front.URL+"/version", nil)
	req.Header.Set("X-Request-Id", "not an id <script>")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("X-Request-Id"); got == "" || strings.Contains(got, " ") || len(got) > 64 {
		t.Fatalf("an implausible X-Request-Id came back as %q; want a new id", got)
	}
}

// TestAccessLogSwitch: --access-log=false writes no request lines; requests are still counted.
func TestAccessLogSwitch(t *testing.T) {
	s, logs := newTestServerArgs(t, "--upstream="+routeUpstream(t).URL, "--access-log=false")
	front := httptest.NewServer(s.Handler())
	defer front.Close()
	for i := 0; i < 3; i++ {
		resp, err := http.Get(front.URL + "/version")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	wtestutil.Eventually(t, 5*time.Second, "three requests counted", func() bool {
		return testutil.ToFloat64(s.metrics.Requests.WithLabelValues("get", "", "200")) == 3
	})
	if n := logs.FilterMessage("request").Len(); n != 0 {
		t.Fatalf("%d access log lines with --access-log=false", n)
	}
}

func BenchmarkNewRequestID(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = newRequestID()
	}
}

// A client's own list is kept as its watch's state once the route that answered it returned,
// whether or not the client was still there: a client that read the whole list and closed its
// connection at once (so its request's context ended before the route returned) keeps it; a
// route that panicked (an answer cut short) or wrote half a list keeps nothing.
func TestClientListKeptWhenItsClientLeftAfterTheLastByte(t *testing.T) {
	s, _ := newTestServer(t, "http://127.0.0.1:1")
	list := `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"14"},"items":[` +
		`{"metadata":{"name":"a","namespace":"d","uid":"ua","resourceVersion":"12"}}]}`
	serve := func(write func(w http.ResponseWriter, cancel func())) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/api/v1/namespaces/d/configmaps", nil)
		r.Header.Set("Accept", "application/json")
		c := &classified{info: reqinfo.Parse(r)}
		defer func() { _ = recover() }()
		s.teeList(func(w http.ResponseWriter, _ *http.Request, _ *classified) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			write(w, cancel)
		})(httptest.NewRecorder(), r, c)
	}
	m := s.Metrics().AbsorbClientLists
	serve(func(w http.ResponseWriter, cancel func()) { _, _ = io.WriteString(w, list); cancel() })
	if v := testutil.ToFloat64(m.WithLabelValues("parked")); v != 1 {
		t.Fatalf("client_lists{parked} = %v after a whole list whose client left at once, want 1", v)
	}
	serve(func(w http.ResponseWriter, _ func()) { _, _ = io.WriteString(w, list[:len(list)/2]) })
	serve(func(w http.ResponseWriter, _ func()) { _, _ = io.WriteString(w, list); panic(http.ErrAbortHandler) })
	if p, u := testutil.ToFloat64(m.WithLabelValues("parked")), testutil.ToFloat64(m.WithLabelValues("unread")); p != 1 || u != 2 {
		t.Fatalf("client_lists parked %v, unread %v after half a list and a panicked route: want 1 and 2", p, u)
	}
}
