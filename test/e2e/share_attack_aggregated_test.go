package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/test/cluster"
)

// Finding 4: an aggregated API may answer each user other objects (notesAPI: each its own
// notes), so "every identity allowed to watch a scope gets the same events" does not hold for
// it. alice and bob may both watch notes (RBAC); alice's watch through watchsan is open from
// resourceVersion X; bob's from X must get his notes only, exactly what his direct watch gets,
// whether watchsan lends no identity (frontend mode) or lends one that may read APIServices
// (alice and bob still send their own tokens).
func TestShareAttackAggregatedAPIFiltersByUser(t *testing.T) {
	c := newCluster(t, cluster.Options{AggregatorProxyClient: true})
	admin := adminClient(t, c)
	ctx := ctxT(t, 3*time.Minute)
	api := startNotesAPI(t, c)
	api.register(t, ctx, c, admin)
	const ns = "notes-users"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{"alice": saToken(t, ctx, admin, ns, "alice"), "bob": saToken(t, ctx, admin, ns, "bob")}
	notesReaders(t, ctx, admin, ns, "alice", "bob")
	aliceUser, bobUser := serviceAccountUser(ns, "alice"), serviceAccountUser(ns, "bob")
	direct := directClient(t, c)
	pollServer(t, 20*time.Second, "bob allowed to watch notes directly", func() bool {
		return ask(t, ctx, direct, c.APIServers[0].URL+notesPath+"?watch=1", header("Authorization", "Bearer "+tokens["bob"]), 0, 0).code == http.StatusOK
	})
	kc := lentKubeconfig(t, c)

	for _, mode := range []struct {
		name string
		args []string
	}{
		{"own-tokens", frontendArgs(c)},
		{"lent-identity", []string{"--kubeconfig=" + kc, "--share-watches", "--log-level=info"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			p := startProxy(t, mode.args...)
			waitUpstreamUp(t, p, c.APIServers[0].URL)
			x := api.resourceVersion()
			path := notesPath + "?watch=1&resourceVersion=" + x
			alice := openSharedWatch(t, ctx, nil, p.URL+path, tokens["alice"])
			note := func(n string) string { return mode.name + "-" + n }
			api.put(note("a1"), aliceUser)
			api.put(note("b1"), bobUser)
			eventually(t, 20*time.Second, "alice's first note", func() bool { return slices.Contains(alice.names(), note("a1")) })
			// Not required: a fixed watchsan may not share this watch at all.
			t.Logf("alice's watch open; a shared feed covering %s: %v", x, openFeedCovers(t, p, "notes", "", x))

			bob := openSharedWatch(t, ctx, nil, p.URL+path, tokens["bob"])
			bobDirect := openSharedWatch(t, ctx, direct, c.APIServers[0].URL+path, tokens["bob"])
			api.put(note("a2"), aliceUser)
			api.put(note("b2"), bobUser)
			want := []string{note("b1"), note("b2")}
			eventually(t, 20*time.Second, "bob's direct watch sending his two notes", func() bool { return len(bobDirect.names()) >= len(want) })
			if got := bobDirect.names(); !slices.Equal(got, want) {
				t.Fatalf("bob's direct watch: %v, want %v (the notes API is not what the test takes it for)", got, want)
			}
			testutil.Until(15*time.Second, func() bool { return len(bob.names()) >= len(want) })
			if got := bob.names(); !slices.Equal(got, want) {
				t.Errorf("bob's watch from %s through watchsan, while alice's is open: %s; his direct watch: %s", x, fmtNames(got), fmtNames(want))
			}
			if got, wantA := alice.names(), []string{note("a1"), note("a2")}; !slices.Equal(got, wantA) {
				t.Errorf("alice's watch through watchsan: %s, want %s", fmtNames(got), fmtNames(wantA))
			}
			t.Logf("watchsan: %v shared feed joins, %v private feeds", p.Metric("watchsan_shared_feed_joins_total", nil), p.Metric("watchsan_watch_private_feeds_total", nil))
			alice.stop()
			bob.stop()
			p.requireProxied(2, map[string]string{"verb": "watch", "resource": notesGroup + "/" + notesResource})
		})
	}
}

func fmtNames(names []string) string {
	if len(names) == 0 {
		return "no event"
	}
	return fmt.Sprintf("[%s]", strings.Join(names, " "))
}
