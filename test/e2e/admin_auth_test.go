package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/test/cluster"
)

// The admin listener's authentication against the real apiserver (docs/design.md section 13).
// Off loopback, /debug/* answers only a bearer token that the apiserver authenticates (a
// TokenReview) and authorizes for the path (a SubjectAccessReview of a non-resource URL): no
// token and a garbage token get 401, a ServiceAccount without the RBAC 403 naming its user, one
// granted get on the path 200; revoking the grant takes effect within the apiserver's own 10 s
// (nothing is cached). The probes' paths stay open, /metrics too unless --admin-auth-metrics.
// The reviews go with --admin-auth-token-file's token (as the HA base does, --no-credentials)
// or with the lent identity (as the sidecar does). On loopback nothing changes, and a
// configuration with no identity to review with is refused at start. No token is ever logged.
func TestAdminAuthRealAPIServer(t *testing.T) {
	c := newCluster(t, cluster.Options{})
	admin, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 4*time.Minute)
	const ns = "admin-auth"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Who may do what: the reviewer creates the reviews (system:auth-delegator's rules); each
	// reader may get one non-resource path.
	roles := map[string][]rbacv1.PolicyRule{
		"reviewer": {{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
			{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}}},
		"feeds-reader":   {{NonResourceURLs: []string{"/debug/feeds"}, Verbs: []string{"get"}}},
		"metrics-reader": {{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
		"path-reader":    {{NonResourceURLs: []string{"/watchsan/c/*"}, Verbs: []string{"get"}}},
		"no-rbac":        nil,
	}
	tokens := map[string]string{}
	hour := int64(3600)
	for sa, rules := range roles {
		if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tokens[sa] = tr.Status.Token
		if rules == nil {
			continue
		}
		name := "admin-auth-" + sa
		if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	reviewerFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(reviewerFile, []byte(tokens["reviewer"]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const garbage = "not-a-token-at-all"
	user := func(sa string) string { return "system:serviceaccount:" + ns + ":" + sa }
	hc := &http.Client{Timeout: 20 * time.Second}
	// get sends GET url with token ("" for none) and returns the code and body.
	get := func(url, token string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, b
	}
	// refused checks a Status answer with code whose message holds every one of want.
	refused := func(what string, code int, body []byte, wantCode int, want ...string) {
		t.Helper()
		var st metav1.Status
		if code != wantCode || json.Unmarshal(body, &st) != nil || st.Kind != "Status" || st.Code != int32(wantCode) {
			t.Errorf("%s: %d %s, want a %d Status", what, code, body, wantCode)
			return
		}
		for _, w := range want {
			if !strings.Contains(st.Message, w) {
				t.Errorf("%s: the Status %q does not name %q", what, st.Message, w)
			}
		}
		if bytes.Contains(body, []byte(`"sharing"`)) {
			t.Errorf("%s: the answer holds the feeds' listing: %s", what, body)
		}
	}
	open := func(what string, code int, body []byte) {
		t.Helper()
		if code != http.StatusOK {
			t.Errorf("%s: %d %s, want 200", what, code, body)
		}
	}
	feedsListing := func(body []byte) bool {
		var l struct {
			Sharing *bool `json:"sharing"`
		}
		return json.Unmarshal(body, &l) == nil && l.Sharing != nil
	}
	noTokenLogged := func(p *proxy) {
		t.Helper()
		log := p.Log()
		for sa, tok := range tokens {
			if strings.Contains(log, tok) {
				t.Errorf("watchsan logged the token of %s", sa)
			}
		}
		if strings.Contains(log, garbage) {
			t.Error("watchsan logged the garbage token")
		}
	}

	// A: as the HA base, --no-credentials, the reviews with a token of their own.
	a := startProxy(t, "--upstream="+c.APIServers[0].URL, "--upstream-ca-file="+c.CAFile, "--no-credentials",
		"--admin-listen=0.0.0.0:0", "--admin-auth-token-file="+reviewerFile, "--enable-pprof")
	aURL := adminOnLoopback(t, a)
	eventually(t, 30*time.Second, "watchsan A ready", func() bool { code, _ := get(aURL+"/readyz", ""); return code == http.StatusOK })
	for _, path := range []string{"/healthz", "/livez", "/readyz", "/metrics"} {
		code, body := get(aURL+path, "")
		open("A "+path+" without a token", code, body)
	}
	code, body := get(aURL+"/debug/feeds", "")
	refused("A /debug/feeds without a token", code, body, http.StatusUnauthorized, "bearer token")
	for _, path := range []string{"/status", "/status.json", "/status?format=json"} { // the status page
		code, body := get(aURL+path, "")
		refused("A "+path+" without a token", code, body, http.StatusUnauthorized, "bearer token")
	}
	code, body = get(aURL+"/debug/feeds", garbage)
	refused("A /debug/feeds with a garbage token", code, body, http.StatusUnauthorized, "did not authenticate")
	// RBAC reaches the apiserver's authorizer through its informers: the first grant is waited for.
	eventually(t, 20*time.Second, "A to serve /debug/feeds to feeds-reader", func() bool {
		code, body = get(aURL+"/debug/feeds", tokens["feeds-reader"])
		return code == http.StatusOK
	})
	if !feedsListing(body) {
		t.Errorf("A /debug/feeds for feeds-reader: %s, want the feeds' listing", body)
	}
	// What a checked request costs: two reviews, nothing cached (logged, not asserted).
	var took []time.Duration
	for range 20 {
		t0 := time.Now()
		if code, _ := get(aURL+"/debug/feeds", tokens["feeds-reader"]); code != http.StatusOK {
			t.Fatalf("A /debug/feeds for feeds-reader: %d on a later request", code)
		}
		took = append(took, time.Since(t0))
	}
	slices.Sort(took)
	t.Logf("an authorized /debug/feeds took %s (median of 20; min %s, max %s), its two reviews included", took[10], took[0], took[19])
	code, body = get(aURL+"/debug/feeds", tokens["no-rbac"])
	refused("A /debug/feeds for a ServiceAccount without RBAC", code, body, http.StatusForbidden, user("no-rbac"), `"/debug/feeds"`)
	code, body = get(aURL+"/debug/feeds", tokens["metrics-reader"])
	refused("A /debug/feeds for one granted /metrics only", code, body, http.StatusForbidden, user("metrics-reader"))
	for _, path := range []string{"/status", "/status.json"} {
		code, body = get(aURL+path, tokens["feeds-reader"])
		refused("A "+path+" for one granted /debug/feeds only", code, body, http.StatusForbidden, user("feeds-reader"), `"`+path+`"`)
	}
	code, body = get(aURL+"/debug/pprof/cmdline", tokens["feeds-reader"])
	refused("A pprof for one granted /debug/feeds only", code, body, http.StatusForbidden, user("feeds-reader"), `"/debug/pprof/cmdline"`)
	if bytes.Contains(body, []byte(watchsanBin)) {
		t.Errorf("A pprof's command line reached a reader of /debug/feeds: %s", body)
	}
	// Nothing is cached: revoking the grant refuses the next request once the apiserver's
	// authorizer has it, well within the apiserver's own 10 s token cache.
	if err := admin.RbacV1().ClusterRoleBindings().Delete(ctx, "admin-auth-feeds-reader", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	eventually(t, 10*time.Second, "A to refuse feeds-reader once its grant is gone", func() bool {
		code, _ = get(aURL+"/debug/feeds", tokens["feeds-reader"])
		return code == http.StatusForbidden
	})
	t.Logf("a revoked grant was refused %s after its deletion", time.Since(revoked).Round(time.Millisecond))
	noTokenLogged(a)

	// B: as the sidecar, the reviews with the lent identity (here the cluster's admin), and
	// /metrics behind the same check.
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := c.WriteKubeconfig(kc, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	b := startProxy(t, "--kubeconfig="+kc, "--admin-listen=0.0.0.0:0", "--admin-auth-metrics")
	bURL := adminOnLoopback(t, b)
	eventually(t, 30*time.Second, "watchsan B ready", func() bool { code, _ := get(bURL+"/readyz", ""); return code == http.StatusOK })
	for _, path := range []string{"/healthz", "/livez"} {
		code, body := get(bURL+path, "")
		open("B "+path+" without a token", code, body)
	}
	code, body = get(bURL+"/metrics", "")
	refused("B /metrics without a token (--admin-auth-metrics)", code, body, http.StatusUnauthorized, "bearer token")
	code, body = get(bURL+"/metrics", tokens["no-rbac"])
	refused("B /metrics for a ServiceAccount without RBAC", code, body, http.StatusForbidden, user("no-rbac"), `"/metrics"`)
	code, body = get(bURL+"/metrics", tokens["metrics-reader"])
	if code != http.StatusOK || !bytes.Contains(body, []byte("watchsan_build_info")) {
		t.Errorf("B /metrics for metrics-reader: %d %.200s, want the metrics", code, body)
	}
	code, body = get(bURL+"/debug/feeds", garbage)
	refused("B /debug/feeds with a garbage token", code, body, http.StatusUnauthorized, "did not authenticate")
	noTokenLogged(b)

	// C: one path asked about for every admin path (--admin-auth-path), as another watchsan's
	// grants are kept apart from this one's.
	cc := startProxy(t, "--upstream="+c.APIServers[0].URL, "--upstream-ca-file="+c.CAFile, "--no-credentials",
		"--admin-listen=0.0.0.0:0", "--admin-auth-token-file="+reviewerFile, "--admin-auth-path=/watchsan/c/debug")
	cURL := adminOnLoopback(t, cc)
	eventually(t, 20*time.Second, "C to serve /debug/feeds to path-reader", func() bool {
		code, body = get(cURL+"/debug/feeds", tokens["path-reader"])
		return code == http.StatusOK
	})
	if !feedsListing(body) {
		t.Errorf("C /debug/feeds for path-reader: %s, want the feeds' listing", body)
	}
	code, body = get(cURL+"/debug/feeds", tokens["metrics-reader"])
	refused("C /debug/feeds for one not granted --admin-auth-path", code, body, http.StatusForbidden, user("metrics-reader"), `"/watchsan/c/debug"`)

	// D: on loopback, open as before.
	d := startProxy(t, "--upstream="+c.APIServers[0].URL, "--upstream-ca-file="+c.CAFile, "--no-credentials")
	code, body = get(d.AdminURL+"/debug/feeds", "")
	if code != http.StatusOK || !feedsListing(body) {
		t.Errorf("loopback /debug/feeds without a token: %d %s, want the listing", code, body)
	}

	// E: off loopback with no identity to review with: refused at start, naming the fixes.
	cmd := exec.CommandContext(ctxT(t, 20*time.Second), watchsanBin, "--upstream="+c.APIServers[0].URL, "--upstream-ca-file="+c.CAFile,
		"--no-credentials", "--listen=127.0.0.1:0", "--admin-listen=0.0.0.0:0")
	cmd.Env = append(os.Environ(), "KUBECONFIG=/nonexistent")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("--no-credentials with the admin listener off loopback and no review token: exit %v, want 2 at start\n%s", err, stderr.String())
	}
	for _, want := range []string{"--admin-auth-token-file=FILE", "--admin-auth=none", "--no-credentials: it lends no identity"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, stderr.String())
		}
	}
}

// adminOnLoopback is p's admin URL with a wildcard host (the 'listening' line reports the
// bound address: [::] for 0.0.0.0 on a dual-stack host) replaced by 127.0.0.1.
func adminOnLoopback(t *testing.T, p *proxy) string {
	t.Helper()
	host, port, err := net.SplitHostPort(strings.TrimPrefix(p.AdminURL, "http://"))
	if err != nil {
		t.Fatalf("admin URL %s: %v", p.AdminURL, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
		t.Fatalf("admin URL %s: want a wildcard address (the test asked for 0.0.0.0)", p.AdminURL)
	}
	return "http://" + net.JoinHostPort("127.0.0.1", port)
}
