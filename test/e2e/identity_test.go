package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/watchsan/watchsan/test/cluster"
)

// The identity-forwarding attack suite: watchsan as a frontend that verifies client
// certificates and forwards their identity. Two users with different RBAC: alice (a
// certificate with no group) may read configmaps in identityNSA, bound as a user; bob (group
// identityGroupB) may read them in identityNSB, bound as a group.
const (
	identityNSA    = "team-a"
	identityNSB    = "team-b"
	identityGroupB = "team-b-readers"
)

// identityEnv is a cluster with alice's and bob's RBAC and the certificates of the suite.
type identityEnv struct {
	c          *cluster.Cluster
	dir        string
	admin      *kubernetes.Clientset
	servingCA  *cluster.CA // signs watchsan's serving certificate
	clientCA   *cluster.CA // watchsan's --client-ca-file
	certs      map[string][2]string
	servingCrt string
	servingKey string
}

func newIdentityEnv(t *testing.T) *identityEnv {
	t.Helper()
	e := &identityEnv{c: newCluster(t, cluster.Options{}), dir: t.TempDir(), certs: map[string][2]string{}}
	var err error
	if e.servingCA, err = cluster.NewCA(e.dir, "watchsan-serving-ca"); err != nil {
		t.Fatal(err)
	}
	if e.clientCA, err = cluster.NewCA(e.dir, "watchsan-client-ca"); err != nil {
		t.Fatal(err)
	}
	if e.servingCrt, e.servingKey, err = e.servingCA.IssueServing("watchsan-serving"); err != nil {
		t.Fatal(err)
	}
	untrusted, err := cluster.NewCA(e.dir, "untrusted-ca")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, user string
		ca         *cluster.CA
		groups     []string
	}{
		{"alice", "alice", e.clientCA, nil},
		{"bob", "bob", e.clientCA, []string{identityGroupB}},
		{"untrusted-alice", "alice", untrusted, []string{"system:masters"}},
	} {
		crt, key, err := c.ca.IssueClient(c.name, c.user, c.groups...)
		if err != nil {
			t.Fatal(err)
		}
		e.certs[c.name] = [2]string{crt, key}
	}

	if e.admin, err = kubernetes.NewForConfig(e.c.RESTConfig(0, e.c.AdminToken)); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, time.Minute)
	// watchsan's own identity in impersonate mode: the limited user, given exactly what
	// deploy/components/identity-forwarding grants (impersonate on users and groups).
	if _, err := e.admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "impersonator"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"users", "groups"}, Verbs: []string{"impersonate"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "impersonator"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "impersonator"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: cluster.LimitedUser}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, b := range []struct {
		ns      string
		subject rbacv1.Subject
	}{
		{identityNSA, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "alice"}},
		{identityNSB, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: identityGroupB}},
	} {
		if _, err := e.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.admin.RbacV1().Roles(b.ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "reader"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.admin.RbacV1().RoleBindings(b.ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "reader"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "reader"}, Subjects: []rbacv1.Subject{b.subject}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.admin.CoreV1().ConfigMaps(b.ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "seed"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// start runs watchsan as a TLS frontend forwarding identities in mode, and returns its https
// URL.
func (e *identityEnv) start(t *testing.T, mode string, extra ...string) (*proxy, string) {
	t.Helper()
	args := []string{"--tls-cert-file=" + e.servingCrt, "--tls-private-key-file=" + e.servingKey,
		"--client-ca-file=" + e.clientCA.File, "--identity-forwarding=" + mode}
	switch mode {
	case "impersonate":
		// watchsan's own identity, which may impersonate users and groups and nothing more.
		kc := filepath.Join(e.dir, "watchsan.kubeconfig")
		if err := e.c.WriteKubeconfig(kc, e.c.APIServers[0].URL, e.c.UserToken, e.c.CAFile); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--kubeconfig="+kc)
	case "requestheader":
		args = append(args, "--upstream="+e.c.APIServers[0].URL, "--upstream-ca-file="+e.c.CAFile,
			"--requestheader-client-cert-file="+e.c.FrontProxyCertFile, "--requestheader-client-key-file="+e.c.FrontProxyKeyFile)
	}
	p := startProxy(t, append(args, extra...)...)
	return p, "https://" + strings.TrimPrefix(p.URL, "http://")
}

// restConfig is a client of watchsan at url as user (a certificate name of e.certs; "" for
// none) with token ("" for none).
func (e *identityEnv) restConfig(url, user, token string) *rest.Config {
	cfg := &rest.Config{Host: url, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAFile: e.servingCA.File}}
	if user != "" {
		cfg.CertFile, cfg.KeyFile = e.certs[user][0], e.certs[user][1]
	}
	return cfg
}

// httpClient is restConfig as a plain HTTP client whose certificate is always sent (Go's own
// client sends none that the server's acceptable CAs do not name; other clients do).
func (e *identityEnv) httpClient(t *testing.T, user string) *http.Client {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.servingCA.PEM)
	cfg := &tls.Config{RootCAs: roots}
	if user != "" {
		cert, err := tls.LoadX509KeyPair(e.certs[user][0], e.certs[user][1])
		if err != nil {
			t.Fatal(err)
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	}
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}
}

// whoamiVia asks the apiserver, through watchsan, who the request is (SelfSubjectReview).
func whoamiVia(t *testing.T, hc *http.Client, url string, h http.Header) (string, []string) {
	t.Helper()
	code, user, groups, err := cluster.WhoAmI(hc, url, h)
	if err != nil || code != http.StatusCreated {
		t.Fatalf("selfsubjectreview: %d %v", code, err)
	}
	return user, groups
}

// TestIdentityForwardingRBAC: in both modes, alice and bob, each with a client certificate
// through watchsan's TLS listener, get exactly their own permissions: list and watch in their
// namespace (a watch that watchsan resumes too: with a 2s stall timeout it is resumed while
// quiet, and must still carry its user's identity), 403 in the other's. The apiserver sees
// the certificate's user and groups, plus system:authenticated, which it adds itself
// (impersonation and request-header authentication both do), so watchsan does not send it.
func TestIdentityForwardingRBAC(t *testing.T) {
	e := newIdentityEnv(t)
	users := []struct {
		name       string
		own, other string
		groups     []string
	}{
		{"alice", identityNSA, identityNSB, []string{"system:authenticated"}},
		{"bob", identityNSB, identityNSA, []string{"system:authenticated", identityGroupB}},
	}
	for _, mode := range []string{"impersonate", "requestheader"} {
		t.Run(mode, func(t *testing.T) {
			p, url := e.start(t, mode, "--watch-stall-timeout=2s")
			ctx := ctxT(t, 2*time.Minute)
			for _, u := range users {
				if user, groups := whoamiVia(t, e.httpClient(t, u.name), url, nil); user != u.name || !slices.Equal(groups, u.groups) {
					t.Fatalf("%s is seen upstream as %q %v, want %q %v", u.name, user, groups, u.name, u.groups)
				}
				cs, err := kubernetes.NewForConfig(e.restConfig(url, u.name, ""))
				if err != nil {
					t.Fatal(err)
				}
				list, err := cs.CoreV1().ConfigMaps(u.own).List(ctx, metav1.ListOptions{})
				if err != nil || !slices.ContainsFunc(list.Items, func(cm corev1.ConfigMap) bool { return cm.Name == "seed" }) {
					t.Fatalf("%s listing its own namespace %s: %v", u.name, u.own, err)
				}
				if _, err := cs.CoreV1().ConfigMaps(u.other).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
					t.Fatalf("%s listing %s: %v, want 403", u.name, u.other, err)
				}
				if _, err := cs.CoreV1().Secrets(u.own).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
					t.Fatalf("%s listing secrets: %v, want 403", u.name, err)
				}
				if _, err := cs.CoreV1().ConfigMaps(u.other).Watch(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
					t.Fatalf("%s watching %s: %v, want 403", u.name, u.other, err)
				}
				w, err := cs.CoreV1().ConfigMaps(u.own).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
				if err != nil {
					t.Fatalf("%s watching %s: %v", u.name, u.own, err)
				}
				// Quiet for longer than the stall timeout: watchsan resumes the upstream watch.
				resumes := p.Metric("watchsan_watch_resumes_total", nil)
				eventually(t, 20*time.Second, "a resume of the quiet watch", func() bool {
					return p.Metric("watchsan_watch_resumes_total", nil) > resumes
				})
				name := fmt.Sprintf("after-resume-%s-%d", mode, time.Now().UnixNano())
				if _, err := e.admin.CoreV1().ConfigMaps(u.own).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				waitEvent(t, w, name)
				w.Stop()
			}
			p.requireProxied(2, map[string]string{"verb": "watch", "resource": "configmaps", "code": "200"})
			p.requireProxied(2, map[string]string{"verb": "list", "resource": "configmaps", "code": "403"})
		})
	}
}

