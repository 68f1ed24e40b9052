package e2e

// Absorbing a 410 forced by etcd compaction (docs/design.md section 12): with the
// watch cache off for configmaps (--watch-cache-sizes=configmaps#0) every watch of them is
// served by etcd itself, so a resume point etcd compacted away is answered 410 by every
// apiserver, not only by a restarted watch cache. What ends the watch matters:
//
//   - Compaction alone does not end a live watch. etcd compacts only history: a watcher that
//     is caught up (synced) keeps receiving events; only an unsynced watcher whose next
//     revision was compacted gets a compacted response and is cancelled (etcd's
//     watchableStore, `chooseAll`/`ErrCompacted`), which kube-apiserver's etcd3 watcher turns
//     into ERROR 410 "The resourceVersion for the provided watch is too old." An apiserver
//     watch of one namespace's configmaps keeps up with etcd on loopback, so the test asserts
//     the live case: a compaction at the current revision leaves every watch running (no
//     resume, no re-watch, the next change delivered).
//   - So the test breaks the watches itself, as an outage does: the fault layer in front of the
//     apiserver refuses new watches (503) and cuts every connection; while they are out the
//     namespace changes and etcd is compacted at its current revision; then the layer lets
//     watches through again. Every resume is from a compacted revision.
//
// --etcd-compaction-interval=0 turns the apiserver's own compaction (every 5 minutes, to the
// revision of the previous round) off: only the test's compactions happen, at known points.

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/internal/faults"
	"github.com/watchsan/watchsan/test/cluster"
)

// absorbCompactions is how many outage-and-compaction cycles TestAbsorbGoneCompaction runs.
const absorbCompactions = 3

