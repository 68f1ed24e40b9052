package e2e

// The lending guard's attack suite: each test is one attack on a watchsan that lends its identity,
// as measured before the guard, and fails if the guard that stops it is removed.

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/test/cluster"
)

// rawHTTP sends req as written on a fresh connection to addr and returns the status code and
// body (0 and the error text when there is no answer within 10 s).
func rawHTTP(t *testing.T, addr, req string) (int, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return resp.StatusCode, nil
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, body
}

// watchsanStatus decodes a Status that watchsan itself wrote (its message says so).
func watchsanStatus(t *testing.T, body []byte) metav1.Status {
	t.Helper()
	var st metav1.Status
	if err := json.Unmarshal(body, &st); err != nil || st.Kind != "Status" || !strings.HasPrefix(st.Message, "watchsan: ") {
		t.Fatalf("not a Status from watchsan: %v %s", err, body)
	}
	return st
}

// TestAttackBrowserAndRebinding: with watchsan lending the cluster admin's token, a web page
// (DNS rebinding, cross-origin requests, a cross-origin WebSocket to exec, a CORS preflight)
// and a client naming no host got the admin's identity. Now each is refused with a Status
// naming the flag that allows it, while kubectl-style requests from this machine still get
// the identity and requests with their own token are the apiserver's to judge.
func TestAttackBrowserAndRebinding(t *testing.T) {
	c, p, _, _ := frontCluster(t, cluster.Options{})
	addr := strings.TrimPrefix(p.URL, "http://")
	const ok = "Host: 127.0.0.1\r\n"
	exec := "/api/v1/namespaces/default/pods/p/exec?command=sh&stdout=true"
	ws := "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n"
	secrets := "/api/v1/namespaces/default/secrets"
	for _, tc := range []struct {
		name, req string
		code      int
		flag      string
	}{
		{"DNS rebinding", "GET " + secrets + " HTTP/1.1\r\nHost: evil.example:8001\r\n\r\n", 403, "--accept-hosts"},
		{"HTTP/1.0 without Host", "GET " + secrets + " HTTP/1.0\r\n\r\n", 403, "--accept-hosts"},
		{"cross-origin WebSocket exec", "GET " + exec + " HTTP/1.1\r\n" + ok + ws + "Origin: http://evil.example\r\n\r\n", 403, "--accept-hosts"},
		{"cross-origin read", "GET " + secrets + " HTTP/1.1\r\n" + ok + "Origin: http://evil.example\r\n\r\n", 403, "--accept-hosts"},
		{"CORS preflight", "OPTIONS " + secrets + " HTTP/1.1\r\n" + ok + "Origin: http://evil.example\r\nAccess-Control-Request-Method: DELETE\r\n\r\n", 403, "preflight"},
		{"exec with the lent identity", "POST " + exec + " HTTP/1.1\r\n" + ok + "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n", 403, "--reject-paths"},
		{"attach with the lent identity", "GET /api/v1/namespaces/default/pods/p/attach HTTP/1.1\r\n" + ok + ws + "\r\n", 403, "--reject-paths"},
	} {
		code, body := rawHTTP(t, addr, tc.req)
		if code != tc.code {
			t.Fatalf("%s: got %d %s, want %d", tc.name, code, body, tc.code)
		}
		if st := watchsanStatus(t, body); !strings.Contains(st.Message, tc.flag) {
			t.Fatalf("%s: message %q does not name %s", tc.name, st.Message, tc.flag)
		}
	}
	if n := p.Metric("watchsan_requests_refused_total", nil); n != 7 {
		t.Fatalf("watchsan_requests_refused_total = %v, want 7", n)
	}

	// What must keep working: this machine's clients get the lent identity, by any loopback
	// name; a client with its own token exec's as itself (the apiserver answers: no such pod).
	for _, host := range []string{"127.0.0.1", "localhost:8001", "[::1]:8001"} {
		if code, body := rawHTTP(t, addr, "GET "+secrets+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); code != 200 {
			t.Fatalf("Host %s: %d %s", host, code, body)
		}
	}
	code, body := rawHTTP(t, addr, "POST "+exec+" HTTP/1.1\r\n"+ok+"Authorization: Bearer "+c.AdminToken+"\r\nContent-Length: 0\r\n\r\n")
	var st metav1.Status
	if code != 404 || json.Unmarshal(body, &st) != nil || strings.HasPrefix(st.Message, "watchsan") {
		t.Fatalf("exec with own credentials: %d %s, want the apiserver's 404", code, body)
	}
	p.requireProxied(3, map[string]string{"verb": "list", "resource": "secrets", "code": "200"})
}