func waitEvent(t *testing.T, w watch.Interface, name string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the watch ended before %s arrived", name)
			}
			if ev.Type == watch.Error {
				t.Fatalf("watch error before %s: %v", name, ev.Object)
			}
			if cm, ok := ev.Object.(*corev1.ConfigMap); ok && ev.Type == watch.Added && cm.Name == name {
				return
			}
		case <-timeout:
			t.Fatalf("%s never arrived on the watch", name)
		}
	}
}

// TestAttackForgedIdentityHeadersFrontend: alice, with her verified certificate, forges every
// identity header there is, in both modes: Impersonate-User system:admin, Impersonate-Group
// system:masters, X-Remote-User and X-Remote-Group, extras. She gains nothing: forged
// X-Remote-* are dropped (the apiserver sees alice with her groups, and what she may not do
// stays 403), and a request that asks to impersonate (kubectl --as) is refused with a Status
// that says why (it was dropped without a word, and whoami still said alice).
// (Removing the stripping in upstream.assertIdentity lets X-Remote-Group: system:masters
// through in requestheader mode; removing the refusal in server.guard lets Impersonate-Group
// through in impersonate mode: this test then fails.)
func TestAttackForgedIdentityHeadersFrontend(t *testing.T) {
	e := newIdentityEnv(t)
	forged := http.Header{}
	forged.Set("X-Remote-User", "system:admin")
	forged.Add("X-Remote-Group", "system:masters")
	forged.Set("X-Remote-Extra-Scopes", "all")
	impersonate := http.Header{}
	impersonate.Set("Impersonate-User", "system:admin")
	impersonate.Add("Impersonate-Group", "system:masters")
	impersonate.Set("Impersonate-Extra-Scopes", "all")
	for _, mode := range []string{"impersonate", "requestheader"} {
		t.Run(mode, func(t *testing.T) {
			p, url := e.start(t, mode)
			hc := e.httpClient(t, "alice")
			if user, groups := whoamiVia(t, hc, url, forged); user != "alice" || !slices.Equal(groups, []string{"system:authenticated"}) {
				t.Fatalf("with forged identity headers alice is seen as %q %v", user, groups)
			}
			// Each forged header alone, too: none of them may add to what alice is.
			for k, v := range forged {
				h := http.Header{k: v}
				if user, groups := whoamiVia(t, hc, url, h); user != "alice" || !slices.Equal(groups, []string{"system:authenticated"}) {
					t.Fatalf("with a forged %s alice is seen as %q %v", k, user, groups)
				}
			}
			for k, v := range impersonate {
				code, user, _, _ := cluster.WhoAmI(hc, url, http.Header{k: v})
				if code != http.StatusForbidden || user != "" {
					t.Fatalf("alice with %s: %d as %q, want watchsan's 403", k, code, user)
				}
			}
			get := func(path string, h http.Header) (int, string) {
				req, _ := http.NewRequest(http.MethodGet, url+path, nil)
				for k, v := range h {
					req.Header[k] = v
				}
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
				resp.Body.Close()
				return resp.StatusCode, string(body)
			}
			for _, path := range []string{"/api/v1/namespaces/" + identityNSB + "/configmaps", "/api/v1/namespaces/" + identityNSB + "/configmaps?watch=1", "/api/v1/namespaces/kube-system/secrets"} {
				if code, body := get(path, forged); code != http.StatusForbidden || !strings.Contains(body, `User \"alice\"`) {
					t.Fatalf("alice with forged headers, GET %s: %d %s, want 403 for alice", path, code, body)
				}
				if code, body := get(path, impersonate); code != http.StatusForbidden || !strings.Contains(body, "watchsan: Impersonate-") || !strings.Contains(body, "--identity-forwarding") {
					t.Fatalf("alice asking to impersonate, GET %s: %d %s, want watchsan's 403 saying why", path, code, body)
				}
			}
			p.requireProxied(2, map[string]string{"resource": "configmaps", "code": "403"})
			if n := p.Metric("watchsan_requests_refused_total", map[string]string{"reason": "impersonation"}); n != 6 {
				t.Fatalf("refused{reason=impersonation} = %v, want 6", n)
			}
		})
	}
}

