package faults

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/clustertest"
)

// These tests run the layer in front of a real kube-apiserver from the harness and show that
// it is faithful: a real client-go informer through it suffers exactly what informers
// suffered from the 1.7-1.9 apiservers.
func TestRealAPIServer(t *testing.T) {
	c := clustertest.Start(t, cluster.Options{FeatureGates: "CBORServingAndStorage=true"})
	direct := kubernetes.NewForConfigOrDie(c.RESTConfig(0, c.AdminToken))

	for _, faulty := range []bool{true, false} {
		name := map[bool]string{true: "informer sees the replay", false: "control: no faults, no replay"}[faulty]
		t.Run(name, func(t *testing.T) {
			for _, ct := range []string{"application/json", "application/vnd.kubernetes.protobuf"} {
				t.Run(ct, func(t *testing.T) { testInformerReplay(t, c, direct, ct, faulty) })
			}
		})
	}
	t.Run("fallback list", func(t *testing.T) {
		for _, f := range allFormats {
			t.Run(f.name, func(t *testing.T) { testRealFallbackList(t, c, direct, f) })
		}
	})
}

// layerInFront serves a new Layer in front of apiserver 0 (through a ReverseProxy holding no
// credentials of its own: the clients' Authorization passes through) over plain HTTP.
func layerInFront(t *testing.T, c *cluster.Cluster) (*Layer, string) {
	t.Helper()
	target, err := url.Parse(c.APIServers[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := rest.TransportFor(c.RESTConfig(0, ""))
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) }, Transport: tr}
	l := New(proxy, zaptest.NewLogger(t))
	srv := httptest.NewServer(l)
	t.Cleanup(srv.Close)
	return l, srv.URL
}

func newNamespace(t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	name := fmt.Sprintf("faults-%d", time.Now().UnixNano())
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// handlerLog counts an informer's handler calls by "add/NAME", "update/NAME", "delete/NAME".
type handlerLog struct {
	mu     sync.Mutex
	counts map[string]int
}

func (h *handlerLog) record(kind string, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	name := "?"
	if m, ok := obj.(metav1.Object); ok {
		name = m.GetName()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[kind+"/"+name]++
}

func (h *handlerLog) get(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts[key]
}

func (h *handlerLog) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var keys []string
	for k, v := range h.counts {
		keys = append(keys, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(keys)
	return strings.Join(keys, " ")
}

// The incident's reproduction: create a, create others, delete a, watch re-established. The
// re-watch starts from the stale resourceVersion the DELETED event carried, and the apiserver
// replays everything since: the informer's handlers see b and c "updated" and a deleted twice.
// Without the faults the same steps show the truth.
func testInformerReplay(t *testing.T, c *cluster.Cluster, direct kubernetes.Interface, contentType string, faulty bool) {
	ns := newNamespace(t, direct)
	l, layerURL := layerInFront(t, c)
	if faulty {
		if err := l.Set(Faults{DeleteOldRV: true, EndWatchAfterDelete: true}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := &rest.Config{Host: layerURL, BearerToken: c.AdminToken, QPS: 100, Burst: 200,
		ContentConfig: rest.ContentConfig{ContentType: contentType, AcceptContentTypes: contentType + ",application/json"}}
	factory := informers.NewSharedInformerFactoryWithOptions(kubernetes.NewForConfigOrDie(cfg), 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().ConfigMaps().Informer()
	h := &handlerLog{counts: map[string]int{}}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { h.record("add", obj) },
		UpdateFunc: func(_, obj any) { h.record("update", obj) },
		DeleteFunc: func(obj any) { h.record("delete", obj) },
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer factory.Shutdown()
	defer cancel()
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}

	cms := direct.CoreV1().ConfigMaps(ns)
	for _, name := range []string{"a", "b", "c"} {
		if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cms.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if faulty {
		testutil.Eventually(t, 10*time.Second, "the replay to reach the informer", func() bool {
			return h.get("delete/a") >= 2 && h.get("update/b") >= 1 && h.get("update/c") >= 1
		})
	}
	// The replay happens once: a later change arrives as itself and nothing repeats.
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "d"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "d to reach the informer", func() bool { return h.get("add/d") == 1 })
	want := "add/a=1 add/b=1 add/c=1 add/d=1 delete/a=1"
	if faulty {
		want = "add/a=1 add/b=1 add/c=1 add/d=1 delete/a=2 update/b=1 update/c=1"
	}
	if got := h.String(); got != want {
		t.Errorf("handler calls %s, want %s", got, want)
	}
	s := l.Stats()
	if faulty && (s.EndedAfterDelete != 1 || s.DeletesRewritten != 2 || s.Watches != 2 || s.Lookups != 0) ||
		!faulty && (s.EndedAfterDelete != 0 || s.DeletesRewritten != 0 || s.Watches != 1) {
		t.Errorf("stats %+v", s)
	}
	t.Logf("handler calls: %s; layer: %+v", h, s)
}

// A watch that starts after the object's last change never saw it: the layer asks the real
// apiserver for the resourceVersion at the delete's revision minus one.
func testRealFallbackList(t *testing.T, c *cluster.Cluster, direct kubernetes.Interface, f wireFormat) {
	ns := newNamespace(t, direct)
	l, layerURL := layerInFront(t, c)
	if err := l.Set(Faults{DeleteOldRV: true}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cms := direct.CoreV1().ConfigMaps(ns)
	a, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Data: map[string]string{"v": "1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a.Data["v"] = "2"
	if a, err = cms.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "b"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		layerURL+"/api/v1/namespaces/"+ns+"/configmaps?watch=1&resourceVersion="+b.ResourceVersion, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.AdminToken)
	req.Header.Set("Accept", f.accept)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != f.contentType {
		t.Fatalf("watch: %s, Content-Type %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	if err := cms.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	got := readEvents(t, f.decoder(resp.Body), 1)
	if got[0].typ != watch.Deleted || got[0].obj.Name != "a" || got[0].obj.ResourceVersion != a.ResourceVersion {
		t.Errorf("got %s %s rv %s, want DELETED a rv %s (its last update)", got[0].typ, got[0].obj.Name, got[0].obj.ResourceVersion, a.ResourceVersion)
	}
	if s := l.Stats(); s.Lookups != 1 || s.LookupsFailed != 0 || s.DeletesRewritten != 1 {
		t.Errorf("stats %+v", s)
	}
}