// TestAttackPathPrefixEscape: behind an upstream with a path prefix (Rancher's
// https://host/k8s/clusters/c1), dot segments climbed out of the prefix with the lent token:
// /../../../v3/tokens reached the upstream as /k8s/clusters/c1/../../../v3/tokens, which the
// server resolves to /v3/tokens. Every form is refused before anything goes upstream.
func TestAttackPathPrefixEscape(t *testing.T) {
	up := newTLSUpstream(t, nil)
	kc := up.kubeconfig(t, "/k8s/clusters/c1", "lent-token", "", "")
	p := startProxy(t, "--kubeconfig="+kc)
	addr := strings.TrimPrefix(p.URL, "http://")
	for _, path := range []string{"/../../../v3/tokens", "/%2e%2e/%2e%2e/%2e%2e/v3/tokens", "/..%2f..%2f..%2fv3/tokens",
		"/%2E%2E/v3/tokens", "/api/v1/../../../v3/tokens", "/api/./v1/namespaces", "/api/v1/%2e/namespaces"} {
		for _, auth := range []string{"", "Authorization: Bearer own\r\n"} {
			code, body := rawHTTP(t, addr, "GET "+path+" HTTP/1.1\r\nHost: 127.0.0.1\r\n"+auth+"\r\n")
			if code != 400 {
				t.Fatalf("%s (%q): %d %s, want 400", path, auth, code, body)
			}
			watchsanStatus(t, body)
		}
	}
	if seen := up.take(); len(seen) != 0 {
		t.Fatalf("refused requests reached the upstream: %v", seen)
	}
	if code, _ := rawHTTP(t, addr, "GET /api/v1/namespaces HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); code != 200 {
		t.Fatalf("a clean path: %d", code)
	}
	if seen := up.take(); len(seen) != 1 || seen[0].path != "/k8s/clusters/c1/api/v1/namespaces" || seen[0].auth != "Bearer lent-token" {
		t.Fatalf("a clean path reached the upstream as %+v", seen)
	}
}

// TestAttackForgedRemoteHeaders: an apiserver that trusts a front proxy's client certificate
// (--requestheader-client-ca-file) takes the user and groups from X-Remote-* headers. When the
// identity watchsan lends includes such a certificate (here with the limited user's token), a
// client that forged X-Remote-User/-Group became whoever it named, system:masters included.
// Now it gains nothing: it acts as the lent identity.
func TestAttackForgedRemoteHeaders(t *testing.T) {
	dir := t.TempDir()
	proxyCA, proxyCert, proxyKey := frontProxyPKI(t, dir)
	c := newCluster(t, cluster.Options{APIServerFlags: []string{
		"--requestheader-client-ca-file=" + proxyCA,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
	}})
	kc := filepath.Join(dir, "kc")
	if err := os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: u, user: {token: %q, client-certificate: %q, client-key: %q}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, c.APIServers[0].URL, c.CAFile, c.UserToken, proxyCert, proxyKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	forge := func(h http.Header) {
		h.Set("X-Remote-User", "mallory")
		h.Set("X-Remote-Group", "system:masters")
		h.Set("X-Remote-Extra-Scopes", "all")
	}
	secrets := "/api/v1/namespaces/default/secrets"

	// The setup is real: the same certificate with forged headers, sent directly, is admin.
	cert, err := tls.LoadX509KeyPair(proxyCert, proxyKey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(c.CAData)
	direct := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}}}}
	req, _ := http.NewRequest(http.MethodGet, c.APIServers[0].URL+secrets, nil)
	forge(req.Header)
	resp, err := direct.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("direct, the front-proxy certificate with forged headers got %d: the apiserver does not trust it as a front proxy, the test means nothing", resp.StatusCode)
	}

	p := startProxy(t, "--kubeconfig="+kc)
	whoami := func(h http.Header) (string, []string) {
		t.Helper()
		code, user, groups, err := cluster.WhoAmI(http.DefaultClient, p.URL, h)
		if err != nil || code != http.StatusCreated {
			t.Fatalf("selfsubjectreview: %d %v", code, err)
		}
		return user, groups
	}
	forged := http.Header{}
	forge(forged)
	if user, groups := whoami(forged); user != cluster.LimitedUser {
		t.Fatalf("with forged X-Remote-* headers the apiserver sees %q %v, want the lent identity %q", user, groups, cluster.LimitedUser)
	}
	req, _ = http.NewRequest(http.MethodGet, p.URL+secrets, nil)
	forge(req.Header)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("listing secrets with forged headers through watchsan: %d, want 403 (the limited user's answer)", resp.StatusCode)
	}
	// The lent identity itself works.
	resp, err = http.Get(p.URL + "/api/v1/namespaces/" + cluster.LimitedNamespace + "/configmaps")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("the lent identity's own request: %d", resp.StatusCode)
	}
	p.requireProxied(1, map[string]string{"verb": "list", "resource": "secrets", "code": "403"})
}

