package e2e

// Absorbing a 410 (docs/design.md section 12): a restarted apiserver's watch cache begins at
// its start, so a quiet watch's resume from its last resourceVersion is answered "too old
// resource version", and a client watching the apiserver directly relists. Through watchsan
// the feed lists and diffs against the state it holds and sends only the difference, so the
// client never relists. Real client-go informers (watch-list, as client-go v0.37 starts by
// default), a real apiserver restarted ten times, SIGKILL and SIGTERM alternating, with
// creates, updates, deletes, a create-then-delete and a delete-and-recreate made on a second
// apiserver of the same etcd while the first one is down.
//
// What absorbs (docs/design.md section 12): a feed whose upstream watch began with the initial
// state (a watch-list) keeps a complete state, and a re-watch from exactly where such a watch
// ended adopts it. Shared feeds, which hold a state too, are absorb_share_test.go's; the
// informers here are the two watches that stay private with sharing on: a client's own token (its watch-list is private; its watches
// are given a timeout longer than the test, since a re-watch would join a shared feed), and
// the lent identity with --share-watches=false (re-watching every 20 s, so it also shows the
// state handed from one watch to the next). Each in JSON (as every client of a custom
// resource speaks), in protobuf (a typed clientset's default, client-go v0.37: most
// controllers) and in CBOR (the apiservers serve it: CBORServingAndStorage; client-go's
// ClientsAllowCBOR on).

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/watchsan/watchsan/test/cluster"
)

// absorbRestarts is how many times the watched apiserver is restarted (the ten).
const absorbRestarts = 10

// TestAbsorbGoneAcrossRestarts restarts apiserver-0 ten times, SIGKILL and SIGTERM alternating,
// with a quiet watch on a namespace's configmaps: watchsan in front of apiserver-0 alone, once
// with the clients' own token and once lending its identity without sharing. While apiserver-0 is down, apiserver-1
// (same etcd) changes the namespace in some rounds and only another namespace in the others, so
// every resume from before the restart is answered 410 by the restarted watch cache. After each
// restart every informer's store must equal a fresh list; through watchsan no informer relists,
// and its handlers see only the real changes (no resync updates); the direct informer (the
// control) relists.
func TestAbsorbGoneAcrossRestarts(t *testing.T) {
	c, ns, writer, ctx := absorbCluster(t, "absorb", "CBORServingAndStorage=true", 20*time.Minute)
	cms := writer.CoreV1().ConfigMaps(ns)

	own, lend, via := absorbInformers(t, c, ns, resilienceProxyArgs(c, 0), nil)
	direct := startCountingInformer(t, "control: direct to apiserver-0", c.RESTConfig(0, c.AdminToken), ns)
	all := append(slices.Clone(via), direct)
	bump := writer.CoreV1().ConfigMaps("default")

	a := c.APIServers[0]
	for round := range absorbRestarts {
		before := make([]int64, len(all))
		for i, w := range all {
			before[i] = w.relists()
		}
		stoppedAt := time.Now()
		sig := absorbStop(t, a, round)
		// The outage's changes, made on apiserver-1. Every round moves etcd on (another
		// namespace), so the restarted watch cache begins after every watch's resume point.
		if _, err := bump.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "absorb-bump-"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		changes := "none in the namespace"
		if round%2 == 0 || round == absorbRestarts-1 {
			changes = absorbOutageChanges(t, ctx, cms, round)
		}
		if err := a.Restart(ctxT(t, 2*time.Minute)); err != nil {
			t.Fatal(err)
		}
		want := absorbList(t, ctx, cms)
		// The control's store is not waited for: after a few relists client-go's backoff
		// (up to 30 s) holds it back, and all the test needs of it is its relists.
		for _, w := range via {
			eventually(t, 90*time.Second, fmt.Sprintf("round %d: %s's store to equal a fresh list", round, w.name), func() bool {
				return absorbStore(w) == want
			})
		}
		t.Logf("round %d (%v, changes: %s): watchsan's informers' stores equal a fresh list %v after the stop; relists this round: %s", round, sig, changes,
			time.Since(stoppedAt).Round(time.Millisecond), absorbRelists(all, before))
	}

	for _, w := range all {
		t.Logf("%s", w.counts())
	}
	requireNoRelists(t, via, absorbRestarts, "restarts")
	if n := direct.relists(); n == 0 {
		t.Errorf("%s never relisted: no restart was answered 410, so the test cannot tell absorbing from no 410", direct.name)
	}
	requireWatchFormats(t, via)
	for i, p := range []*proxy{own, lend} {
		if n := p.Metric("watchsan_watch_relists_forced_total", nil); n != 0 {
			t.Errorf("watchsan told %v clients to relist, want 0", n)
		}
		t.Logf("watchsan: %s", resumeSummary(p))
		requireAbsorbed(t, p, via[i].name)
	}
}

