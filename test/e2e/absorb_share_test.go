package e2e

// Absorbing a 410 on a shared feed (docs/design.md sections 11 and 12): watchsan as a sidecar
// runs by default, sharing on and lending its identity, so a client-go informer's watch-list
// hands off onto a shared feed at its bookmark, and its re-watches join that feed. The feed
// holds the state the watch-list's private feed handed it, and absorbs a restarted
// apiserver's 410 for every subscriber at once.

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// absorbShareRestarts is how many times the watched apiserver is restarted.
const absorbShareRestarts = 4

// TestAbsorbGoneOnASharedFeed: watchsan with its default configuration (sharing on) lending the
// admin token's identity from a kubeconfig naming apiserver-0 alone, three informers of one
// namespace's configmaps through it, two in JSON (one feed) and a typed one in protobuf (a
// feed of its own: another Accept), each watch with timeoutSeconds=15, so they re-watch, and
// join their feed, during the test; apiserver-0 restarted four times, SIGKILL and SIGTERM
// alternating, the namespace changed on apiserver-1 while it is down (etcd moved on in every
// round, so every resume from before the restart is answered 410). After each restart every
// informer's store equals a fresh list; no informer relists, watchsan tells no client to
// relist, the 410s were absorbed by a shared feed (its log line says so) and re-watches joined
// it; the control, an informer direct to apiserver-0, relists.
func TestAbsorbGoneOnASharedFeed(t *testing.T) {
	c, ns, writer, ctx := absorbCluster(t, "absorb-share", "", 10*time.Minute)
	cms := writer.CoreV1().ConfigMaps(ns)

	kc := filepath.Join(t.TempDir(), "lent.kubeconfig")
	if err := c.WriteKubeconfig(kc, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, append([]string{"--kubeconfig=" + kc}, resilienceFlags...)...) // sharing on: the default
	cfg := resilienceClientConfig(c, p)
	cfg.BearerToken = ""
	jsonCfg := absorbJSON(cfg)
	var via []*countingInformer
	for i := range 2 {
		via = append(via, startCountingInformerWatching(t, fmt.Sprintf("watchsan, shared, informer %d", i), jsonCfg, ns, 15*time.Second))
	}
	// A typed informer (protobuf, the clientset's default): its own feed (another Accept),
	// whose state is protobuf frames.
	via = append(via, startCountingInformerWatching(t, "watchsan, shared, informer 2, protobuf", cfg, ns, 15*time.Second))
	direct := startCountingInformer(t, "control: direct to apiserver-0", c.RESTConfig(0, c.AdminToken), ns)
	all := append(slices.Clone(via), direct)
	eventually(t, 30*time.Second, "the informers' watch-lists to hand off onto shared feeds", func() bool {
		return p.Metric("watchsan_shared_feed_handoffs_total", map[string]string{"result": "opened"})+
			p.Metric("watchsan_shared_feed_handoffs_total", map[string]string{"result": "joined"}) == float64(len(via))
	})
	bump := writer.CoreV1().ConfigMaps("default")

	a := c.APIServers[0]
	started := time.Now()
	for round := range absorbShareRestarts {
		before := make([]int64, len(all))
		for i, w := range all {
			before[i] = w.relists()
		}
		stoppedAt := time.Now()
		sig := absorbStop(t, a, round)
		if _, err := bump.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "absorb-bump-"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		changes := absorbOutageChanges(t, ctx, cms, round)
		if err := a.Restart(ctxT(t, 2*time.Minute)); err != nil {
			t.Fatal(err)
		}
		want := absorbList(t, ctx, cms)
		for _, w := range via {
			eventually(t, 60*time.Second, fmt.Sprintf("round %d: %s's store to equal a fresh list", round, w.name), func() bool {
				return absorbStore(w) == want
			})
		}
		t.Logf("round %d (%v, changes: %s): the stores equal a fresh list %v after the stop; relists this round: %s", round, sig, changes,
			time.Since(stoppedAt).Round(time.Millisecond), absorbRelists(all, before))
	}
	t.Logf("%d restarts in %v", absorbShareRestarts, time.Since(started).Round(time.Second))

	for _, w := range all {
		t.Logf("%s", w.counts())
	}
	requireNoRelists(t, via, absorbShareRestarts, "restarts")
	requireWatchFormats(t, via)
	if n := direct.relists(); n == 0 {
		t.Errorf("%s never relisted: no restart was answered 410, so the test cannot tell absorbing from no 410", direct.name)
	}
	if n := p.Metric("watchsan_watch_relists_forced_total", nil); n != 0 {
		t.Errorf("watchsan told %v clients to relist, want 0", n)
	}
	joins := p.Metric("watchsan_shared_feed_joins_total", nil)
	var private []string
	for _, r := range []string{"initial-state", "watch-list", "resource-version", "not-covered", "backlog", "not-joinable", "feed-failed", "feed-limit"} {
		if n := p.Metric("watchsan_watch_private_feeds_total", map[string]string{"reason": r}); n != 0 {
			private = append(private, fmt.Sprintf("%s %v", r, n))
		}
	}
	rewatches := int64(0)
	for _, w := range via {
		rewatches += w.req.rewatches.Load()
	}
	shared := 0
	for _, l := range strings.Split(p.Log(), "\n") {
		if strings.Contains(l, "absorbed a 410") && strings.Contains(l, `"feed":`) {
			shared++
		}
	}
	t.Logf("watchsan: %s; joins %v (informers' re-watches %d); private feeds: [%s]; absorbs logged by a shared feed: %d", resumeSummary(p), joins, rewatches,
		strings.Join(private, ", "), shared)
	requireAbsorbed(t, p, "watchsan, shared")
	if shared == 0 {
		t.Errorf("no 410 was absorbed by a shared feed")
	}
	if joins == 0 {
		t.Errorf("no watch joined a shared feed: the informers' re-watches did not share")
	}
	if n := p.Metric("watchsan_watch_gone_absorbed_total", map[string]string{"outcome": "not-complete"}); n != 0 {
		t.Errorf("%v 410s met a feed without a complete state, want 0", n)
	}
}
