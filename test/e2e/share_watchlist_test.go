package e2e

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/test/cluster"
)

// TestShareWatchListInformers: 20 client-go v0.37 informers of one namespace's
// configmaps, which use watch-list (sendInitialEvents=true), through watchsan with
// --share-watches. Each syncs on an upstream watch of its own, then at its initial-events-end
// bookmark hands off onto one shared feed, its own upstream watch closed: the apiserver ends
// with one watch of them (apiserver_longrunning_requests), watchsan with 20 subscribers of one
// feed. Every store then follows creates and a delete, and equals a fresh list, with no
// handler called twice for one change.
func TestShareWatchListInformers(t *testing.T) {
	e := newSanEnv(t, cluster.Options{})
	kubeconfig := filepath.Join(t.TempDir(), "direct.kubeconfig")
	if err := e.c.WriteKubeconfig(kubeconfig, e.c.APIServers[0].URL, e.c.AdminToken, e.c.CAFile); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, "--kubeconfig="+kubeconfig, "--share-watches")
	ctx := ctxT(t, 3*time.Minute)
	ns := e.namespace(t)
	for i := range 3 {
		e.createCM(t, ctx, ns, fmt.Sprintf("pre-%d", i))
	}
	// Namespaced configmap watches open at the apiserver, of anyone (the harness's own
	// components watch cluster-wide, if at all).
	upstream := func() float64 {
		raw, err := e.admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			t.Fatalf("reading the apiserver's metrics: %v", err)
		}
		return sumMetric(bytes.NewReader(raw), "apiserver_longrunning_requests",
			map[string]string{"verb": "WATCH", "resource": "configmaps", "scope": "namespace"})
	}
	base := upstream()
	const n = 20
	infs := make([]*sanInformer, n)
	for i := range infs {
		infs[i] = e.startInformer(t, p.URL, sanCodecJSON, ns)
	}
	for i, inf := range infs {
		eventually(t, sanSyncTimeout, fmt.Sprintf("informer %d to sync", i), inf.reg.HasSynced)
	}
	handedOff := func() float64 {
		return p.Metric("watchsan_shared_feed_handoffs_total", map[string]string{"result": "joined"}) +
			p.Metric("watchsan_shared_feed_handoffs_total", map[string]string{"result": "opened"})
	}
	eventually(t, 30*time.Second, fmt.Sprintf("%d watch-lists handed off", n), func() bool { return handedOff() == n })
	if got := p.Metric("watchsan_shared_feed_handoffs_total", map[string]string{"result": "opened"}); got != 1 {
		t.Errorf("handoffs that opened a feed: %v, want 1", got)
	}
	eventually(t, 30*time.Second, "one upstream watch for the informers", func() bool { return upstream() == base+1 })
	t.Logf("%d watch-list informers synced and handed off (joined %v, opened %v); namespaced configmap watches at the apiserver: %v before, %v after",
		n, p.Metric("watchsan_shared_feed_handoffs_total", map[string]string{"result": "joined"}),
		p.Metric("watchsan_shared_feed_handoffs_total", map[string]string{"result": "opened"}), base, upstream())
	if got := p.Metric("watchsan_shared_feed_subscribers", nil); got != n {
		t.Errorf("watchsan_shared_feed_subscribers %v, want %d", got, n)
	}
	for i, inf := range infs {
		ws := inf.wire.watchList()
		if len(ws) == 0 || ws[0].query.Get("sendInitialEvents") != "true" || !ws[0].sawInitialEventsEnd() {
			t.Fatalf("informer %d: did not sync by watch-list through watchsan (watches %v)", i, ws)
		}
	}

	for i := range 10 {
		e.createCM(t, ctx, ns, fmt.Sprintf("after-%d", i))
	}
	if err := e.admin.CoreV1().ConfigMaps(ns).Delete(ctx, "pre-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.createCM(t, ctx, ns, "last")
	deleted := map[string]bool{"pre-1": true}
	for i, inf := range infs {
		eventually(t, sanEventTimeout, fmt.Sprintf("informer %d to see the last create", i), func() bool {
			return inf.calls.count("add", "last") == 1
		})
		if v := e.storeVsList(t, &incident{ns: ns, inf: inf.inf}); len(v) > 0 {
			t.Errorf("informer %d: %s", i, strings.Join(v, "; "))
		}
		if v := append(inf.wire.violations(), inf.calls.violations(deleted)...); len(v) > 0 {
			t.Errorf("informer %d: %s", i, strings.Join(v, "; "))
		}
		if c := inf.calls.count("delete", "pre-1"); c != 1 {
			t.Errorf("informer %d: %d OnDelete for pre-1, want 1", i, c)
		}
	}
	if got := upstream(); got != base+1 {
		t.Errorf("%v namespaced configmap watches at the apiserver, want %v", got, base+1)
	}
	if got := p.Metric("watchsan_shared_feeds", nil); got != 1 {
		t.Errorf("watchsan_shared_feeds %v, want 1", got)
	}
}
