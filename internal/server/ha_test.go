package server

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/watchsan/watchsan/internal/config"
	wtestutil "github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/internal/upstream"
)

func newTestServerArgs(t *testing.T, args ...string) (*Server, *observer.ObservedLogs) {
	t.Helper()
	c, err := config.Load(append([]string{"--listen=127.0.0.1:0", "--admin-listen=127.0.0.1:0"}, args...))
	if err != nil {
		t.Fatal(err)
	}
	done, err := c.Complete()
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.DebugLevel)
	s, err := New(done, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	return s, logs
}

// listUpstream serves a configmap watch with one event at resourceVersion 500 (then holds it
// open) and records the query of every list; lists at resourceVersionMatch=NotOlderThan are
// answered 504 while behind is set.
type listUpstream struct {
	mu     sync.Mutex
	lists  []url.Values
	behind bool
}

func (u *listUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("watch") != "" {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"d","resourceVersion":"500"}}}`+"\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		return
	}
	u.mu.Lock()
	u.lists = append(u.lists, q)
	behind := u.behind
	u.mu.Unlock()
	if behind && q.Get("resourceVersionMatch") == "NotOlderThan" {
		http.Error(w, `{"kind":"Status","code":504,"message":"Too large resource version"}`, http.StatusGatewayTimeout)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"500"},"items":[]}`)
}

func (u *listUpstream) last() url.Values {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.lists[len(u.lists)-1]
}

// a list at resourceVersion=0 goes upstream at the highest resourceVersion
// watchsan has seen for the resource, with resourceVersionMatch=NotOlderThan; other lists, and
// every list with the guard off, go as the client sent them. When no upstream can serve the
// raised list (504 from all), the client gets the 504 and the mark is dropped.
func TestTimeTravelGuard(t *testing.T) {
	for _, guard := range []bool{true, false} {
		up := &listUpstream{}
		srv := httptest.NewServer(up)
		args := []string{"--upstream=" + srv.URL, "--retry-budget=500ms"}
		if !guard {
			args = append(args, "--time-travel-guard=false")
		}
		s, _ := newTestServerArgs(t, args...)
		front := httptest.NewServer(s.Handler())
		get := func(path string) int {
			resp, err := http.Get(front.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}
		if get("/api/v1/namespaces/d/configmaps?resourceVersion=0"); up.last().Get("resourceVersion") != "0" {
			t.Fatalf("guard %v: before any watch, a list went with %v", guard, up.last())
		}
		// A watch through watchsan delivers resourceVersion 500.
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", front.URL+"/api/v1/namespaces/d/configmaps?watch=true", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		if _, err := resp.Body.Read(buf); err != nil {
			t.Fatal(err)
		}
		cancel()
		resp.Body.Close()

		get("/api/v1/namespaces/d/configmaps?resourceVersion=0&limit=500")
		q := up.last()
		raised := q.Get("resourceVersion") == "500" && q.Get("resourceVersionMatch") == "NotOlderThan" && !q.Has("limit")
		if raised != guard {
			t.Fatalf("guard %v: a list at RV 0 after the watch went with %v", guard, q)
		}
		for _, path := range []string{
			"/api/v1/namespaces/d/configmaps",                                              // consistent read already
			"/api/v1/namespaces/d/configmaps?resourceVersion=7",                            // the client's own bound
			"/api/v1/namespaces/d/configmaps?resourceVersion=0&resourceVersionMatch=Exact", // invalid anyway: left to the apiserver
			"/api/v1/namespaces/d/secrets?resourceVersion=0",                               // no mark for secrets
		} {
			get(path)
			if q := up.last(); q.Get("resourceVersion") == "500" {
				t.Fatalf("guard %v: %s went with %v", guard, path, q)
			}
		}
		if guard {
			if v := testutil.ToFloat64(s.metrics.Upstream.ListsRaised.WithLabelValues("sent")); v != 1 {
				t.Fatalf("lists raised %v, want 1", v)
			}
			up.mu.Lock()
			up.behind = true
			up.mu.Unlock()
			if code := get("/api/v1/namespaces/d/configmaps?resourceVersion=0"); code != 504 {
				t.Fatalf("every upstream behind: %d, want the 504", code)
			}
			if _, ok := s.pool.HighWater("configmaps"); ok {
				t.Fatal("the mark no upstream could serve was kept")
			}
			if get("/api/v1/namespaces/d/configmaps?resourceVersion=0"); up.last().Get("resourceVersion") != "0" {
				t.Fatalf("after the mark was dropped a list went with %v", up.last())
			}
		}
		front.Close()
		srv.Close()
	}
}