// TestAbsorbGoneCompaction: quiet JSON informers of a namespace's configmaps (watch cache off),
// two through watchsan (the clients' own token, and the lent identity without sharing, as in
// TestAbsorbGoneAcrossRestarts) and one direct (the control), all through one fault layer in
// front of the apiserver. Three times: a compaction with the watches live (nothing may
// happen), then an outage of the layer during which the namespace changes (create, update,
// delete, create-then-delete, a delete-and-recreate) and etcd is compacted, then the layer
// lets watches through. Every resume is answered 410: watchsan absorbs it (each watchsan at
// least once per cycle, none told a client to relist), its informers never relist, their
// stores equal a fresh list, and their handlers saw exactly the real changes; the control
// relists every cycle.
func TestAbsorbGoneCompaction(t *testing.T) {
	c := newCluster(t, cluster.Options{APIServerFlags: []string{"--watch-cache-sizes=configmaps#0", "--etcd-compaction-interval=0"}})
	ns := resilienceNamespace(t, c, "absorb-compact")
	writer, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 5*time.Minute)
	cms := writer.CoreV1().ConfigMaps(ns)
	absorbSeed(t, ctx, cms)

	front := newFaultedAPIServer(t, c, 0)
	// With the watch cache off an apiserver sends no bookmarks, so resilienceFlags' short stall
	// timeout would resume these quiet watches every few seconds on its own schedule, racing the
	// live compaction (seen in CI: a stall resume in a live phase). The outage cuts the
	// connections, so no stall timer is needed to see it.
	flags := append(slices.Clone(resilienceFlags), "--watch-stall-timeout=10m") // the last one given counts
	ups := []string{"--upstream=" + front.URL, "--upstream-ca-file=" + front.CAFile}
	own := startProxy(t, append(ups, flags...)...)
	kc := filepath.Join(t.TempDir(), "lent.kubeconfig")
	if err := c.WriteKubeconfig(kc, front.URL, c.AdminToken, front.CAFile); err != nil {
		t.Fatal(err)
	}
	lend := startProxy(t, append([]string{"--kubeconfig=" + kc, "--share-watches=false"}, flags...)...)
	ownCfg, lendCfg, directCfg := resilienceClientConfig(c, own), resilienceClientConfig(c, lend), front.directConfig(c)
	lendCfg.BearerToken = ""
	ownCfg, lendCfg, directCfg = absorbJSON(ownCfg), absorbJSON(lendCfg), absorbJSON(directCfg)
	via := []*countingInformer{
		startCountingInformerWatching(t, "watchsan, own token", ownCfg, ns, 15*time.Minute),
		startCountingInformerWatching(t, "watchsan, lent identity, no sharing", lendCfg, ns, 20*time.Second),
	}
	proxies := []*proxy{own, lend}
	direct := startCountingInformerWatching(t, "control: direct (through the layer)", directCfg, ns, 15*time.Minute)
	all := append(slices.Clone(via), direct)
	for _, w := range via {
		if n := w.req.watchLists.Load(); n != 1 {
			t.Fatalf("%s began with %d watch-lists, want 1: without the initial state watchsan keeps none to absorb with (%s)", w.name, n, w.counts())
		}
	}

	absorbed := func(p *proxy) float64 {
		return p.Metric("watchsan_watch_gone_absorbed_total", map[string]string{"outcome": "absorbed"})
	}
	for round := range absorbCompactions {
		before := make([]int64, len(all))
		seenBefore := make([]int, len(all))
		for i, w := range all {
			before[i], seenBefore[i] = w.relists(), len(w.history())
		}
		absorbedBefore := []float64{absorbed(own), absorbed(lend)}
		resumesBefore := []float64{own.Metric("watchsan_watch_resumes_total", nil), lend.Metric("watchsan_watch_resumes_total", nil)}
		rewatchesBefore := direct.req.rewatches.Load()

		// A compaction with every watch live and caught up ends none of them, though it
		// compacts their resume points: a write elsewhere first moves etcd past the watches'
		// last event (and past the last compaction, which etcd would refuse to repeat).
		if _, err := writer.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "absorb-bump-"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		compactEtcd(t, c, etcdRevision(t, ctx, cms))
		live := fmt.Sprintf("live-%d", round)
		if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: live}, Data: map[string]string{"seq": "live"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, w := range all {
			w.waitSeen(t, live, 30*time.Second)
		}
		for i, p := range proxies {
			if got := p.Metric("watchsan_watch_resumes_total", nil); got != resumesBefore[i] {
				t.Errorf("round %d: a compaction with the watches live made %s resume (%v resumes, before %v): etcd ended a live watch", round, via[i].name, got, resumesBefore[i])
			}
		}
		if got := direct.req.rewatches.Load(); got != rewatchesBefore {
			t.Errorf("round %d: a compaction with the watches live made the control re-watch (%s)", round, direct.counts())
		}

		// The outage: no watch gets through, every running one is cut; meanwhile the namespace
		// changes and etcd is compacted at its current revision, past every resume point.
		refusedBefore := front.layer.Stats().Refused503
		front.set(t, faults.Faults{Fail503FirstK: 1 << 30})
		front.cutConnections()
		changes := absorbOutageChanges(t, ctx, cms, round)
		rev := etcdRevision(t, ctx, cms)
		compactEtcd(t, c, rev)
		// Every watch must have been refused at least once (the outage was seen) before the
		// layer lets them through: two watchsans and the control.
		eventually(t, 30*time.Second, "every resume to meet the outage", func() bool {
			return front.layer.Stats().Refused503-refusedBefore >= int64(len(all))
		})
		front.set(t, faults.Faults{})

		want := absorbList(t, ctx, cms)
		for _, w := range via {
			eventually(t, 60*time.Second, fmt.Sprintf("round %d: %s's store to equal a fresh list", round, w.name), func() bool {
				return absorbStore(w) == want
			})
		}
		eventually(t, 60*time.Second, fmt.Sprintf("round %d: the control to relist", round), func() bool {
			return direct.relists() > before[len(all)-1]
		})
		wantEvents := absorbCycleEvents(t, round, live)
		for i, w := range via {
			if got := cycleEvents(w.history()[seenBefore[i]:]); got != wantEvents {
				t.Errorf("round %d: %s's handlers saw\n  %s\nwant the real changes\n  %s", round, w.name, got, wantEvents)
			}
		}
		for i, p := range proxies {
			eventually(t, 30*time.Second, fmt.Sprintf("round %d: %s to count its absorbed 410", round, via[i].name), func() bool {
				return absorbed(p) > absorbedBefore[i]
			})
		}
		t.Logf("round %d: compacted at %s during the outage (changes: %s); 410s absorbed this round: own %v, lent %v; relists this round: %s", round, rev, changes,
			absorbed(own)-absorbedBefore[0], absorbed(lend)-absorbedBefore[1], absorbRelists(all, before))
	}

	for _, w := range all {
		t.Logf("%s", w.counts())
	}
	requireNoRelists(t, via, absorbCompactions, "compactions")
	requireWatchFormats(t, via)
	if n := direct.relists(); n < absorbCompactions {
		t.Errorf("%s relisted %d times through %d compactions, want one each", direct.name, n, absorbCompactions)
	}
	t.Logf("control: %d updates whose object did not change (its relists' replays)", absorbResyncs(direct))
	for i, p := range proxies {
		if n := p.Metric("watchsan_watch_relists_forced_total", nil); n != 0 {
			t.Errorf("%s: watchsan told %v clients to relist, want 0", via[i].name, n)
		}
		t.Logf("watchsan: %s", resumeSummary(p))
		requireAbsorbed(t, p, via[i].name)
		// The 410s were etcd's compaction (the etcd3 watcher's message), not a watch cache's
		// "too old resource version: R (F)".
		if n := strings.Count(p.Log(), etcdCompacted410); n < absorbCompactions {
			t.Errorf("%s: %d log lines with %q, want one per compaction (%d)", via[i].name, n, etcdCompacted410, absorbCompactions)
		}
	}
}