// TestAttackFrontendCredentials: in both modes, a certificate from a CA watchsan does not trust
// is refused at the handshake (nothing reaches the apiserver); a bearer token passes unchanged
// and is the identity, with a certificate or without; a client with neither is anonymous,
// never watchsan's own identity.
func TestAttackFrontendCredentials(t *testing.T) {
	e := newIdentityEnv(t)
	for _, mode := range []string{"impersonate", "requestheader"} {
		t.Run(mode, func(t *testing.T) {
			p, url := e.start(t, mode)
			before := p.Metric("watchsan_requests_total", nil)
			_, err := e.httpClient(t, "untrusted-alice").Get(url + "/api/v1/namespaces/" + identityNSA + "/configmaps")
			if err == nil {
				t.Fatal("a certificate from an untrusted CA was accepted")
			}
			eventually(t, 5*time.Second, "watchsan's log of the refused handshake", func() bool {
				return strings.Contains(p.Log(), "TLS handshake error") && strings.Contains(p.Log(), "certificate signed by unknown authority")
			})
			if got := p.Metric("watchsan_requests_total", nil); got != before {
				t.Fatalf("the untrusted client's request was served (%v requests, before %v)", got, before)
			}

			tokenHeader := http.Header{"Authorization": {"Bearer " + e.c.UserToken}}
			for _, user := range []string{"", "alice"} {
				if who, _ := whoamiVia(t, e.httpClient(t, user), url, tokenHeader); who != cluster.LimitedUser {
					t.Fatalf("a bearer token (certificate %q) is seen as %q, want the token's user %q", user, who, cluster.LimitedUser)
				}
			}
			cs, err := kubernetes.NewForConfig(e.restConfig(url, "alice", e.c.UserToken))
			if err != nil {
				t.Fatal(err)
			}
			ctx := ctxT(t, time.Minute)
			if _, err := cs.CoreV1().ConfigMaps(cluster.LimitedNamespace).List(ctx, metav1.ListOptions{}); err != nil {
				t.Fatalf("the token's own permissions: %v", err)
			}
			if _, err := cs.CoreV1().ConfigMaps(identityNSA).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
				t.Fatalf("with a token, alice's certificate lent its permissions: %v, want 403", err)
			}

			resp, err := e.httpClient(t, "").Get(url + "/api/v1/namespaces/" + identityNSA + "/configmaps")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "system:anonymous") {
				t.Fatalf("neither token nor certificate: %d %s, want 403 for system:anonymous", resp.StatusCode, body)
			}
			p.requireProxied(1, map[string]string{"verb": "list", "resource": "configmaps", "code": "200"})
		})
	}
}

