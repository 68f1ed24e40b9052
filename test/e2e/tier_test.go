package e2e

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/test/cluster"
)

// A tier for a large cluster: node-local watchsans whose upstreams are two frontend watchsans
// in front of the apiserver, every node's informers of one principal (as every node's
// kube-proxy is its service account). Identical watches share one feed on each node and one
// upstream watch on each tier replica, and the loss of the frontend replica that carries the nodes'
// feeds (killed, then back on its address) costs no informer a relist, a re-watch or an error:
// each node-local resumes on the other replica from its last resourceVersion. The informers'
// watch-lists, with their own token, hand off onto the shared feeds once an access review
// allowed them (--share-reviewed-watch-lists, docs/design.md section 11).
func TestTierNodeLocalOverFrontends(t *testing.T) {
	c := newCluster(t, cluster.Options{})
	ns := resilienceNamespace(t, c, "tier")
	var ports [2]string
	for i := range ports {
		p, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = strconv.Itoa(p)
	}
	front := func(i int) *proxy {
		return startProxy(t, append(resilienceProxyArgs(c, 0), "--listen=127.0.0.1:"+ports[i], "--no-credentials", "--share-reviewed-watch-lists")...)
	}
	fronts := []*proxy{front(0), front(1)}
	for _, f := range fronts {
		waitUpstreamUp(t, f, c.APIServers[0].URL)
	}
	tierURL := func(i int) string { return "http://127.0.0.1:" + ports[i] }
	const nodes, perNode = 3, 2 // three nodes on two replicas: at least two share one
	var locals []*proxy
	for n := 0; n < nodes; n++ {
		p := startProxy(t, append(append([]string(nil), resilienceFlags...), "--upstream="+tierURL(0), "--upstream="+tierURL(1), "--no-credentials", "--share-reviewed-watch-lists")...)
		for i := range fronts {
			waitUpstreamUp(t, p, tierURL(i))
		}
		locals = append(locals, p)
	}
	var informers []*countingInformer
	for n, p := range locals {
		for i := 0; i < perNode; i++ {
			informers = append(informers, startCountingInformer(t, fmt.Sprintf("node%d-%d", n, i), resilienceClientConfig(c, p), ns))
		}
	}
	wr := newRecordingWriter(t, c, ns)
	m := wr.markerObject("shared")
	for _, w := range informers {
		w.waitSeen(t, m.Name, 10*time.Second)
	}
	upstreamWatches := func() string {
		s := ""
		for n, p := range locals {
			s += fmt.Sprintf("node%d: %v to tier0, %v to tier1, feeds %v subscribers %v; ", n,
				p.Metric("watchsan_upstream_open_watches", map[string]string{"upstream": tierURL(0)}),
				p.Metric("watchsan_upstream_open_watches", map[string]string{"upstream": tierURL(1)}),
				p.Metric("watchsan_shared_feeds", nil), p.Metric("watchsan_shared_feed_subscribers", nil))
		}
		for i, f := range fronts {
			s += fmt.Sprintf("tier%d: %v to the apiserver, feeds %v subscribers %v; ", i,
				f.Metric("watchsan_upstream_open_watches", nil), f.Metric("watchsan_shared_feeds", nil), f.Metric("watchsan_shared_feed_subscribers", nil))
		}
		return s
	}
	// Each node's informers hand their watch-lists off onto one shared feed once reviewed
	// (one upstream watch a node), and each tier replica shares the watches of the nodes on
	// it (one upstream watch a replica).
	shared := func() bool {
		for _, p := range locals {
			if p.Metric("watchsan_upstream_open_watches", nil) != 1 {
				return false
			}
		}
		for _, f := range fronts {
			if f.Metric("watchsan_upstream_open_watches", nil) > 1 {
				return false
			}
		}
		return true
	}
	if !testutil.Until(20*time.Second, shared) {
		t.Fatalf("not shared: %s", upstreamWatches())
	}
	t.Logf("before the loss: %s", upstreamWatches())
	carrier := -1
	for i := range fronts {
		if fronts[i].Metric("watchsan_upstream_open_watches", nil) > 0 {
			carrier = i
			break
		}
	}
	if carrier < 0 {
		t.Fatalf("no tier replica holds an upstream watch: %s", upstreamWatches())
	}
	_ = fronts[carrier].cmd.Process.Kill()
	<-fronts[carrier].exited
	lost := time.Now()
	after := wr.markerObject("after-the-loss")
	for _, w := range informers {
		w.waitSeen(t, after.Name, 30*time.Second)
	}
	t.Logf("every informer saw the write after the loss within %v", time.Since(lost).Round(time.Millisecond))
	fronts[carrier] = front(carrier)
	waitUpstreamUp(t, fronts[carrier], c.APIServers[0].URL)
	back := wr.markerObject("after-the-return")
	for _, w := range informers {
		w.waitSeen(t, back.Name, 30*time.Second)
	}
	if !testutil.Until(20*time.Second, shared) {
		t.Errorf("not shared after the return: %s", upstreamWatches())
	}
	t.Logf("after the return: %s", upstreamWatches())
	for _, w := range informers {
		w.requireUndisturbed(t)
	}
	for n, p := range locals {
		if got := p.Metric("watchsan_watch_relists_forced_total", nil); got != 0 {
			t.Errorf("node%d told %v clients to relist, want 0", n, got)
		}
	}
}