// absorbCluster starts the absorb tests' cluster: two apiservers, the first of which they
// restart (quickly: a 1 s shutdown delay, 6 s request timeout), with gates; namespace name
// seeded (absorbSeed); a writer of apiserver-1, which stays up; and the test's context.
func absorbCluster(t *testing.T, name, gates string, timeout time.Duration) (*cluster.Cluster, string, *kubernetes.Clientset, context.Context) {
	t.Helper()
	c := newCluster(t, cluster.Options{APIServers: 2, APIServerFlags: []string{"--shutdown-delay-duration=1s", "--request-timeout=6s"}, FeatureGates: gates})
	ns := resilienceNamespace(t, c, name)
	writer, err := kubernetes.NewForConfig(c.RESTConfig(1, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, timeout)
	absorbSeed(t, ctx, writer.CoreV1().ConfigMaps(ns))
	return c, ns, writer, ctx
}

// absorbSeed creates the configmaps the absorb tests' namespace starts with: keep-00 to keep-19
// (absorbOutageChanges updates and deletes them, one each round) and cycle-0 to cycle-4 (it
// deletes and recreates them).
func absorbSeed(t *testing.T, ctx context.Context, cms interface {
	Create(context.Context, *corev1.ConfigMap, metav1.CreateOptions) (*corev1.ConfigMap, error)
}) {
	t.Helper()
	var names []string
	for i := range 20 {
		names = append(names, fmt.Sprintf("keep-%02d", i))
	}
	for i := range 5 {
		names = append(names, fmt.Sprintf("cycle-%d", i))
	}
	for _, name := range names {
		if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"seq": "0"}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
}

// absorbStop stops the apiserver a for round r of a restart test: SIGKILL in even rounds,
// SIGTERM (a rolling restart's, waited for until it exits) in odd ones. It returns the signal.
func absorbStop(t *testing.T, a *cluster.APIServer, r int) syscall.Signal {
	t.Helper()
	if r%2 == 0 {
		if err := a.Kill(); err != nil {
			t.Fatal(err)
		}
		return syscall.SIGKILL
	}
	if err := a.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := a.Wait(ctxT(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	return syscall.SIGTERM
}

// requireNoRelists fails for every informer of via that relisted, or whose handlers got
// updates of unchanged objects (a relist's replay), through n faults of the kind what.
func requireNoRelists(t *testing.T, via []*countingInformer, n int, what string) {
	t.Helper()
	for _, w := range via {
		if r := w.relists(); r != 0 {
			t.Errorf("%s relisted %d times through %d %s, want 0", w.name, r, n, what)
		}
		if r := absorbResyncs(w); r != 0 {
			t.Errorf("%s: %d updates whose object did not change (a relist's replay), want 0", w.name, r)
		}
	}
}

// absorbOutageChanges makes, while the watched apiserver is down: a new configmap, an update of
// one unchanged since the informers listed (keep-<round>), a delete of another such one
// (keep-<19-round>), a create-then-delete (in no list: no client may see it) and, in even
// rounds, a delete-and-recreate (cycle-<round/2>: the same name with a new uid). It says what
// it did.
func absorbOutageChanges(t *testing.T, ctx context.Context, cms interface {
	Create(context.Context, *corev1.ConfigMap, metav1.CreateOptions) (*corev1.ConfigMap, error)
	Get(context.Context, string, metav1.GetOptions) (*corev1.ConfigMap, error)
	Update(context.Context, *corev1.ConfigMap, metav1.UpdateOptions) (*corev1.ConfigMap, error)
	Delete(context.Context, string, metav1.DeleteOptions) error
}, round int) string {
	t.Helper()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("round %d: %s: %v", round, what, err)
		}
	}
	seq := fmt.Sprint(round + 1)
	_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "new-" + seq}, Data: map[string]string{"seq": seq}}, metav1.CreateOptions{})
	must("create", err)
	cur, err := cms.Get(ctx, fmt.Sprintf("keep-%02d", round), metav1.GetOptions{})
	must("get", err)
	cur.Data = map[string]string{"seq": seq}
	_, err = cms.Update(ctx, cur, metav1.UpdateOptions{})
	must("update", err)
	must("delete", cms.Delete(ctx, fmt.Sprintf("keep-%02d", 19-round), metav1.DeleteOptions{}))
	_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "brief-" + seq}}, metav1.CreateOptions{})
	must("create brief", err)
	must("delete brief", cms.Delete(ctx, "brief-"+seq, metav1.DeleteOptions{}))
	again := fmt.Sprintf("cycle-%d", round/2)
	if round%2 == 0 { // cycle-0..4, each once
		must("delete to recreate", cms.Delete(ctx, again, metav1.DeleteOptions{}))
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: again}, Data: map[string]string{"seq": seq}}, metav1.CreateOptions{})
		must("recreate", err)
		return "create, update, delete, create-then-delete, delete-and-recreate " + again
	}
	return "create, update, delete, create-then-delete"
}