// TestIdentityTLSRotation: the running binary picks up a rotated client CA and serving
// certificate from its files, without a restart: a certificate of the new CA is let in and
// forwarded as its user, one of the old CA is refused, and handshakes present the new serving
// certificate.
func TestIdentityTLSRotation(t *testing.T) {
	e := newIdentityEnv(t)
	newCA, err := cluster.NewCA(e.dir, "rotated-client-ca")
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := newCA.IssueClient("bob-rotated", "bob", identityGroupB)
	if err != nil {
		t.Fatal(err)
	}
	e.certs["bob-rotated"] = [2]string{crt, key}
	// watchsan reads copies, which the test then replaces the way a Secret volume does.
	caFile, certFile, keyFile := filepath.Join(e.dir, "live-ca.crt"), filepath.Join(e.dir, "live-tls.crt"), filepath.Join(e.dir, "live-tls.key")
	copyFile(t, e.clientCA.File, caFile)
	copyFile(t, e.servingCrt, certFile)
	copyFile(t, e.servingKey, keyFile)
	e.clientCA.File, e.servingCrt, e.servingKey = caFile, certFile, keyFile
	p, url := e.start(t, "requestheader")

	servingSerial := func() string {
		hc := e.httpClient(t, "")
		resp, err := hc.Get(url + "/version")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.TLS.PeerCertificates[0].SerialNumber.String()
	}
	oldSerial := servingSerial()
	if user, _ := whoamiVia(t, e.httpClient(t, "alice"), url, nil); user != "alice" {
		t.Fatalf("before the rotation alice is %q", user)
	}
	if _, err := e.httpClient(t, "bob-rotated").Get(url + "/version"); err == nil {
		t.Fatal("a certificate of the next client CA was accepted before the rotation")
	}

	newCrt, newKey, err := e.servingCA.IssueServing("watchsan-serving-rotated")
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, newCA.File, caFile)
	copyFile(t, newKey, keyFile) // key first: in between, the pair does not load and the old one stays
	copyFile(t, newCrt, certFile)
	eventually(t, 10*time.Second, "the rotated serving certificate", func() bool { return servingSerial() != oldSerial })
	if user, groups := whoamiVia(t, e.httpClient(t, "bob-rotated"), url, nil); user != "bob" || !slices.Contains(groups, identityGroupB) {
		t.Fatalf("after the rotation the new CA's bob is %q %v", user, groups)
	}
	if _, err := e.httpClient(t, "alice").Get(url + "/version"); err == nil {
		t.Fatal("a certificate of the replaced client CA is still accepted")
	}
	if got := p.Metric("watchsan_tls_reloads_total", map[string]string{"result": "ok"}); got < 1 {
		t.Fatalf("watchsan_tls_reloads_total{result=ok} = %v", got)
	}
	p.requireProxied(2, map[string]string{"code": "201"})
}

// copyFile replaces dst with src's content atomically (a rename, as a Secret volume swaps).
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}
