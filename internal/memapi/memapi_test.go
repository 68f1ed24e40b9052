package memapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/watchsan/watchsan/internal/testutil"
)

const ns = "demo"

// testServer starts s behind an httptest server that records every request's path and query.
type testServer struct {
	*Server
	URL string
	cs  *kubernetes.Clientset

	mu       sync.Mutex
	requests []string
}

func start(t *testing.T, configure func(*Server)) *testServer {
	t.Helper()
	s := New(zaptest.NewLogger(t))
	if configure != nil {
		configure(s)
	}
	ts := &testServer{Server: s}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ts.mu.Lock()
		ts.requests = append(ts.requests, r.Method+" "+r.URL.RequestURI())
		ts.mu.Unlock()
		s.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		s.Close()
		hs.Close() // waits for every handler: a watch left running would hang here
		if n := s.OpenWatches(); n != 0 {
			t.Errorf("%d watches still open after Close", n)
		}
	})
	ts.URL = hs.URL
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: hs.URL, QPS: -1})
	if err != nil {
		t.Fatal(err)
	}
	ts.cs = cs
	return ts
}

func (ts *testServer) requestLog() []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return slices.Clone(ts.requests)
}

func svc(name string, labels map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

type seen struct{ typ, name, rv string }

// recorder records an informer's handler calls.
type recorder struct {
	mu     sync.Mutex
	events []seen
}

func (r *recorder) add(typ string, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	s := obj.(*corev1.Service)
	r.mu.Lock()
	r.events = append(r.events, seen{typ, s.Name, s.ResourceVersion})
	r.mu.Unlock()
}

func (r *recorder) snapshot() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

func (r *recorder) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.add("add", obj) },
		UpdateFunc: func(_, obj any) { r.add("update", obj) },
		DeleteFunc: func(obj any) { r.add("delete", obj) },
	}
}