// absorbList is the namespace's configmaps as a fresh list on apiserver-1 gives them:
// name/uid/resourceVersion, sorted.
func absorbList(t *testing.T, ctx context.Context, cms interface {
	List(context.Context, metav1.ListOptions) (*corev1.ConfigMapList, error)
}) string {
	t.Helper()
	l, err := cms.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, cm := range l.Items {
		keys = append(keys, cm.Name+"/"+string(cm.UID)+"/"+cm.ResourceVersion)
	}
	slices.Sort(keys)
	return strings.Join(keys, " ")
}

// absorbStore is w's store in absorbList's form.
func absorbStore(w *countingInformer) string {
	var keys []string
	for _, o := range w.informer.GetStore().List() {
		if cm, ok := o.(*corev1.ConfigMap); ok {
			keys = append(keys, cm.Name+"/"+string(cm.UID)+"/"+cm.ResourceVersion)
		}
	}
	slices.Sort(keys)
	return strings.Join(keys, " ")
}

// absorbResyncs counts the updates w's handlers got whose old and new object had the same
// resourceVersion: what a relist replays for every object that did not change.
func absorbResyncs(w *countingInformer) int {
	n := 0
	for _, e := range w.history() {
		if e.Resync {
			n++
		}
	}
	return n
}

// absorbRelists says how many times each informer relisted since before.
func absorbRelists(all []*countingInformer, before []int64) string {
	var s []string
	for i, w := range all {
		s = append(s, fmt.Sprintf("%s %d", w.name, w.relists()-before[i]))
	}
	return strings.Join(s, ", ")
}