// etcdCompacted410 is the message of the 410 kube-apiserver's etcd3 watcher sends for a watch
// from a revision etcd compacted (etcd's ErrCompacted, interpretWatchError in
// k8s.io/apiserver/pkg/storage/etcd3).
const etcdCompacted410 = "The resourceVersion for the provided watch is too old."

// etcdRevision is etcd's current revision, as a consistent list of cms gives it (served by
// etcd: its resourceVersion is the revision etcd read at).
func etcdRevision(t testing.TB, ctx context.Context, cms interface {
	List(context.Context, metav1.ListOptions) (*corev1.ConfigMapList, error)
}) string {
	t.Helper()
	l, err := cms.List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	return l.ResourceVersion
}

// absorbCycleEvents is what a client that missed nothing sees in round r of
// TestAbsorbGoneCompaction, in cycleEvents' form: the live change, then absorbOutageChanges'
// (no event for the create-then-delete: it is in no list).
func absorbCycleEvents(t *testing.T, r int, live string) string {
	t.Helper()
	seq := fmt.Sprint(r + 1)
	evs := []string{"ADDED " + live, "ADDED new-" + seq, fmt.Sprintf("MODIFIED keep-%02d", r), fmt.Sprintf("DELETED keep-%02d", 19-r)}
	if r%2 == 0 {
		again := fmt.Sprintf("cycle-%d", r/2)
		evs = append(evs, "DELETED "+again, "ADDED "+again)
	}
	slices.Sort(evs)
	return strings.Join(evs, ", ")
}

// cycleEvents renders a handler history as "TYPE name", sorted (the absorb sends its deletes
// first and the rest in resourceVersion order; what matters here is which events came).
func cycleEvents(h []cmChange) string {
	var evs []string
	for _, e := range h {
		evs = append(evs, e.Type+" "+e.Name)
	}
	slices.Sort(evs)
	return strings.Join(evs, ", ")
}