func TestInformerSyncsWithWatchListAndSeesChanges(t *testing.T) {
	ts := start(t, nil)
	ctx := ctxT(t)
	pre, err := ts.cs.CoreV1().Services(ns).Create(ctx, svc("pre", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	factory := informers.NewSharedInformerFactoryWithOptions(ts.cs, 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().Services().Informer()
	rec := &recorder{}
	if _, err := inf.AddEventHandler(rec.handler()); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer func() { close(stop); factory.Shutdown() }()
	factory.Start(stop)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}

	a, err := ts.cs.CoreV1().Services(ns).Create(ctx, svc("a", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a.Labels = map[string]string{"changed": "yes"}
	a2, err := ts.cs.CoreV1().Services(ns).Update(ctx, a, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ts.cs.CoreV1().Services(ns).Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	delRV := strconv.FormatUint(ts.ResourceVersion(), 10)

	want := []seen{
		{"add", "pre", pre.ResourceVersion},
		{"add", "a", a.ResourceVersion},
		{"update", "a", a2.ResourceVersion},
		{"delete", "a", delRV}, // the delete's own revision
	}
	testutil.Eventually(t, 10*time.Second, "the informer's handlers to see every change", func() bool { return len(rec.snapshot()) >= len(want) })
	if got := rec.snapshot(); !slices.Equal(got, want) {
		t.Fatalf("handlers saw %v, want %v", got, want)
	}
	if a2.ResourceVersion == a.ResourceVersion || delRV == a2.ResourceVersion {
		t.Fatalf("resourceVersions did not advance: %s %s %s", a.ResourceVersion, a2.ResourceVersion, delRV)
	}

	// It synced with watch-list, as client-go v0.37 does by default: no plain LIST was needed.
	var watchList bool
	for _, r := range ts.requestLog() {
		if strings.Contains(r, "/services?") && !strings.Contains(r, "watch=") {
			t.Errorf("informer fell back to a LIST: %s", r)
		}
		if strings.Contains(r, "sendInitialEvents=true") {
			watchList = true
		}
	}
	if !watchList {
		t.Errorf("no watch-list request seen in %v", ts.requestLog())
	}

	// The store equals a fresh list.
	list, err := ts.cs.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	keys := inf.GetStore().ListKeys()
	if len(list.Items) != 1 || len(keys) != 1 || keys[0] != ns+"/pre" {
		t.Fatalf("store %v, list %d items", keys, len(list.Items))
	}
}

// rawWatch opens a watch with the given query and returns a function that reads the next event.
func rawWatch(t *testing.T, ctx context.Context, base, path string, q url.Values) func() (string, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path+"?"+q.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("watch answered %s", resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("watch Content-Type %q", ct)
	}
	dec := json.NewDecoder(bufio.NewReader(resp.Body))
	return func() (string, map[string]any) {
		t.Helper()
		var ev struct {
			Type   string         `json:"type"`
			Object map[string]any `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			return "EOF", nil
		}
		return ev.Type, ev.Object
	}
}

func meta(obj map[string]any) (name, rv string, ann map[string]any) {
	m, _ := obj["metadata"].(map[string]any)
	name, _ = m["name"].(string)
	rv, _ = m["resourceVersion"].(string)
	ann, _ = m["annotations"].(map[string]any)
	return
}

func TestWatchFromOldRVReplaysInOrder(t *testing.T) {
	ts := start(t, nil)
	ctx := ctxT(t)
	sc := ts.cs.CoreV1().Services(ns)
	a, err := sc.Create(ctx, svc("a", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"b", "c"} {
		if _, err := sc.Create(ctx, svc(n, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := sc.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Another resource's write in between: not seen by a services watch, but it takes an RV.
	if _, err := ts.cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Create(ctx, svc("d", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Through client-go's own watch decoding, from a's creation.
	w, err := sc.Watch(ctx, metav1.ListOptions{ResourceVersion: a.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	aRV, _ := strconv.Atoi(a.ResourceVersion)
	want := []struct {
		typ  watch.EventType
		name string
		rv   int
	}{{watch.Added, "b", aRV + 1}, {watch.Added, "c", aRV + 2}, {watch.Deleted, "a", aRV + 3}, {watch.Added, "d", aRV + 5}}
	for _, wnt := range want {
		select {
		case ev := <-w.ResultChan():
			s, ok := ev.Object.(*corev1.Service)
			if !ok {
				t.Fatalf("event %s with %T", ev.Type, ev.Object)
			}
			if ev.Type != wnt.typ || s.Name != wnt.name || s.ResourceVersion != strconv.Itoa(wnt.rv) {
				t.Fatalf("got %s %s rv %s, want %s %s rv %d", ev.Type, s.Name, s.ResourceVersion, wnt.typ, wnt.name, wnt.rv)
			}
		case <-ctx.Done():
			t.Fatal("timed out")
		}
	}

	// The legacy watch path for one object, from the same RV: only a's delete.
	next := rawWatch(t, ctx, ts.URL, "/api/v1/watch/namespaces/"+ns+"/services/a", url.Values{"resourceVersion": {a.ResourceVersion}})
	typ, obj := next()
	if name, rv, _ := meta(obj); typ != "DELETED" || name != "a" || rv != strconv.Itoa(aRV+3) {
		t.Fatalf("legacy watch: %s %s %s", typ, name, rv)
	}
}

func TestWatchPastHistoryIsExpired(t *testing.T) {
	ts := start(t, func(s *Server) { s.HistorySize = 3 })
	ctx := ctxT(t)
	sc := ts.cs.CoreV1().Services(ns)
	first, err := sc.Create(ctx, svc("s0", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 6; i++ {
		if _, err := sc.Create(ctx, svc(fmt.Sprint("s", i), nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cur := ts.ResourceVersion()

	// The oldest RV still servable is cur-3; one before it is gone.
	next := rawWatch(t, ctx, ts.URL, "/api/v1/namespaces/"+ns+"/services", url.Values{"watch": {"true"}, "resourceVersion": {first.ResourceVersion}})
	typ, obj := next()
	if typ != "ERROR" || obj["code"] != float64(410) || obj["reason"] != "Expired" || obj["kind"] != "Status" {
		t.Fatalf("watch from before the history: %s %v", typ, obj)
	}
	if typ, _ := next(); typ != "EOF" {
		t.Fatalf("stream went on after the 410: %s", typ)
	}

	// client-go turns it into an Expired error.
	w, err := sc.Watch(ctx, metav1.ListOptions{ResourceVersion: strconv.FormatUint(cur-4, 10)})
	if err != nil {
		t.Fatal(err)
	}
	ev := <-w.ResultChan()
	w.Stop()
	if st, ok := ev.Object.(*metav1.Status); ev.Type != watch.Error || !ok || !apierrors.IsResourceExpired(apierrors.FromObject(st)) {
		t.Fatalf("client-go saw %s %#v", ev.Type, ev.Object)
	}

	// From the oldest servable RV: the last three creates.
	next = rawWatch(t, ctx, ts.URL, "/api/v1/namespaces/"+ns+"/services", url.Values{"watch": {"1"}, "resourceVersion": {strconv.FormatUint(cur-3, 10)}})
	for i := 3; i < 6; i++ {
		typ, obj := next()
		if name, _, _ := meta(obj); typ != "ADDED" || name != fmt.Sprint("s", i) {
			t.Fatalf("replay %d: %s %s", i, typ, name)
		}
	}

	// An exact LIST inside the history sees the past; before it, 410.
	list, err := sc.List(ctx, metav1.ListOptions{ResourceVersion: strconv.FormatUint(cur-2, 10), ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 4 || list.ResourceVersion != strconv.FormatUint(cur-2, 10) {
		t.Fatalf("exact list: %d items at %s", len(list.Items), list.ResourceVersion)
	}
	_, err = sc.List(ctx, metav1.ListOptions{ResourceVersion: strconv.FormatUint(cur-4, 10), ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		t.Fatalf("exact list before the history: %v", err)
	}
	// A future RV: 504 too large with Retry-After, as the apiserver answers (raw: client-go
	// would retry it for ten seconds).
	resp, err := http.Get(ts.URL + "/api/v1/namespaces/" + ns + "/services?resourceVersion=" + strconv.FormatUint(cur+10, 10))
	if err != nil {
		t.Fatal(err)
	}
	var st metav1.Status
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get("Retry-After") != "1" ||
		st.Reason != metav1.StatusReasonTimeout || st.Details == nil || len(st.Details.Causes) != 1 ||
		st.Details.Causes[0].Type != metav1.CauseTypeResourceVersionTooLarge {
		t.Fatalf("list from a future RV: %s %+v %v", resp.Status, st, err)
	}
}

func TestWatchListInitialEventsAndBookmarks(t *testing.T) {
	ts := start(t, func(s *Server) { s.BookmarkInterval = 20 * time.Millisecond })
	ctx := ctxT(t)
	sc := ts.cs.CoreV1().Services(ns)
	for _, n := range []string{"b", "a"} {
		if _, err := sc.Create(ctx, svc(n, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Another namespace's object: not in this watch.
	if _, err := ts.cs.CoreV1().Services("other").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "z"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cur := strconv.FormatUint(ts.ResourceVersion(), 10)
	next := rawWatch(t, ctx, ts.URL, "/api/v1/namespaces/"+ns+"/services", url.Values{
		"watch": {"true"}, "sendInitialEvents": {"true"}, "resourceVersionMatch": {"NotOlderThan"},
		"allowWatchBookmarks": {"true"},
	})
	for _, want := range []string{"a", "b"} {
		typ, obj := next()
		if name, _, _ := meta(obj); typ != "ADDED" || name != want || obj["kind"] != "Service" || obj["apiVersion"] != "v1" {
			t.Fatalf("initial event: %s %s %v", typ, name, obj)
		}
	}
	typ, obj := next()
	if _, rv, ann := meta(obj); typ != "BOOKMARK" || rv != cur || ann["k8s.io/initial-events-end"] != "true" || obj["kind"] != "Service" {
		t.Fatalf("after the initial events: %s %v (want the initial-events-end bookmark at %s)", typ, obj, cur)
	}
	// Then periodic bookmarks, unannotated, at the RV the watch is up to.
	if _, err := sc.Create(ctx, svc("c", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cur = strconv.FormatUint(ts.ResourceVersion(), 10)
	// A periodic bookmark may come before the create's event (the interval is 20 ms): it is
	// at the RV the watch was up to, the initial-events-end bookmark's, and unannotated.
	for {
		typ, obj := next()
		if typ == "ADDED" {
			break
		}
		if _, rv, ann := meta(obj); typ != "BOOKMARK" || ann != nil || rv == cur {
			t.Fatalf("live event: %s %v", typ, obj)
		}
	}
	typ, obj = next()
	if _, rv, ann := meta(obj); typ != "BOOKMARK" || rv != cur || ann != nil {
		t.Fatalf("periodic bookmark: %s %v", typ, obj)
	}

	// Watch-list without bookmarks allowed: initial events, no bookmark at all. A watch from
	// RV "" (legacy) gets the initial events without the end marker even with bookmarks.
	for _, q := range []url.Values{
		{"watch": {"true"}, "sendInitialEvents": {"true"}, "resourceVersionMatch": {"NotOlderThan"}},
		{"watch": {"true"}},
	} {
		next := rawWatch(t, ctx, ts.URL, "/api/v1/namespaces/"+ns+"/services", q)
		for _, want := range []string{"a", "b", "c"} {
			if typ, obj := next(); typ != "ADDED" {
				t.Fatalf("%v: initial %s: %s %v", q, want, typ, obj)
			}
		}
	}

	// sendInitialEvents without resourceVersionMatch is invalid, as on the apiserver.
	resp, err := http.Get(ts.URL + "/api/v1/namespaces/" + ns + "/services?watch=true&sendInitialEvents=true")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("invalid watch-list answered %s", resp.Status)
	}
}

func TestWatchEndsOnTimeoutDisconnectAndClose(t *testing.T) {
	ts := start(t, nil)
	ctx := ctxT(t)

	// timeoutSeconds: the stream ends cleanly.
	begin := time.Now()
	next := rawWatch(t, ctx, ts.URL, "/api/v1/services", url.Values{"watch": {"true"}, "timeoutSeconds": {"1"}})
	if typ, _ := next(); typ != "EOF" {
		t.Fatalf("got %s", typ)
	}
	if d := time.Since(begin); d < time.Second || d > 5*time.Second {
		t.Fatalf("watch with timeoutSeconds=1 ended after %s", d)
	}

	// A client that goes away: the handler returns.
	wctx, cancel := context.WithCancel(ctx)
	rawWatch(t, wctx, ts.URL, "/api/v1/namespaces/"+ns+"/services", url.Values{"watch": {"true"}})
	testutil.Eventually(t, 10*time.Second, "the watch to open", func() bool { return ts.OpenWatches() == 1 })
	cancel()
	testutil.Eventually(t, 10*time.Second, "the watch to end after the client left", func() bool { return ts.OpenWatches() == 0 })

	// Close ends open watches cleanly.
	next = rawWatch(t, ctx, ts.URL, "/api/v1/namespaces/"+ns+"/configmaps", url.Values{"watch": {"true"}})
	testutil.Eventually(t, 10*time.Second, "the watch to open", func() bool { return ts.OpenWatches() == 1 })
	ts.Close()
	if typ, _ := next(); typ != "EOF" {
		t.Fatalf("got %s after Close", typ)
	}
}

func TestLabelSelectorWatchSeesObjectsEnterAndLeave(t *testing.T) {
	ts := start(t, nil)
	ctx := ctxT(t)
	sc := ts.cs.CoreV1().Services(ns)
	w, err := sc.Watch(ctx, metav1.ListOptions{LabelSelector: "app=x", ResourceVersion: strconv.FormatUint(ts.ResourceVersion(), 10)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	s, err := sc.Create(ctx, svc("s", map[string]string{"app": "y"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Labels["app"] = "x"
	if s, err = sc.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Labels["app"] = "z"
	if _, err = sc.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []watch.EventType{watch.Added, watch.Deleted} {
		ev := <-w.ResultChan()
		if ev.Type != want {
			t.Fatalf("got %s, want %s", ev.Type, want)
		}
	}
}

func TestWritesBehaveAsTheAPIServer(t *testing.T) {
	ts := start(t, nil)
	ctx := ctxT(t)
	sc := ts.cs.CoreV1().Services(ns)
	a, err := sc.Create(ctx, svc("a", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a.UID == "" || a.CreationTimestamp.IsZero() || a.Namespace != ns {
		t.Fatalf("create did not fill metadata: %+v", a.ObjectMeta)
	}
	if _, err := sc.Create(ctx, svc("a", nil), metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("second create: %v", err)
	}
	if _, err := sc.Get(ctx, "nope", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get missing: %v", err)
	}
	g := svc("", nil)
	g.GenerateName = "gen-"
	if got, err := sc.Create(ctx, g, metav1.CreateOptions{}); err != nil || !strings.HasPrefix(got.Name, "gen-") {
		t.Fatalf("generateName: %v %v", got, err)
	}
	if _, err := sc.Create(ctx, svc("", nil), metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("create without a name: %v", err)
	}

	// An update that changes nothing writes nothing.
	rv := ts.ResourceVersion()
	same, err := sc.Update(ctx, a, metav1.UpdateOptions{})
	if err != nil || same.ResourceVersion != a.ResourceVersion || ts.ResourceVersion() != rv {
		t.Fatalf("no-op update: %v, rv %s -> %s", err, a.ResourceVersion, same.ResourceVersion)
	}
	a.Labels = map[string]string{"x": "1"}
	a2, err := sc.Update(ctx, a, metav1.UpdateOptions{})
	if err != nil || a2.UID != a.UID {
		t.Fatalf("update: %v", err)
	}
	// a carries the old RV now: a conflict.
	a.Labels["x"] = "2"
	if _, err := sc.Update(ctx, a, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("stale update: %v", err)
	}
	stale := a.ResourceVersion
	if err := sc.Delete(ctx, "a", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &stale}}); !apierrors.IsConflict(err) {
		t.Fatalf("delete with a stale precondition: %v", err)
	}
	if err := sc.Delete(ctx, "a", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Get(ctx, "a", metav1.GetOptions{}); err != nil {
		t.Fatalf("dry-run delete deleted: %v", err)
	}
	if err := sc.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := sc.Delete(ctx, "a", metav1.DeleteOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("second delete: %v", err)
	}

	// Discovery and errors as Status.
	for path, want := range map[string]int{"/api": 200, "/api/v1": 200, "/apis": 200, "/version": 200, "/readyz": 200, "/api/v1/pods": 404, "/apis/apps/v1": 404} {
		resp, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %s, want %d", path, resp.Status, want)
		}
	}
	if _, err := ts.cs.Discovery().ServerResourcesForGroupVersion("v1"); err != nil {
		t.Errorf("discovery: %v", err)
	}
}