// TestAbsorbGoneRollingRestart rolls three apiservers (SIGTERM, drained, restarted, the next)
// with quiet watches through watchsan in front of all three, the namespace changed while each
// is down; then SIGKILLs all three at once, etcd having moved on after the watches' last
// event, and restarts them. A quiet watch's resume point is then older than every watch
// cache, so its resume is answered 410 wherever it goes: through watchsan no client relists,
// at least one 410 was absorbed, and every store equals a fresh list after each step. The
// control, direct to apiserver-0, relists.
func TestAbsorbGoneRollingRestart(t *testing.T) {
	c := newCluster(t, cluster.Options{APIServers: 3, APIServerFlags: []string{"--shutdown-delay-duration=1s", "--request-timeout=6s"}, FeatureGates: "CBORServingAndStorage=true"})
	ns := resilienceNamespace(t, c, "absorb-roll")
	ctx := ctxT(t, 10*time.Minute)
	clients := make([]kubernetes.Interface, len(c.APIServers))
	for i := range c.APIServers {
		cs, err := kubernetes.NewForConfig(c.RESTConfig(i, c.AdminToken))
		if err != nil {
			t.Fatal(err)
		}
		clients[i] = cs
	}
	for i := range 25 {
		name := fmt.Sprintf("keep-%02d", i)
		if i >= 20 {
			name = fmt.Sprintf("cycle-%d", i-20)
		}
		if _, err := clients[0].CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"seq": "0"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	lendUps := []string{"--upstream-ca-file=" + c.CAFile}
	for i, a := range c.APIServers {
		lendUps = append(lendUps, "--upstream="+a.URL)
		if i > 0 { // the kubeconfig names apiserver-0
			lendUps = append(lendUps, "--allow-credentials-to-upstream="+a.URL)
		}
	}
	p, lend, via := absorbInformers(t, c, ns, resilienceProxyArgs(c, 0, 1, 2), lendUps)
	direct := startCountingInformer(t, "control: direct to apiserver-0", c.RESTConfig(0, c.AdminToken), ns)
	all := append(slices.Clone(via), direct)

	for i, a := range c.APIServers {
		up := clients[(i+1)%len(clients)]
		if err := a.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := a.Wait(ctxT(t, time.Minute)); err != nil {
			t.Fatal(err)
		}
		if _, err := up.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "absorb-bump-"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		changes := absorbOutageChanges(t, ctx, up.CoreV1().ConfigMaps(ns), i)
		if err := a.Restart(ctxT(t, 2*time.Minute)); err != nil {
			t.Fatal(err)
		}
		for _, px := range []*proxy{p, lend} {
			waitUpstreamUp(t, px, a.URL)
		}
		want := absorbList(t, ctx, up.CoreV1().ConfigMaps(ns))
		for _, w := range via {
			eventually(t, 90*time.Second, fmt.Sprintf("apiserver-%d rolled: %s's store to equal a fresh list", i, w.name), func() bool {
				return absorbStore(w) == want
			})
		}
		t.Logf("apiserver-%d rolled (changes: %s)", i, changes)
	}
	// A SIGTERMed apiserver sends its watchers a bookmark at etcd's revision before it stops,
	// and a change made on a live apiserver reaches the watches at once, so the rolling
	// restart may well leave every watch a resume point every watch cache still covers (then
	// no 410 is there to absorb, and none may reach a client). So last the whole control plane
	// goes down at once, etcd having moved on after the watches' last event: each restarted
	// watch cache begins after every watch's resume point.
	if _, err := clients[0].CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "absorb-bump-"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, a := range c.APIServers {
		if err := a.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range c.APIServers {
		if err := a.Restart(ctxT(t, 2*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	// And the absorb's difference: a change after the restart.
	absorbOutageChanges(t, ctx, clients[0].CoreV1().ConfigMaps(ns), 4)
	want := absorbList(t, ctx, clients[0].CoreV1().ConfigMaps(ns))
	for _, w := range via {
		eventually(t, 90*time.Second, "after the kills: "+w.name+"'s store to equal a fresh list", func() bool { return absorbStore(w) == want })
	}
	for _, w := range all {
		t.Logf("%s", w.counts())
	}
	for _, w := range via {
		if n := w.relists(); n != 0 {
			t.Errorf("%s relisted %d times, want 0", w.name, n)
		}
		if r := absorbResyncs(w); r != 0 {
			t.Errorf("%s: %d updates whose object did not change, want 0", w.name, r)
		}
	}
	if direct.relists() == 0 {
		t.Errorf("%s never relisted: the rolling restart answered no resume 410", direct.name)
	}
	requireWatchFormats(t, via)
	for i, px := range []*proxy{p, lend} {
		if n := px.Metric("watchsan_watch_relists_forced_total", nil); n != 0 {
			t.Errorf("watchsan told %v clients to relist, want 0", n)
		}
		t.Logf("watchsan: %s", resumeSummary(px))
		requireAbsorbed(t, px, via[i].name)
	}
}

// absorbInformers starts the two watchsans of the absorb tests and an informer through each in
// each format (via: own's and lend's in JSON, then in protobuf, then in CBOR): own (ownArgs,
// the clients' own admin token, sharing on as by default; the informers' watches time out
// after 15 minutes, longer than the test) and lend (lending the admin token from a kubeconfig
// naming apiserver-0, plus lendArgs, with --share-watches=false; the informers re-watch every
// 20 s). The apiservers must serve CBOR (CBORServingAndStorage).
func absorbInformers(t *testing.T, c *cluster.Cluster, ns string, ownArgs, lendArgs []string) (own, lend *proxy, via []*countingInformer) {
	t.Helper()
	own = startProxy(t, ownArgs...)
	kc := filepath.Join(t.TempDir(), "lent.kubeconfig")
	if err := c.WriteKubeconfig(kc, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	lend = startProxy(t, append(append([]string{"--kubeconfig=" + kc, "--share-watches=false"}, resilienceFlags...), lendArgs...)...)
	lendCfg := resilienceClientConfig(c, lend)
	lendCfg.BearerToken = ""
	ownCfg := resilienceClientConfig(c, own)
	ownJSON, lendJSON := absorbJSON(ownCfg), absorbJSON(lendCfg)
	enableCBORClients(t)
	ownCBOR, lendCBOR := absorbCBOR(ownCfg), absorbCBOR(lendCfg)
	via = []*countingInformer{
		startCountingInformerWatching(t, "watchsan, own token", ownJSON, ns, 15*time.Minute),
		startCountingInformerWatching(t, "watchsan, lent identity, no sharing", lendJSON, ns, 20*time.Second),
		// The clientset's default content type: protobuf.
		startCountingInformerWatching(t, "watchsan, own token, protobuf", ownCfg, ns, 15*time.Minute),
		startCountingInformerWatching(t, "watchsan, lent identity, no sharing, protobuf", lendCfg, ns, 20*time.Second),
		startCountingInformerWatching(t, "watchsan, own token, cbor", ownCBOR, ns, 15*time.Minute),
		startCountingInformerWatching(t, "watchsan, lent identity, no sharing, cbor", lendCBOR, ns, 20*time.Second),
	}
	return own, lend, via
}

// absorbJSON is cfg with its clients speaking JSON, as every client of a custom resource does
// (a clientset's built-in types default to protobuf, client-go v0.37).
func absorbJSON(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = "application/json"
	cfg.AcceptContentTypes = "application/json"
	return cfg
}

// absorbCBOR is cfg with its clients speaking CBOR (enableCBORClients first).
func absorbCBOR(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = "application/cbor"
	cfg.AcceptContentTypes = "application/cbor"
	return cfg
}

// requireWatchFormats fails unless every watch of each informer of via was answered in the
// format its name says (JSON unless "protobuf" or "cbor"): an informer that fell back to JSON
// would not show another format's absorbing.
func requireWatchFormats(t *testing.T, via []*countingInformer) {
	t.Helper()
	for _, w := range via {
		want := "application/json"
		switch {
		case strings.Contains(w.name, "protobuf"):
			want = "application/vnd.kubernetes.protobuf;stream=watch"
		case strings.Contains(w.name, "cbor"):
			want = "application/cbor-seq"
		}
		w.req.mu.Lock()
		types := maps.Clone(w.req.watchTypes)
		w.req.mu.Unlock()
		if len(types) != 1 || types[want] == 0 {
			t.Errorf("%s: watches answered %v, want all %s", w.name, types, want)
		}
	}
}

// requireAbsorbed fails unless watchsan p absorbed at least one 410: a test whose restarts
// answered no resume 410 through p could not tell absorbing from nothing to absorb.
func requireAbsorbed(t *testing.T, p *proxy, name string) {
	t.Helper()
	n := p.Metric("watchsan_watch_gone_absorbed_total", map[string]string{"outcome": "absorbed"})
	t.Logf("%s: 410s absorbed %v; events synthesized: ADDED %v, MODIFIED %v, DELETED %v; 410s not absorbed: not-complete %v, format %v, over-budget %v, list-failed %v", name, n,
		p.Metric("watchsan_watch_absorb_events_total", map[string]string{"type": "ADDED"}),
		p.Metric("watchsan_watch_absorb_events_total", map[string]string{"type": "MODIFIED"}),
		p.Metric("watchsan_watch_absorb_events_total", map[string]string{"type": "DELETED"}),
		p.Metric("watchsan_watch_gone_absorbed_total", map[string]string{"outcome": "not-complete"}),
		p.Metric("watchsan_watch_gone_absorbed_total", map[string]string{"outcome": "format"}),
		p.Metric("watchsan_watch_gone_absorbed_total", map[string]string{"outcome": "over-budget"}),
		p.Metric("watchsan_watch_gone_absorbed_total", map[string]string{"outcome": "list-failed"}))
	if n < 1 {
		t.Errorf("%s absorbed no 410", name)
	}
	// JSON, protobuf and CBOR feeds absorb alike (docs/design.md section 12): none refused by
	// format.
	if f := p.Metric("watchsan_watch_gone_absorbed_total", map[string]string{"outcome": "format"}); f != 0 {
		t.Errorf("%s: %v 410s not absorbed for their format, want 0", name, f)
	}
}
