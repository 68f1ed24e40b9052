package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/test/cluster"
)

// Shared feeds' access reviews against the real apiserver: with --share-watches, clients bringing
// ServiceAccount tokens of their own share one upstream watch once a SelfSubjectAccessReview
// with their own token allowed it; a token without RBAC for the scope, and one allowed in
// another namespace only, get the apiserver's own 403 (its message names their user), an
// unknown token its 401, and none of them a byte of the feed. No token is ever logged.
func TestSharedFeedAccessReviewRealAPIServer(t *testing.T) {
	c := newCluster(t, cluster.Options{})
	admin, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 3*time.Minute)
	const nsA, nsB = "share-a", "share-b"
	for _, ns := range []string{nsA, nsB} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.RbacV1().Roles(nsA).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "cm-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{}
	hour := int64(3600)
	for _, sa := range []string{"reader-1", "reader-2", "no-rbac"} {
		if _, err := admin.CoreV1().ServiceAccounts(nsA).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := admin.CoreV1().ServiceAccounts(nsA).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tokens[sa] = tr.Status.Token
	}
	if _, err := admin.RbacV1().RoleBindings(nsA).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "cm-readers"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "cm-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: nsA, Name: "reader-1"}, {Kind: rbacv1.ServiceAccountKind, Namespace: nsA, Name: "reader-2"}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	seed, err := admin.CoreV1().ConfigMaps(nsA).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "seed"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	p := startProxy(t, "--upstream="+c.APIServers[0].URL, "--upstream-ca-file="+c.CAFile, "--no-credentials", "--share-watches", "--log-level=info")
	waitUpstreamUp(t, p, c.APIServers[0].URL)
	path := func(ns string) string {
		return "/api/v1/namespaces/" + ns + "/configmaps?watch=true&allowWatchBookmarks=true&resourceVersion=" + seed.ResourceVersion
	}

	// The two allowed tokens: one feed, one upstream watch, each gets every event.
	var readers []*sharedWatch
	for _, sa := range []string{"reader-1", "reader-2"} {
		readers = append(readers, openSharedWatch(t, ctx, nil, p.URL+path(nsA), tokens[sa]))
		eventually(t, 20*time.Second, sa+" a subscriber of the feed", func() bool {
			return p.Metric("watchsan_shared_feed_subscribers", nil) == float64(len(readers))
		})
	}
	if got := p.Metric("watchsan_shared_feeds", nil); got != 1 {
		t.Fatalf("%v shared feeds for two allowed tokens, want 1", got)
	}
	if got := p.Metric("watchsan_shared_feed_access_reviews_total", map[string]string{"result": "allowed"}); got != 2 {
		t.Errorf("%v reviews allowed, want 2 (one per token)", got)
	}
	for i := 0; i < 3; i++ {
		if _, err := admin.CoreV1().ConfigMaps(nsA).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range readers {
		eventually(t, 20*time.Second, fmt.Sprintf("reader %d's 3 events", i), func() bool { return len(r.names()) >= 3 })
		if got := strings.Join(r.names(), ","); got != "cm-0,cm-1,cm-2" {
			t.Errorf("reader %d got %s, want cm-0,cm-1,cm-2", i, got)
		}
	}

	// Refused: the apiserver's own answer, to the client's own identity, and nothing of the feed.
	hc := &http.Client{Timeout: 20 * time.Second}
	for _, r := range []struct {
		what, token, ns string
		code            int
		user            string
	}{
		{"a token without RBAC", tokens["no-rbac"], nsA, http.StatusForbidden, "system:serviceaccount:share-a:no-rbac"},
		{"a token allowed in " + nsA + " only", tokens["reader-1"], nsB, http.StatusForbidden, "system:serviceaccount:share-a:reader-1"},
		{"an unknown token", "not-a-token", nsA, http.StatusUnauthorized, ""},
	} {
		req, _ := http.NewRequestWithContext(ctx, "GET", p.URL+path(r.ns), nil)
		req.Header.Set("Authorization", "Bearer "+r.token)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", r.what, err)
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		var st metav1.Status
		if resp.StatusCode != r.code || json.Unmarshal(b, &st) != nil || st.Kind != "Status" || !strings.Contains(st.Message, r.user) {
			t.Errorf("%s watching %s: %s %s, want the apiserver's %d naming %q", r.what, r.ns, resp.Status, b, r.code, r.user)
		}
		if strings.Contains(string(b), "cm-") {
			t.Errorf("%s got a byte of the feed: %s", r.what, b)
		}
	}
	for result, want := range map[string]float64{"denied": 2, "unauthorized": 1} {
		if got := p.Metric("watchsan_shared_feed_access_reviews_total", map[string]string{"result": result}); got != want {
			t.Errorf("reviews %s: %v, want %v", result, got, want)
		}
	}
	if got := p.Metric("watchsan_watch_private_feeds_total", map[string]string{"reason": "access-denied"}); got != 3 {
		t.Errorf("private feeds (access-denied) %v, want 3", got)
	}
	if got := p.Metric("watchsan_shared_feed_subscribers", nil); got != 2 {
		t.Errorf("%v subscribers after the refusals, want the 2 readers", got)
	}
	p.requireProxied(2, map[string]string{"verb": "watch", "resource": "configmaps", "code": "403"})
	p.requireProxied(1, map[string]string{"verb": "watch", "resource": "configmaps", "code": "401"})
	for _, r := range readers {
		r.stop()
	}
	p.requireProxied(2, map[string]string{"verb": "watch", "resource": "configmaps", "code": "200"}) // counted as they end
	log := p.Log()
	for sa, tok := range tokens {
		if strings.Contains(log, tok) || strings.Contains(log, tok[len(tok)-20:]) {
			t.Errorf("watchsan logged %s's token", sa)
		}
	}
	if !strings.Contains(log, `"credentials":"own"`) || !strings.Contains(log, `"principal":"token:`) {
		t.Error("the access log does not name the clients' credentials and principals")
	}
}

