package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/test/cluster"
)

// Attacks on shared feeds, each against the real binary and a real kube-apiserver: a client
// must never get through a shared feed what the apiserver would refuse it, or other than what
// it would send it, at the moment it asks. Each test compares watchsan's answer with a direct
// request's of the same client at the same time.

// directClient is an HTTP client that verifies the cluster's apiservers and sends no
// credentials of its own (a request sets its Authorization).
func directClient(t *testing.T, c *cluster.Cluster) *http.Client {
	t.Helper()
	hc, err := rest.HTTPClientFor(c.RESTConfig(0, ""))
	if err != nil {
		t.Fatal(err)
	}
	return hc
}

func adminClient(t *testing.T, c *cluster.Cluster) kubernetes.Interface {
	t.Helper()
	admin, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	return admin
}

// lentKubeconfig writes a kubeconfig for apiserver-0 with the admin token: the identity a
// sidecar-mode watchsan lends (system:masters, which may impersonate).
func lentKubeconfig(t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	kc := filepath.Join(t.TempDir(), "lent.kubeconfig")
	if err := c.WriteKubeconfig(kc, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	return kc
}

// frontendArgs run watchsan in frontend mode on c's apiserver-0: it lends nothing, every client
// brings its own token, and shares once an access review allowed it.
func frontendArgs(c *cluster.Cluster) []string {
	return []string{"--upstream=" + c.APIServers[0].URL, "--upstream-ca-file=" + c.CAFile, "--no-credentials", "--share-watches", "--log-level=info"}
}

// saToken creates the ServiceAccount ns/name and returns a token of it, valid an hour.
func saToken(t *testing.T, ctx context.Context, admin kubernetes.Interface, ns, name string) string {
	t.Helper()
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hour := int64(3600)
	tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// cmWatchNamespace creates namespace ns with a Role that may get, list and watch its
// configmaps, bound (one RoleBinding each, named as the subject) to subjects, and a configmap
// "seed", whose resourceVersion it returns: the watches of the tests start there.
func cmWatchNamespace(t *testing.T, ctx context.Context, admin kubernetes.Interface, ns string, subjects ...rbacv1.Subject) string {
	t.Helper()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "cm-watcher"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range subjects {
		if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: s.Name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "cm-watcher"},
			Subjects: []rbacv1.Subject{s}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	seed, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "seed"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return seed.ResourceVersion
}

// createConfigMaps creates configmaps cm-0 .. cm-(n-1) in ns.
func createConfigMaps(t *testing.T, ctx context.Context, admin kubernetes.Interface, ns string, n int) {
	t.Helper()
	for i := range n {
		if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm-" + strconv.Itoa(i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// openFeedCovers says whether /debug/feeds lists an open, joinable shared feed of resource in
// namespace ns whose ring covers resourceVersion rv: a watch of it from rv would join it.
func openFeedCovers(t *testing.T, p *proxy, resource, ns, rv string) bool {
	t.Helper()
	var l struct {
		Feeds []struct {
			Resource, Namespace string
			Subscribers         int
			Joinable            bool
			Ring                struct{ FromRV, ToRV string }
		}
	}
	if err := json.Unmarshal([]byte(debugFeeds(t, p)), &l); err != nil {
		t.Fatalf("/debug/feeds: %v", err)
	}
	at, _ := strconv.ParseUint(rv, 10, 64)
	for _, f := range l.Feeds {
		from, _ := strconv.ParseUint(f.Ring.FromRV, 10, 64)
		to, _ := strconv.ParseUint(f.Ring.ToRV, 10, 64)
		if f.Resource == resource && f.Namespace == ns && f.Joinable && f.Subscribers > 0 && from <= at && at <= to {
			return true
		}
	}
	return false
}

// requireFeedCovers fails unless a feed of resource in ns covers rv (openFeedCovers): the
// attack's precondition, what makes the watch it sends one that joins.
func requireFeedCovers(t *testing.T, p *proxy, resource, ns, rv string) {
	t.Helper()
	eventually(t, 20*time.Second, "/debug/feeds listing a feed of "+resource+" in "+ns+" that covers "+rv, func() bool {
		return openFeedCovers(t, p, resource, ns, rv)
	})
}

// watchAnswer is what one watch request got: its status code and body (no body for a 200: its
// stream's object names instead, read for a while).
type watchAnswer struct {
	code  int
	body  string
	names []string
	hdr   http.Header
}

func (a watchAnswer) String() string {
	if a.code == http.StatusOK {
		return "200 with the events of " + strings.Join(a.names, ",")
	}
	return strconv.Itoa(a.code) + " " + strings.TrimSpace(a.body)
}

// ask sends the watch of url with hc and the headers h, and returns its answer; a 200's stream
// is read until it named wantNames objects or for at most read, then stopped.
func ask(t *testing.T, ctx context.Context, hc *http.Client, url string, h http.Header, wantNames int, read time.Duration) watchAnswer {
	t.Helper()
	w, resp, b := tryWatch(t, ctx, hc, url, h)
	a := watchAnswer{code: resp.StatusCode, body: string(b), hdr: resp.Header}
	if w != nil {
		testutil.Until(read, func() bool { return len(w.names()) >= wantNames })
		w.stop()
		a.names = w.names()
	}
	return a
}

// pollServer waits, looking every 200 ms (each look a request to a real server), until cond
// holds, failing the test after timeout.
func pollServer(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !testutil.UntilEvery(timeout, 200*time.Millisecond, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// Finding 1: a sidecar-mode watchsan lends an identity that may impersonate (here the admin
// token, system:masters). A client of the lent identity that asks to impersonate (kubectl
// --as, --as-group; watchsan forwards Impersonate-* with the lent identity, as kubectl proxy
// does) is another user to the apiserver than the lent identity: it must not join the lent
// feed, nor one of another impersonation. Direct, the admin token with the same
// Impersonate-* headers is refused (403 for a user without RBAC in the namespace, 400 for a
// group without a user); through watchsan the answer must be the same, and no event of the
// namespace.
func TestShareAttackImpersonatingLentWatch(t *testing.T) {
	c := newCluster(t, cluster.Options{})
	admin := adminClient(t, c)
	ctx := ctxT(t, 3*time.Minute)
	const ns, readers = "attack-imp", "attack-imp-readers"
	seedRV := cmWatchNamespace(t, ctx, admin, ns, rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: readers})
	createConfigMaps(t, ctx, admin, ns, 3)
	path := "/api/v1/namespaces/" + ns + "/configmaps?watch=true&resourceVersion=" + seedRV
	direct := directClient(t, c)
	directAs := func(h http.Header) watchAnswer {
		h = h.Clone()
		h.Set("Authorization", "Bearer "+c.AdminToken)
		return ask(t, ctx, direct, c.APIServers[0].URL+path, h, 3, 10*time.Second)
	}
	kc := lentKubeconfig(t, c)

	// The plain lent watch: the feed every lent client of this watch joins.
	p := startProxy(t, "--kubeconfig="+kc, "--share-watches", "--log-level=info")
	waitUpstreamUp(t, p, c.APIServers[0].URL)
	plain := openSharedWatch(t, ctx, nil, p.URL+path, "")
	eventually(t, 20*time.Second, "the plain lent watch's 3 events", func() bool { return len(plain.names()) >= 3 })
	requireFeedCovers(t, p, "configmaps", ns, seedRV)

	refusals := 0
	for _, tc := range []struct {
		name string
		h    http.Header
	}{
		{"user", header("Impersonate-User", cluster.LimitedUser)},
		{"group-only", header("Impersonate-Group", readers)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := directAs(tc.h)
			if want.code == http.StatusOK {
				t.Fatalf("direct, the admin token with %v: %v; the attack needs a refusal", tc.h, want)
			}
			requireFeedCovers(t, p, "configmaps", ns, seedRV)
			got := ask(t, ctx, http.DefaultClient, p.URL+path, tc.h, 3, 5*time.Second)
			refusals++
			if got.code != want.code || strings.Contains(got.body, "cm-") {
				t.Errorf("a lent watch with %v through watchsan: %v; want direct's %v, and no event", tc.h, got, want)
			}
		})
	}

	// The same user in another group: the first impersonation may watch (its group's
	// RoleBinding), the second may not, and must not join the first's feed.
	t.Run("same-user-other-group", func(t *testing.T) {
		allowed := header("Impersonate-User", cluster.LimitedUser, "Impersonate-Group", readers)
		other := header("Impersonate-User", cluster.LimitedUser, "Impersonate-Group", "attack-imp-others")
		if a := directAs(allowed); a.code != http.StatusOK {
			t.Fatalf("direct, limited in %s: %v, want 200", readers, a)
		}
		want := directAs(other)
		if want.code != http.StatusForbidden {
			t.Fatalf("direct, limited in attack-imp-others: %v, want 403", want)
		}
		p2 := startProxy(t, "--kubeconfig="+kc, "--share-watches", "--log-level=info")
		waitUpstreamUp(t, p2, c.APIServers[0].URL)
		w, resp, b := tryWatch(t, ctx, nil, p2.URL+path, allowed)
		if w == nil {
			t.Fatalf("limited in %s through watchsan: %s %s, want direct's 200", readers, resp.Status, b)
		}
		eventually(t, 20*time.Second, "the first impersonation's 3 events", func() bool { return len(w.names()) >= 3 })
		t.Logf("the first impersonation's watch: %v shared feeds open", p2.Metric("watchsan_shared_feeds", nil))
		got := ask(t, ctx, http.DefaultClient, p2.URL+path, other, 3, 5*time.Second)
		if got.code != want.code || strings.Contains(got.body, "cm-") {
			t.Errorf("limited in attack-imp-others through watchsan, while limited in %s watches: %v; want direct's %v, and no event", readers, got, want)
		}
		w.stop()
		p2.requireProxied(1, map[string]string{"verb": "watch", "resource": "configmaps"})
	})
	plain.stop()
	p.requireProxied(float64(1+refusals), map[string]string{"verb": "watch", "resource": "configmaps"})
}

// revokeEnv is findings 2 and 3's setup: in frontend mode, reader-2's watch holds a shared feed
// of namespace ns's configmaps open from seedRV, and reader-1 joined it once (allowed by its
// own RoleBinding, its review cached).
type revokeEnv struct {
	c      *cluster.Cluster
	admin  kubernetes.Interface
	p      *proxy
	direct *http.Client
	ns     string
	seedRV string
	path   string
	tokens map[string]string
	holder *sharedWatch // reader-2's watch, open until the test ends
}

func newRevokeEnv(t *testing.T, ctx context.Context) *revokeEnv {
	t.Helper()
	e := &revokeEnv{c: newCluster(t, cluster.Options{}), ns: "attack-revoke", tokens: map[string]string{}}
	e.admin = adminClient(t, e.c)
	e.direct = directClient(t, e.c)
	if _, err := e.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns + "-sa"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var subjects []rbacv1.Subject
	for _, sa := range []string{"reader-1", "reader-2"} {
		subjects = append(subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: e.ns + "-sa", Name: sa})
	}
	e.seedRV = cmWatchNamespace(t, ctx, e.admin, e.ns, subjects...)
	for _, sa := range []string{"reader-1", "reader-2"} {
		e.tokens[sa] = saToken(t, ctx, e.admin, e.ns+"-sa", sa)
	}
	e.path = "/api/v1/namespaces/" + e.ns + "/configmaps?watch=true&resourceVersion=" + e.seedRV
	e.p = startProxy(t, frontendArgs(e.c)...)
	waitUpstreamUp(t, e.p, e.c.APIServers[0].URL)
	e.holder = openSharedWatch(t, ctx, nil, e.p.URL+e.path, e.tokens["reader-2"])
	eventually(t, 20*time.Second, "reader-2 a subscriber of the feed", func() bool {
		return e.p.Metric("watchsan_shared_feed_subscribers", nil) == 1
	})
	createConfigMaps(t, ctx, e.admin, e.ns, 3)
	eventually(t, 20*time.Second, "reader-2's 3 events", func() bool { return len(e.holder.names()) >= 3 })
	r1 := openSharedWatch(t, ctx, nil, e.p.URL+e.path, e.tokens["reader-1"])
	eventually(t, 20*time.Second, "reader-1 joined the feed and got its 3 events", func() bool {
		return e.p.Metric("watchsan_shared_feed_joins_total", nil) >= 1 && len(r1.names()) >= 3
	})
	r1.stop()
	requireFeedCovers(t, e.p, "configmaps", e.ns, e.seedRV)
	return e
}

// reader1 is reader-1's watch from seedRV, directly or through watchsan.
func (e *revokeEnv) reader1(t *testing.T, ctx context.Context, viaWatchsan bool) watchAnswer {
	t.Helper()
	h := header("Authorization", "Bearer "+e.tokens["reader-1"])
	if viaWatchsan {
		return ask(t, ctx, http.DefaultClient, e.p.URL+e.path, h, 3, 5*time.Second)
	}
	return ask(t, ctx, e.direct, e.c.APIServers[0].URL+e.path, h, 0, 0)
}

// Finding 2: reader-1's RoleBinding is deleted while reader-2's watch keeps the shared feed
// open. Once the apiserver refuses reader-1 (direct: 403, polled), a re-watch of reader-1
// through watchsan from a resourceVersion the feed covers must be refused too: at after
// since the delete, not when watchsan's cached allowance runs out (5 minutes).
func testRevokedRBAC(t *testing.T, after time.Duration) {
	ctx := ctxT(t, after+3*time.Minute)
	e := newRevokeEnv(t, ctx)
	if err := e.admin.RbacV1().RoleBindings(e.ns).Delete(ctx, "reader-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	var last watchAnswer
	pollServer(t, 30*time.Second, "the apiserver refusing reader-1 directly", func() bool {
		last = e.reader1(t, ctx, false)
		return last.code == http.StatusForbidden
	})
	t.Logf("direct: reader-1 refused %v after its RoleBinding's delete: %v", time.Since(deleted).Round(time.Millisecond), last)
	select {
	case <-time.After(time.Until(deleted.Add(after))):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	requireFeedCovers(t, e.p, "configmaps", e.ns, e.seedRV)
	got := e.reader1(t, ctx, true)
	at := time.Since(deleted).Round(time.Millisecond)
	if got.code != http.StatusForbidden || !strings.Contains(got.body, serviceAccountUser(e.ns+"-sa", "reader-1")) || strings.Contains(got.body, "cm-") {
		t.Errorf("reader-1 through watchsan %v after its RoleBinding's delete (direct: %v): %v; want the apiserver's 403 naming it, and no event", at, last, got)
	}
	e.p.requireProxied(2, map[string]string{"verb": "watch", "resource": "configmaps"})
}

func TestShareAttackRevokedRBAC(t *testing.T) { testRevokedRBAC(t, 8*time.Second) }

// TestShareAttackRevokedRBACLong re-watches 296 s after the delete, inside watchsan's cached
// allowance (5 minutes) but long after the apiserver refuses: only with
// WATCHSAN_LONG_ATTACKS=1, so that CI stays short.
func TestShareAttackRevokedRBACLong(t *testing.T) {
	if os.Getenv("WATCHSAN_LONG_ATTACKS") != "1" {
		t.Skip("a 5-minute attack: set WATCHSAN_LONG_ATTACKS=1")
	}
	testRevokedRBAC(t, 296*time.Second)
}

// Finding 3: reader-1's ServiceAccount is deleted while reader-2's watch keeps the shared feed
// open. Once the apiserver no longer authenticates reader-1's token (direct: 401, polled; it
// caches a token's authentication for about 10 s), a re-watch with it through watchsan from a
// resourceVersion the feed covers must be the apiserver's 401 too, within a couple of seconds.
func TestShareAttackDeletedServiceAccount(t *testing.T) {
	const within = 3 * time.Second
	ctx := ctxT(t, 3*time.Minute)
	e := newRevokeEnv(t, ctx)
	if err := e.admin.CoreV1().ServiceAccounts(e.ns+"-sa").Delete(ctx, "reader-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	var last watchAnswer
	pollServer(t, 60*time.Second, "the apiserver refusing reader-1's token directly", func() bool {
		last = e.reader1(t, ctx, false)
		return last.code == http.StatusUnauthorized
	})
	refused := time.Now()
	t.Logf("direct: reader-1's token refused %v after its ServiceAccount's delete: %v", refused.Sub(deleted).Round(time.Millisecond), last)
	requireFeedCovers(t, e.p, "configmaps", e.ns, e.seedRV)
	var got watchAnswer
	ok := testutil.UntilEvery(within, 200*time.Millisecond, func() bool {
		got = e.reader1(t, ctx, true)
		return got.code == http.StatusUnauthorized
	})
	if !ok || strings.Contains(got.body, "cm-") {
		t.Errorf("reader-1's token through watchsan, %v after direct's 401 (%v after the delete): %v; want the apiserver's 401 within %v, and no event",
			time.Since(refused).Round(time.Millisecond), time.Since(deleted).Round(time.Millisecond), got, within)
	}
	e.p.requireProxied(2, map[string]string{"verb": "watch", "resource": "configmaps"})
}

// Finding 5: the response headers a joiner is sent are its own request's, not the opener's. The
// apiserver names the priority and fairness classification of each request
// (X-Kubernetes-Pf-Flowschema-Uid, -Prioritylevel-Uid: the admin's is exempt, a
// ServiceAccount's another) and its audit ID (Audit-Id) in the response; a joiner must not be
// sent the opener's, which name another user's request.
func TestShareAttackJoinerHeaders(t *testing.T) {
	c := newCluster(t, cluster.Options{})
	admin := adminClient(t, c)
	ctx := ctxT(t, 2*time.Minute)
	const ns = "attack-headers"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns + "-sa"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	seedRV := cmWatchNamespace(t, ctx, admin, ns, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns + "-sa", Name: "joiner"})
	joinerToken := saToken(t, ctx, admin, ns+"-sa", "joiner")
	createConfigMaps(t, ctx, admin, ns, 3)
	path := "/api/v1/namespaces/" + ns + "/configmaps?watch=true&resourceVersion=" + seedRV
	p := startProxy(t, frontendArgs(c)...)
	waitUpstreamUp(t, p, c.APIServers[0].URL)

	opener, oresp, b := tryWatch(t, ctx, nil, p.URL+path, header("Authorization", "Bearer "+c.AdminToken))
	if opener == nil {
		t.Fatalf("the admin's watch through watchsan: %s %s", oresp.Status, b)
	}
	eventually(t, 20*time.Second, "the admin's 3 events", func() bool { return len(opener.names()) >= 3 })
	requireFeedCovers(t, p, "configmaps", ns, seedRV)
	joined := p.Metric("watchsan_shared_feed_joins_total", nil)
	joiner := ask(t, ctx, http.DefaultClient, p.URL+path, header("Authorization", "Bearer "+joinerToken), 3, 10*time.Second)
	if joiner.code != http.StatusOK {
		t.Fatalf("the joiner's watch through watchsan: %v, want 200", joiner)
	}
	t.Logf("the joiner joined the admin's feed: %v", p.Metric("watchsan_shared_feed_joins_total", nil) > joined)
	directJoiner := ask(t, ctx, directClient(t, c), c.APIServers[0].URL+path, header("Authorization", "Bearer "+joinerToken), 3, 10*time.Second)
	const fs, pl = "X-Kubernetes-Pf-Flowschema-Uid", "X-Kubernetes-Pf-Prioritylevel-Uid"
	if directJoiner.hdr.Get(fs) == "" || directJoiner.hdr.Get(fs) == oresp.Header.Get(fs) {
		t.Fatalf("direct, the joiner's %s is %q, the admin's through watchsan %q: the attack needs them to differ", fs, directJoiner.hdr.Get(fs), oresp.Header.Get(fs))
	}
	for _, k := range []string{fs, pl, "Audit-Id"} {
		o, j, d := oresp.Header.Get(k), joiner.hdr.Get(k), directJoiner.hdr.Get(k)
		switch {
		case o != "" && j == o:
			t.Errorf("the joiner's %s is the opener's (the admin's) %q; direct, its own is %q", k, j, d)
		case k != "Audit-Id" && j != "" && j != d: // the classification's UIDs are the same for each request of the joiner
			t.Errorf("the joiner's %s is %q; direct, its own is %q", k, j, d)
		}
		t.Logf("%s: opener %q, joiner through watchsan %q, joiner direct %q", k, oresp.Header.Get(k), joiner.hdr.Get(k), directJoiner.hdr.Get(k))
	}
	opener.stop()
	p.requireProxied(2, map[string]string{"verb": "watch", "resource": "configmaps", "code": "200"})
}