// TestAttackCredentialsToWrongUpstream: with a kubeconfig naming https://...:18443, watchsan
// lent its token in cleartext to --upstream http://127.0.0.1:18080. Lending to a plain-HTTP
// upstream, or to one the kubeconfig does not name, is now refused at start (exit 2, naming
// --allow-credentials-to-upstream) and nothing reaches that upstream; the flag allows it.
func TestAttackCredentialsToWrongUpstream(t *testing.T) {
	var mu sync.Mutex
	var auths []string
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
	}))
	defer plain.Close()
	other := newTLSUpstream(t, nil)
	kc := filepath.Join(t.TempDir(), "kc")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:18443"}}]
users: [{name: u, user: {token: secret-token-value}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ upstream, want string }{
		{plain.URL, "cleartext"},
		{other.URL, "not the kubeconfig's server"},
	} {
		// Bounded: a watchsan that accepts this configuration serves until killed.
		cmd := exec.CommandContext(ctxT(t, 20*time.Second), watchsanBin, "--kubeconfig="+kc, "--upstream="+tc.upstream, "--listen=127.0.0.1:0", "--admin-listen=127.0.0.1:0")
		cmd.Env = append(os.Environ(), "KUBECONFIG=/nonexistent")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("--upstream %s: exit %v, want 2 at start\n%s", tc.upstream, err, stderr.String())
		}
		out := stderr.String()
		if !strings.Contains(out, tc.want) || !strings.Contains(out, "--allow-credentials-to-upstream="+tc.upstream) || strings.Contains(out, "secret-token-value") {
			t.Fatalf("--upstream %s: output does not explain (or shows the token):\n%s", tc.upstream, out)
		}
	}
	mu.Lock()
	n := len(auths)
	mu.Unlock()
	if n != 0 {
		t.Fatalf("the refused configuration sent %d requests to the plain-HTTP upstream", n)
	}
	// Explicitly allowed: the operator's choice, taken as given.
	p := startProxy(t, "--kubeconfig="+kc, "--upstream="+plain.URL, "--allow-credentials-to-upstream="+plain.URL)
	resp, err := http.Get(p.URL + "/version")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(auths) == 0 || auths[len(auths)-1] != "Bearer secret-token-value" {
		t.Fatalf("allowed upstream got %q", auths)
	}
}