// a reload changes the upstream set live; other changes are reported as
// needing a restart and change nothing.
func TestReloadChangesUpstreamsOnly(t *testing.T) {
	// b answers a watch with an event at resourceVersion 10, then one at 5: a regression, which
	// repair (the running mode) does not deliver and observe (the reloaded one) would.
	regressing := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		for _, rv := range []string{"10", "5"} {
			io.WriteString(w, `{"type":"MODIFIED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"d","resourceVersion":"`+rv+`"}}}`+"\n")
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	a, b := httptest.NewServer(http.NotFoundHandler()), httptest.NewServer(regressing)
	defer a.Close()
	defer b.Close()
	s, logs := newTestServerArgs(t, "--upstream="+a.URL)
	c, err := config.Load([]string{"--listen=127.0.0.1:0", "--admin-listen=127.0.0.1:0", "--upstream=" + b.URL, "--fix-mode=observe"})
	if err != nil {
		t.Fatal(err)
	}
	done, err := c.Complete()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(done); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range s.pool.Backends() {
		names = append(names, x.String()+" "+x.State().String())
	}
	slices.Sort(names)
	want := []string{a.URL + " removed", b.URL + " unknown"}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("upstreams after the reload: %v", names)
	}
	warn := logs.FilterMessageSnippet("change only at a restart").All()
	if len(warn) != 1 {
		t.Fatalf("restart-only changes logged: %+v", warn)
	}
	if flags, _ := warn[0].ContextMap()["flags"].([]interface{}); len(flags) != 1 || flags[0] != "--fix-mode" {
		t.Fatalf("restart-only changes logged: %+v", warn)
	}
	// The watch pipeline still repairs: the regressed event does not reach the client.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.pool.Run(ctx)
	wtestutil.Eventually(t, 10*time.Second, "the reloaded upstream probed", func() bool {
		for _, x := range s.pool.Backends() {
			if x.String() == b.URL && x.State() == upstream.Healthy {
				return true
			}
		}
		return false
	})
	front := httptest.NewServer(s.Handler())
	defer front.Close()
	resp, err := http.Get(front.URL + "/api/v1/namespaces/d/configmaps?watch=true&timeoutSeconds=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := strings.Count(string(body), `"type":`); resp.StatusCode != 200 || n != 1 || !strings.Contains(string(body), `"resourceVersion":"10"`) {
		t.Fatalf("after reloading --fix-mode=observe, a regressing watch delivered %d events (%d): %s; want only resourceVersion 10 (a restart-only setting changed live)", n, resp.StatusCode, body)
	}
}

// TestAttackDiscoveryForgedSlice: discovery accepted any EndpointSlice
// labelled for the kubernetes Service, so whoever may create EndpointSlices in default could
// add an upstream of their choice, which then got the requests (and the lent identity). Only
// the apiservers' own slice counts: default/kubernetes, as their endpoint reconciler writes it
// (no managed-by label).
func TestAttackDiscoveryForgedSlice(t *testing.T) {
	slice := func(name, managedBy, addr string) string {
		labels := `"kubernetes.io/service-name":"kubernetes"`
		if managedBy != "" {
			labels += `,"endpointslice.kubernetes.io/managed-by":"` + managedBy + `"`
		}
		return `{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1","metadata":{"name":"` + name + `","namespace":"default","labels":{` + labels + `}},` +
			`"addressType":"IPv4","endpoints":[{"addresses":["` + addr + `"],"conditions":{"ready":true}}],"ports":[{"name":"https","port":6443,"protocol":"TCP"}]}`
	}
	var mu sync.Mutex
	own := slice("kubernetes", "", "10.0.0.1")
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		mu.Lock()
		defer mu.Unlock()
		switch r.URL.Path {
		case "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes":
			_, _ = io.WriteString(w, own)
		case "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices":
			// What a list by the Service's label answers: the apiservers' slice and a forged one.
			_, _ = io.WriteString(w, `{"kind":"EndpointSliceList","items":[`+own+`,`+slice("kubernetes-extra", "", "10.6.6.6")+`]}`)
		default:
			_, _ = io.WriteString(w, "{}")
		}
	}))
	defer up.Close()
	s, _ := newTestServerArgs(t, "--upstream="+up.URL, "--upstream-discovery=endpoints")
	urls, err := s.readEndpoints(t.Context())
	if err != nil || len(urls) != 1 || urls[0].String() != "https://10.0.0.1:6443" {
		t.Fatalf("discovered %v %v, want only the apiservers' own https://10.0.0.1:6443", urls, err)
	}
	mu.Lock()
	own = slice("kubernetes", "someone-else", "10.6.6.6")
	mu.Unlock()
	if urls, err := s.readEndpoints(t.Context()); err == nil || !strings.Contains(err.Error(), "managed by") {
		t.Fatalf("a default/kubernetes slice another manager wrote: %v %v, want it refused", urls, err)
	}
}