// sharedWatch is a raw client watch that records the names of the objects it is sent.
type sharedWatch struct {
	mu     sync.Mutex
	got    []string
	cancel context.CancelFunc
}

func (w *sharedWatch) names() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.got...)
}

func (w *sharedWatch) stop() { w.cancel() }

// openSharedWatch opens a watch of url with hc (nil: http.DefaultClient) and token ("": none).
func openSharedWatch(t *testing.T, ctx context.Context, hc *http.Client, url, token string) *sharedWatch {
	t.Helper()
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	w, resp, b := tryWatch(t, ctx, hc, url, h)
	if w == nil {
		t.Fatalf("watch %s: %s %s", url, resp.Status, b)
	}
	return w
}

// tryWatch sends the watch of url with hc (nil: http.DefaultClient) and the headers h. On a
// 200 it returns the watch, which records the names of the objects of its stream until it is
// stopped or the test ends; on any other answer no watch, and the answer's body (at most 64
// KiB), read and closed. The response is returned either way (its headers).
func tryWatch(t *testing.T, ctx context.Context, hc *http.Client, url string, h http.Header) (*sharedWatch, *http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	for k, v := range h {
		req.Header[k] = v
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		cancel()
		return nil, resp, b
	}
	w := &sharedWatch{cancel: cancel}
	go func() { // exits when the watch ends (cancel, the test's end)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var ev struct {
				Type   string
				Object struct{ Metadata struct{ Name string } }
			}
			if json.Unmarshal(sc.Bytes(), &ev) == nil && (ev.Type == "ADDED" || ev.Type == "MODIFIED" || ev.Type == "DELETED") {
				w.mu.Lock()
				w.got = append(w.got, ev.Object.Metadata.Name)
				w.mu.Unlock()
			}
		}
	}()
	return w, resp, nil
}

// The same with verified client certificates in frontend mode, in both ways of asserting their
// identity: the review is asserted as the watch is (impersonation, request headers), so alice's
// two watches of her namespace share a feed, and bob, whose certificate names a user without
// RBAC there, gets the apiserver's own 403 naming him.
func TestSharedFeedAccessReviewAssertedCertificates(t *testing.T) {
	e := newIdentityEnv(t)
	ctx := ctxT(t, 3*time.Minute)
	seed, err := e.admin.CoreV1().ConfigMaps(identityNSA).Get(ctx, "seed", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"impersonate", "requestheader"} {
		t.Run(mode, func(t *testing.T) {
			p, url := e.start(t, mode, "--share-watches", "--log-level=info")
			watchURL := url + "/api/v1/namespaces/" + identityNSA + "/configmaps?watch=true&resourceVersion=" + seed.ResourceVersion
			alice := e.httpClient(t, "alice")
			var watches []*sharedWatch
			for i := 1; i <= 2; i++ {
				w := openSharedWatch(t, ctx, alice, watchURL, "")
				watches = append(watches, w)
				eventually(t, 20*time.Second, fmt.Sprintf("alice's watch %d a subscriber", i), func() bool {
					return p.Metric("watchsan_shared_feed_subscribers", nil) == float64(i)
				})
			}
			if got := p.Metric("watchsan_shared_feeds", nil); got != 1 {
				t.Errorf("%v shared feeds for alice's two watches, want 1", got)
			}
			for result, want := range map[string]float64{"allowed": 2} { // no allowance is reused: each join reviewed
				if got := p.Metric("watchsan_shared_feed_access_reviews_total", map[string]string{"result": result}); got != want {
					t.Errorf("reviews %s: %v, want %v", result, got, want)
				}
			}
			req, _ := http.NewRequestWithContext(ctx, "GET", watchURL, nil)
			resp, err := e.httpClient(t, "bob").Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			var st metav1.Status
			if resp.StatusCode != http.StatusForbidden || json.Unmarshal(b, &st) != nil || !strings.Contains(st.Message, `"bob"`) {
				t.Errorf("bob watching %s: %s %s, want the apiserver's 403 naming bob", identityNSA, resp.Status, b)
			}
			if got := p.Metric("watchsan_shared_feed_access_reviews_total", map[string]string{"result": "denied"}); got != 1 {
				t.Errorf("reviews denied: %v, want 1 (bob)", got)
			}
			p.requireProxied(1, map[string]string{"verb": "watch", "resource": "configmaps", "code": "403"})
			for _, w := range watches {
				w.stop()
			}
			eventually(t, 10*time.Second, "the access log naming alice and bob, as the apiserver's audit log does", func() bool {
				return strings.Contains(p.Log(), `"user":"alice"`) && strings.Contains(p.Log(), `"user":"bob","groups":["team-b-readers"]`)
			})
		})
	}
}