// TestGuardInsecureKubeconfigWarns: a kubeconfig's insecure-skip-tls-verify lent over
// unverified TLS without a word; it now warns as the flag does.
func TestGuardInsecureKubeconfigWarns(t *testing.T) {
	up := newTLSUpstream(t, nil)
	kc := filepath.Join(t.TempDir(), "kc")
	if err := os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: lent-token}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, up.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, "--kubeconfig="+kc)
	for _, l := range strings.Split(p.Log(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["level"] == "warn" && strings.Contains(fmt.Sprint(m["msg"]), "insecure-skip-tls-verify") {
			return
		}
	}
	t.Fatalf("no warning about the kubeconfig's insecure-skip-tls-verify:\n%s", p.Log())
}

// TestAttackMetricsCardinality: 20000 requests with random 200-character methods grew RSS from
// 29 to 111 MB and /metrics to 71 MB. Now every made-up method is verb "other".
func TestAttackMetricsCardinality(t *testing.T) {
	_, p, _, _ := frontCluster(t, cluster.Options{})
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	defer tr.CloseIdleConnections()
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				b := make([]byte, 100)
				_, _ = rand.Read(b)
				req, _ := http.NewRequest(strings.ToUpper(hex.EncodeToString(b)), p.URL+"/version", nil)
				if resp, err := tr.RoundTrip(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		}()
	}
	wg.Wait()
	eventually(t, 10*time.Second, "2000 requests counted", func() bool {
		return p.Metric("watchsan_requests_total", map[string]string{"verb": "other"}) >= 2000
	})
	resp, err := http.Get(p.AdminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if len(body) > 256<<10 {
		t.Fatalf("/metrics is %d bytes after 2000 made-up methods", len(body))
	}
}

