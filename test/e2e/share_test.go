package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/test/cluster"
)

// TestShareFanOut is issue 15's fan-out measurement: 300 clients of the lent identity watch
// the same configmaps from the same resourceVersion through watchsan, then 300 configmaps are
// written. With --share-watches the real kube-apiserver holds one watch of them (at most 5
// asserted), without it one per client, in the same run, and every client gets all 300
// writes either way. It logs the apiserver's open WATCH requests of configmaps
// (apiserver_longrunning_requests) and watchsan's own feed metrics for each.
func TestShareFanOut(t *testing.T) {
	const clients, writes = 300, 300
	c := newCluster(t, cluster.Options{})
	dir := t.TempDir()
	direct := filepath.Join(dir, "direct.kubeconfig")
	if err := c.WriteKubeconfig(direct, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	cfg := c.RESTConfig(0, c.AdminToken)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	apiHTTP, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := resilienceNamespace(t, c, "fanout")
	apiMetric := func(name string, labels map[string]string) float64 {
		t.Helper()
		resp, err := apiHTTP.Get(c.APIServers[0].URL + "/metrics")
		if err != nil {
			t.Fatalf("the apiserver's metrics: %v", err)
		}
		defer resp.Body.Close()
		return sumMetric(resp.Body, name, labels)
	}
	apiWatches := func() float64 {
		return apiMetric("apiserver_longrunning_requests", map[string]string{"verb": "WATCH", "resource": "configmaps"})
	}

	for _, share := range []bool{true, false} {
		name := map[bool]string{true: "on", false: "off"}[share]
		args := []string{"--kubeconfig=" + direct}
		if share {
			args = append(args, "--share-watches")
		}
		p := startProxy(t, args...)
		ctx := ctxT(t, 5*time.Minute)
		list, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		base, apiCPU, ownCPU := apiWatches(), apiMetric("process_cpu_seconds_total", nil), p.Metric("process_cpu_seconds_total", nil)
		wctx, stop := context.WithCancel(ctx)
		tr := &http.Transport{}
		var got []*atomic.Int32
		var wg sync.WaitGroup
		for i := 0; i < clients; i++ {
			n := &atomic.Int32{}
			got = append(got, n)
			req, _ := http.NewRequestWithContext(wctx, http.MethodGet, fmt.Sprintf("%s/api/v1/namespaces/%s/configmaps?watch=true&allowWatchBookmarks=true&resourceVersion=%s",
				p.URL, ns, list.ResourceVersion), nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("sharing %s: watch %d: %v", name, i, err)
			}
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("sharing %s: watch %d: %s %s", name, i, resp.Status, b)
			}
			wg.Add(1)
			go func() { // ends with wctx
				defer wg.Done()
				defer resp.Body.Close()
				countWrites(resp.Body, "fan-"+name+"-", n)
			}()
		}
		if !testutil.Until(30*time.Second, func() bool { return p.Metric("watchsan_open_watches", nil) == clients }) {
			t.Fatalf("sharing %s: %v client watches open at watchsan, want %d", name, p.Metric("watchsan_open_watches", nil), clients)
		}
		upstream := apiWatches() - base

		start := time.Now()
		writeConfigMaps(t, cs, ns, "fan-"+name+"-", writes)
		wrote := time.Since(start)
		all := func() bool {
			for _, n := range got {
				if n.Load() < writes {
					return false
				}
			}
			return true
		}
		if !testutil.Until(2*time.Minute, all) {
			short := 0
			for _, n := range got {
				if n.Load() < writes {
					short++
				}
			}
			t.Errorf("sharing %s: %d of %d clients did not get all %d writes within 2m", name, short, clients, writes)
		}
		delivered := time.Since(start)
		t.Logf("sharing %s: %d clients from resourceVersion %s: the apiserver holds %v more WATCH requests of configmaps (%v before); %d writes took %v, every client had them after %v",
			name, clients, list.ResourceVersion, upstream, base, writes, wrote.Round(time.Millisecond), delivered.Round(time.Millisecond))
		t.Logf("sharing %s: watchsan: shared feeds %v, subscribers %v, joins %v, private feeds %v, open watches %v; CPU from before the watches opened until now: apiserver %.2fs, watchsan %.2fs; watchsan RSS %.0f MiB",
			name, p.Metric("watchsan_shared_feeds", nil), p.Metric("watchsan_shared_feed_subscribers", nil),
			p.Metric("watchsan_shared_feed_joins_total", nil), p.Metric("watchsan_watch_private_feeds_total", nil), p.Metric("watchsan_open_watches", nil),
			apiMetric("process_cpu_seconds_total", nil)-apiCPU, p.Metric("process_cpu_seconds_total", nil)-ownCPU,
			p.Metric("process_resident_memory_bytes", nil)/(1<<20))
		if share {
			feeds := debugFeeds(t, p)
			t.Logf("sharing on: /debug/feeds: %s", feeds)
			if upstream > 5 {
				t.Errorf("sharing on: the apiserver holds %v WATCH requests of configmaps for %d identical client watches, want at most 5", upstream, clients)
			}
			if !strings.Contains(feeds, fmt.Sprintf(`"subscribers": %d`, clients)) {
				t.Errorf("sharing on: /debug/feeds lists no feed with %d subscribers", clients)
			}
		} else if upstream < clients {
			t.Errorf("sharing off: the apiserver holds %v WATCH requests of configmaps for %d client watches, want one each", upstream, clients)
		}
		stop()
		wg.Wait()
		tr.CloseIdleConnections()
		_ = p.Stop()
		// The next phase counts from what the apiserver holds without this one's watches.
		if !testutil.Until(30*time.Second, func() bool { return apiWatches() <= base }) {
			t.Logf("sharing %s: the apiserver still holds %v WATCH requests of configmaps 30s after watchsan stopped (%v before)", name, apiWatches(), base)
		}
	}
}

// countWrites reads a JSON watch stream and counts in n the ADDED events of objects named
// with prefix, until the stream ends.
func countWrites(r io.Reader, prefix string, n *atomic.Int32) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var ev struct {
			Type   string
			Object struct {
				Metadata struct{ Name string }
			}
		}
		if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Type == "ADDED" && strings.HasPrefix(ev.Object.Metadata.Name, prefix) {
			n.Add(1)
		}
	}
}

// writeConfigMaps creates n configmaps named prefix0.. in ns, 10 at a time.
func writeConfigMaps(t *testing.T, cs kubernetes.Interface, ns, prefix string, n int) {
	t.Helper()
	ctx := ctxT(t, 2*time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := atomic.Int32{}
	for w := 0; w < 10; w++ {
		wg.Add(1)
		go func() { // ends when every configmap is written
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s%d", prefix, i)}, Data: map[string]string{"i": fmt.Sprint(i)}}
				if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("writing configmaps: %v", err)
	}
}

// debugFeeds returns watchsan's /debug/feeds.
func debugFeeds(t *testing.T, p *proxy) string {
	t.Helper()
	resp, err := http.Get(p.AdminURL + "/debug/feeds")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/debug/feeds: %s %v", resp.Status, err)
	}
	return string(b)
}