// TestAttackIdleConnections: connections that said nothing more after a request stayed open
// for good (500 plain, 40 TLS after 100-120 s). With --idle-timeout they are closed, while a
// watch quiet for longer than that lives on and delivers its event, over HTTP/1.1 and HTTP/2.
func TestAttackIdleConnections(t *testing.T) {
	c := newCluster(t, cluster.Options{})
	dir := t.TempDir()
	direct := filepath.Join(dir, "direct.kubeconfig")
	if err := c.WriteKubeconfig(direct, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	const idle = 2 * time.Second
	plain := startProxy(t, "--kubeconfig="+direct, "--idle-timeout="+idle.String())
	secure := startProxy(t, "--kubeconfig="+direct, "--idle-timeout="+idle.String(),
		"--tls-cert-file="+filepath.Join(c.Dir, "serving.crt"), "--tls-private-key-file="+filepath.Join(c.Dir, "serving.key"))
	secureURL := "https://" + strings.TrimPrefix(secure.URL, "http://")
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(c.CAData)
	h2 := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}}

	ns := "idle"
	admin, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 2*time.Minute)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	type openWatch struct {
		name string
		dec  *json.Decoder
		body io.Closer
	}
	var watches []openWatch
	for _, w := range []struct {
		name, url string
		c         *http.Client
		major     int
	}{{"HTTP/1.1", plain.URL, http.DefaultClient, 1}, {"HTTP/2", secureURL, h2, 2}} {
		resp, err := w.c.Get(w.url + "/api/v1/namespaces/" + ns + "/configmaps?watch=true")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.ProtoMajor != w.major {
			t.Fatalf("%s watch: %s %s", w.name, resp.Status, resp.Proto)
		}
		watches = append(watches, openWatch{w.name, json.NewDecoder(resp.Body), resp.Body})
	}

	// 40 keep-alive connections after a request, 10 that never send one, 5 TLS ones.
	var idleConns []net.Conn
	for i := 0; i < 40; i++ {
		conn, err := net.Dial("tcp", strings.TrimPrefix(plain.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, _ = io.WriteString(conn, "GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("request before idling: %v %v", resp, err)
		}
		resp.Body.Close()
		idleConns = append(idleConns, conn)
	}
	for i := 0; i < 10; i++ {
		conn, err := net.Dial("tcp", strings.TrimPrefix(plain.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		idleConns = append(idleConns, conn)
	}
	for i := 0; i < 5; i++ {
		conn, err := tls.Dial("tcp", strings.TrimPrefix(secure.URL, "http://"), &tls.Config{RootCAs: roots, NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, _ = io.WriteString(conn, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
		idleConns = append(idleConns, conn)
	}
	deadline := time.Now().Add(4 * idle)
	for i, conn := range idleConns {
		_ = conn.SetReadDeadline(deadline)
		_, err := io.Copy(io.Discard, conn)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("idle connection %d of %d still open %v after it went idle, with --idle-timeout=%v", i, len(idleConns), 4*idle, idle)
		}
	}

	// The watches have been quiet for several idle timeouts; an event still arrives on each.
	if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-quiet"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, w := range watches {
		var ev struct {
			Type   string
			Object struct{ Metadata struct{ Name string } }
		}
		if err := w.dec.Decode(&ev); err != nil || ev.Type != "ADDED" || ev.Object.Metadata.Name != "after-quiet" {
			t.Fatalf("%s watch quiet longer than --idle-timeout: %+v, %v", w.name, ev, err)
		}
		w.body.Close()
	}
}

// TestAttackConnectionFlood: a client holding connections took every file descriptor (limit
// 1024), so accept failed and even the admin /healthz stopped answering. Now the main
// listener's limit is fitted to the open-file limit (and --max-connections) and the admin
// listener keeps its own: it answers /healthz and /metrics while the main one is full, and a
// freed connection lets a waiting client in.
func TestAttackConnectionFlood(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit (util-linux) is needed to run watchsan with a low open-file limit")
	}
	_, p, _, _ := frontClusterUnder(t, []string{prlimit, "--nofile=512:512", "--"}, "--idle-timeout=3s")
	if !strings.Contains(p.Log(), `"maxConnections":192`) || !strings.Contains(p.Log(), "--max-connections 1000 lowered to 192") {
		t.Fatalf("with 512 open files the connection limit is not (512-128)/2 = 192, or was lowered silently:\n%s", p.Log())
	}
	addr := strings.TrimPrefix(p.URL, "http://")
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := 0; i < 600; i++ { // more than the open-file limit
		conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			break // the kernel's backlog is full: that is the attacker's problem
		}
		held = append(held, conn)
	}
	admin := &http.Client{Timeout: 5 * time.Second}
	for _, path := range []string{"/healthz", "/metrics"} {
		resp, err := admin.Get(p.AdminURL + path)
		if err != nil {
			t.Fatalf("admin %s with %d connections held on the main listener: %v", path, len(held), err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("admin %s: %d", path, resp.StatusCode)
		}
	}
	eventually(t, 10*time.Second, "the main listener to hold its limit, 192 connections", func() bool {
		return p.Metric("watchsan_connections", map[string]string{"listener": "main"}) == 192
	})
	// The flood says nothing: the header timeout (here 3 s) frees its connections batch by
	// batch, without its cooperation. A client beyond the limit meanwhile is never left in a
	// silent backlog: it is answered at once, 429 with Retry-After, or, while the flood's own
	// silent connections take every answer slot, its connection is closed; client-go retries
	// both for a GET. Retrying as a client does, it gets in once the flood is freed.
	deadline := time.Now().Add(60 * time.Second)
	for attempt := 1; ; attempt++ {
		start := time.Now()
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(p.URL + "/version")
		took := time.Since(start)
		var ne net.Error
		switch {
		case err != nil && errors.As(err, &ne) && ne.Timeout():
			t.Fatalf("attempt %d: a client beyond %d silent connections waited %v unanswered: %v", attempt, len(held), took, err)
		case err == nil && resp.StatusCode == http.StatusOK:
			resp.Body.Close()
			if strings.Contains(p.Log(), "too many open files") {
				t.Fatalf("after the flood:\n%s", p.Log())
			}
			t.Logf("attempt %d got in, %v after the flood", attempt, time.Since(deadline.Add(-60*time.Second)))
			answered := p.Metric("watchsan_connections_shed_total", map[string]string{"reason": "max_connections"})
			closed := p.Metric("watchsan_connections_shed_total", map[string]string{"reason": "max_connections_unanswered"})
			if answered+closed < float64(len(held)-192) {
				t.Errorf("connections over the limit: %v answered 429, %v closed unanswered; want the %d of the flood beyond 192 each one or the other, none left in the backlog",
					answered, closed, len(held)-192)
			}
			return
		case err == nil && resp.StatusCode != http.StatusTooManyRequests:
			resp.Body.Close()
			t.Fatalf("attempt %d: %d, want 200 or a retriable 429", attempt, resp.StatusCode)
		case err == nil:
			if resp.Header.Get("Retry-After") == "" {
				t.Errorf("attempt %d: a 429 without Retry-After", attempt)
			}
			resp.Body.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("no attempt got in within 60 s of the flood (last: %v, took %v)", err, took)
		}
		time.Sleep(500 * time.Millisecond) // a client's retry pacing, as client-go's Retry-After of 1 s
	}
}

// frontClusterUnder is frontCluster with watchsan run by wrap.
func frontClusterUnder(t *testing.T, wrap []string, extra ...string) (*cluster.Cluster, *proxy, string, string) {
	t.Helper()
	c := newCluster(t, cluster.Options{})
	dir := t.TempDir()
	direct := filepath.Join(dir, "direct.kubeconfig")
	if err := c.WriteKubeconfig(direct, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	p := startProxyUnder(t, wrap, append([]string{"--kubeconfig=" + direct}, extra...)...)
	return c, p, direct, ""
}

// TestUpgradeSPDYAndWebSocketToHTTP2Upstream: exec/attach/port-forward from kubectl and
// client-go upgrade with SPDY/3.1 (and fall back to it from WebSocket); against an upstream
// that speaks HTTP/2 watchsan answered 502 "http2: invalid Upgrade request header". Both
// upgrades now reach such an upstream (no kubelet runs here: it is the test's own, over TLS
// with HTTP/2 on) over HTTP/1.1, with the lent identity or the client's, and echo both ways.
func TestUpgradeSPDYAndWebSocketToHTTP2Upstream(t *testing.T) {
	up := newTLSUpstream(t, websocket.Handler(func(ws *websocket.Conn) { _, _ = io.Copy(ws, ws) }))
	kc := up.kubeconfig(t, "", "lent-token", "", "")
	// A controller that needs exec sets --reject-paths without it (docs/security.md).
	p := startProxy(t, "--kubeconfig="+kc, "--reject-paths=")
	addr := strings.TrimPrefix(p.URL, "http://")

	resp, err := http.Get(p.URL + "/version")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if s := up.take(); len(s) != 1 || s[0].proto != "HTTP/2.0" {
		t.Fatalf("a plain request reached the upstream as %+v; it must speak HTTP/2 for this test to mean anything", s)
	}

	for _, auth := range []string{"", "Bearer own-token"} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		req := "POST /api/v1/namespaces/default/pods/p/exec?command=cat&stdin=true&stdout=true HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
			"Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n"
		if auth != "" {
			req += "Authorization: " + auth + "\r\n"
		}
		_, _ = io.WriteString(conn, req+"\r\n")
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			body := []byte{}
			if resp != nil {
				body, _ = io.ReadAll(resp.Body)
			}
			t.Fatalf("SPDY upgrade (auth %q): %v %v %s", auth, resp, err, body)
		}
		for i := 0; i < 3; i++ {
			msg := fmt.Sprintf("frame %d\n", i)
			_, _ = io.WriteString(conn, msg)
			if line, err := br.ReadString('\n'); err != nil || line != msg {
				t.Fatalf("SPDY echo: %q %v", line, err)
			}
		}
		conn.Close()
		want := "Bearer lent-token"
		if auth != "" {
			want = auth
		}
		if s := up.take(); len(s) != 1 || s[0].proto != "HTTP/1.1" || s[0].auth != want {
			t.Fatalf("the SPDY upgrade reached the upstream as %+v, want HTTP/1.1 with %q", s, want)
		}
	}

	ws, err := websocket.Dial("ws://"+addr+"/api/v1/namespaces/default/pods/p/exec?command=cat", "v5.channel.k8s.io", "http://"+addr) // the listener's own origin: another (another port) is refused
	if err != nil {
		t.Fatalf("WebSocket through watchsan: %v", err)
	}
	defer ws.Close()
	if _, err := ws.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16)
	if n, err := ws.Read(buf); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("WebSocket echo: %q %v", buf[:n], err)
	}
	if s := up.take(); len(s) != 1 || s[0].proto != "HTTP/1.1" || s[0].auth != "Bearer lent-token" {
		t.Fatalf("the WebSocket upgrade reached the upstream as %+v", s)
	}
	ws.Close()
	eventually(t, 10*time.Second, "the upgrades to be counted", func() bool {
		return p.Metric("watchsan_requests_total", map[string]string{"code": "101", "resource": "pods/exec"}) >= 3
	})
}

// TestGuardListenFailureExit2: an address in use exited 1 with a JSON log line; it is a
// configuration problem: exit 2 and one readable line.
func TestGuardListenFailureExit2(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cmd := exec.Command(watchsanBin, "--upstream=https://127.0.0.1:1", "--listen="+ln.Addr().String(), "--admin-listen=127.0.0.1:0")
	cmd.Env = append(os.Environ(), "KUBECONFIG=/nonexistent")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("exit %v, want 2\n%s", err, stderr.String())
	}
	want := "watchsan: cannot start: --listen " + ln.Addr().String() + ": bind: address already in use\n"
	if stderr.String() != want {
		t.Fatalf("output %q, want %q", stderr.String(), want)
	}
}

// tlsUpstream is an upstream of the test's own: TLS with HTTP/2 on, as an apiserver; it
// records each request, answers /readyz, answers a SPDY upgrade with 101 and an echo, and a
// WebSocket one with ws (if set).
type tlsUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	seen []seenReq
}

type seenReq struct{ path, proto, auth string }

func newTLSUpstream(t *testing.T, ws http.Handler) *tlsUpstream {
	t.Helper()
	u := &tlsUpstream{}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/readyz") { // watchsan's health probes
			return
		}
		u.mu.Lock()
		u.seen = append(u.seen, seenReq{r.URL.EscapedPath(), r.Proto, r.Header.Get("Authorization")})
		u.mu.Unlock()
		switch {
		case strings.EqualFold(r.Header.Get("Upgrade"), "websocket") && ws != nil:
			ws.ServeHTTP(w, r)
		case r.Header.Get("Upgrade") != "":
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				http.Error(w, "cannot hijack over "+r.Proto+": "+err.Error(), http.StatusInternalServerError)
				return
			}
			defer conn.Close()
			fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", r.Header.Get("Upgrade"))
			_ = brw.Flush()
			_, _ = io.Copy(conn, brw)
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"major":"1","minor":"37"}`)
		}
	}))
	u.EnableHTTP2 = true
	u.StartTLS()
	t.Cleanup(u.Close)
	return u
}

func (u *tlsUpstream) take() []seenReq {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.seen
	u.seen = nil
	return s
}

// kubeconfig writes a kubeconfig naming u (with path appended) that verifies it, with token
// and, if given, a client certificate.
func (u *tlsUpstream) kubeconfig(t *testing.T, path, token, certFile, keyFile string) string {
	t.Helper()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: u.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	user := fmt.Sprintf("{token: %q}", token)
	if certFile != "" {
		user = fmt.Sprintf("{token: %q, client-certificate: %q, client-key: %q}", token, certFile, keyFile)
	}
	kc := filepath.Join(dir, "kc")
	if err := os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: u, user: %s}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, u.URL+path, ca, user)), 0o600); err != nil {
		t.Fatal(err)
	}
	return kc
}

// frontProxyPKI writes a front-proxy CA and a client certificate it signed, as kubeadm's
// front-proxy-ca and front-proxy-client.
func frontProxyPKI(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "front-proxy-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "front-proxy-client"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	caFile, certFile, keyFile = filepath.Join(dir, "front-proxy-ca.crt"), filepath.Join(dir, "front-proxy-client.crt"), filepath.Join(dir, "front-proxy-client.key")
	for f, b := range map[string][]byte{
		caFile:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		certFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyFile:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}),
	} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return caFile, certFile, keyFile
}
