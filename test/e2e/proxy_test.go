package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/websocket"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/watchsan/watchsan/test/cluster"
)

// frontCluster starts a cluster and a watchsan in front of it that lends the admin identity
// (from a kubeconfig) to requests without credentials. It returns kubeconfigs for kubectl:
// direct (admin token, https) and via watchsan (http, no credentials).
func frontCluster(t *testing.T, o cluster.Options, extra ...string) (c *cluster.Cluster, p *proxy, direct, via string) {
	t.Helper()
	c = newCluster(t, o)
	dir := t.TempDir()
	direct = filepath.Join(dir, "direct.kubeconfig")
	if err := c.WriteKubeconfig(direct, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--kubeconfig=" + direct}, extra...)
	p = startProxy(t, args...)
	via = filepath.Join(dir, "via.kubeconfig")
	if err := c.WriteKubeconfig(via, p.URL, "", ""); err != nil {
		t.Fatal(err)
	}
	return c, p, direct, via
}

const cmYAML = `apiVersion: v1
kind: ConfigMap
metadata:
  name: %s
  namespace: default
  labels: {app: e2e}
data:
  key: %s
`

func TestKubectlThroughProxy(t *testing.T) {
	c, p, direct, via := frontCluster(t, cluster.Options{})
	ctx := ctxT(t, 3*time.Minute)
	kc := func(cfg string, stdin string, args ...string) string {
		t.Helper()
		cmd := c.KubectlCmd(ctx, cfg, args...)
		cmd.Stdin = strings.NewReader(stdin)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("kubectl %v via %s: %v\n%s", args, filepath.Base(cfg), err, errb.String())
		}
		return out.String()
	}

	// Client-side apply through watchsan; the object is there when read directly.
	kc(via, fmt.Sprintf(cmYAML, "csa", "v1"), "apply", "-f", "-")
	if got := kc(direct, "", "get", "configmap", "csa", "-o", "jsonpath={.data.key}"); got != "v1" {
		t.Fatalf("client-side apply through watchsan: direct read gives %q", got)
	}
	// Server-side apply, then an update by apply.
	kc(via, fmt.Sprintf(cmYAML, "ssa", "s1"), "apply", "--server-side", "-f", "-")
	kc(via, fmt.Sprintf(cmYAML, "ssa", "s2"), "apply", "--server-side", "-f", "-")
	if got := kc(direct, "", "get", "configmap", "ssa", "-o", "jsonpath={.data.key}"); got != "s2" {
		t.Fatalf("server-side apply through watchsan: direct read gives %q", got)
	}
	// get in json and yaml: byte-identical to the same request sent directly.
	for _, format := range []string{"json", "yaml"} {
		d := kc(direct, "", "get", "configmap", "csa", "ssa", "-o", format)
		v := kc(via, "", "get", "configmap", "csa", "ssa", "-o", format)
		if d != v {
			t.Fatalf("get -o %s differs through watchsan:\ndirect:\n%s\nvia:\n%s", format, d, v)
		}
	}
	// Every patch type.
	kc(via, "", "patch", "configmap", "csa", "--type=json", "-p", `[{"op":"replace","path":"/data/key","value":"json"}]`)
	kc(via, "", "patch", "configmap", "csa", "--type=merge", "-p", `{"data":{"merge":"yes"}}`)
	kc(via, "", "patch", "configmap", "csa", "--type=strategic", "-p", `{"metadata":{"labels":{"strategic":"yes"}}}`)
	got := kc(direct, "", "get", "configmap", "csa", "-o", "jsonpath={.data.key}/{.data.merge}/{.metadata.labels.strategic}")
	if got != "json/yes/yes" {
		t.Fatalf("patches through watchsan: direct read gives %q, want json/yes/yes", got)
	}
	// Discovery and OpenAPI: api-resources and explain match the direct answers.
	for _, args := range [][]string{{"api-resources"}, {"api-versions"}, {"explain", "configmap.data"}, {"explain", "deployment.spec.strategy"}} {
		d, v := kc(direct, "", args...), kc(via, "", args...)
		if d != v || d == "" {
			t.Fatalf("kubectl %v differs through watchsan:\ndirect:\n%s\nvia:\n%s", args, d, v)
		}
	}
	// get --watch: lines arrive as the changes happen, one change at a time.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	cmd := c.KubectlCmd(wctx, via, "get", "configmap", "-l", "app=watched", "--watch", "-o", "name")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	for i := 0; i < 3; i++ {
		name := fmt.Sprintf("w%d", i)
		y := strings.Replace(fmt.Sprintf(cmYAML, name, "x"), "app: e2e", "app: watched", 1)
		kc(direct, y, "apply", "-f", "-")
		select {
		case l := <-lines:
			if want := "configmap/" + name; l != want {
				t.Fatalf("kubectl get --watch through watchsan printed %q, want %q", l, want)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("kubectl get --watch through watchsan: no line for %s within 15s (events batched or lost)", name)
		}
	}
	stopWatch()
	_ = cmd.Wait()

	kc(via, "", "delete", "configmap", "csa", "ssa")
	if _, _, err := c.Kubectl(ctx, direct, "get", "configmap", "csa"); err == nil {
		t.Fatal("delete through watchsan: object still there when read directly")
	}
	p.requireProxied(1, map[string]string{"verb": "patch", "resource": "configmaps"})
	p.requireProxied(1, map[string]string{"verb": "delete", "resource": "configmaps"})
	eventually(t, 10*time.Second, "kubectl's watch to be counted", func() bool {
		return p.Metric("watchsan_requests_total", map[string]string{"verb": "watch", "resource": "configmaps"}) >= 1
	})
}

// TestClientGoProtobufWatchOrdered: a client-go client speaking protobuf through watchsan
// creates objects one at a time and sees each one's watch event before making the next, so
// events are neither batched nor reordered.
func TestClientGoProtobufWatchOrdered(t *testing.T) {
	_, p, _, _ := frontCluster(t, cluster.Options{})
	ctx := ctxT(t, 2*time.Minute)
	cfg := &rest.Config{Host: p.URL, ContentConfig: rest.ContentConfig{
		ContentType: runtime.ContentTypeProtobuf, AcceptContentTypes: runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON}}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cms := cs.CoreV1().ConfigMaps("default")
	list, err := cms.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := cms.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion, LabelSelector: "app=pb"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var last int64
	for i := 0; i < 20; i++ {
		name := fmt.Sprintf("pb-%02d", i)
		created, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "pb"}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed before event %d", i)
			}
			cm, isCM := ev.Object.(*corev1.ConfigMap)
			if ev.Type != watch.Added || !isCM || cm.Name != name || cm.ResourceVersion != created.ResourceVersion {
				t.Fatalf("event %d: got %s %v, want ADDED %s rv %s", i, ev.Type, ev.Object, name, created.ResourceVersion)
			}
			var rv int64
			fmt.Sscan(cm.ResourceVersion, &rv)
			if rv <= last {
				t.Fatalf("resourceVersion went from %d to %d", last, rv)
			}
			last = rv
		case <-time.After(10 * time.Second):
			t.Fatalf("event for %s did not arrive within 10s: batched or lost", name)
		}
	}
	w.Stop() // a watch is counted when it ends
	eventually(t, 10*time.Second, "the watch to be counted", func() bool {
		return p.Metric("watchsan_requests_total", map[string]string{"verb": "watch", "resource": "configmaps", "code": "200"}) >= 1
	})
	p.requireProxied(20, map[string]string{"verb": "create", "resource": "configmaps"})
}

// TestLimitedUserRBAC: a request carrying the limited user's token gets exactly that user's
// rights through watchsan, although watchsan lends the admin identity to requests without one.
// The lent identity is a client certificate: the apiserver authenticates a certificate before a
// token, so forwarding the user's token over a connection that presents watchsan's certificate
// would silently make the user an admin.
func TestLimitedUserRBAC(t *testing.T) {
	c := newCluster(t, cluster.Options{})
	kc := filepath.Join(t.TempDir(), "admin-cert.kubeconfig")
	if err := os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: u, user: {client-certificate: %q, client-key: %q}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, c.APIServers[0].URL, c.CAFile, c.AdminCertFile, c.AdminKeyFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, "--kubeconfig="+kc)
	ctx := ctxT(t, time.Minute)
	viaUser, err := kubernetes.NewForConfig(&rest.Config{Host: p.URL, BearerToken: c.UserToken})
	if err != nil {
		t.Fatal(err)
	}
	directUser, err := kubernetes.NewForConfig(c.RESTConfig(0, c.UserToken))
	if err != nil {
		t.Fatal(err)
	}
	for name, cs := range map[string]*kubernetes.Clientset{"direct": directUser, "watchsan": viaUser} {
		if _, err := cs.CoreV1().ConfigMaps(cluster.LimitedNamespace).List(ctx, metav1.ListOptions{}); err != nil {
			t.Fatalf("%s: limited user listing configmaps in its namespace: %v", name, err)
		}
		_, err := cs.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{})
		if st, ok := err.(interface{ Status() metav1.Status }); !ok || st.Status().Code != http.StatusForbidden {
			t.Fatalf("%s: limited user listing secrets: got %v, want 403 Forbidden", name, err)
		}
		_, err = cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "x-"}}, metav1.CreateOptions{})
		if st, ok := err.(interface{ Status() metav1.Status }); !ok || st.Status().Code != http.StatusForbidden {
			t.Fatalf("%s: limited user creating a configmap in default: got %v, want 403", name, err)
		}
	}
	// Without a token, watchsan lends the admin identity: secrets are readable.
	anon, _ := kubernetes.NewForConfig(&rest.Config{Host: p.URL})
	if _, err := anon.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("request without credentials did not get the lent identity: %v", err)
	}
	p.requireProxied(1, map[string]string{"verb": "list", "resource": "secrets", "code": "403"})
	p.requireProxied(1, map[string]string{"verb": "list", "resource": "secrets", "code": "200"})
}

// TestUpgradeRoundTrip: a WebSocket upgrade passes through watchsan both ways (no kubelet runs
// here, so the upstream is the test's own echo server; exec/attach/port-forward use the same
// path).
func TestUpgradeRoundTrip(t *testing.T) {
	var upgrades atomic.Int32
	echo := websocket.Server{Handler: func(ws *websocket.Conn) {
		upgrades.Add(1)
		_, _ = io.Copy(ws, ws)
	}}
	up := httptest.NewServer(echo)
	defer up.Close()
	p := startProxy(t, "--upstream="+up.URL)
	wsURL := "ws" + strings.TrimPrefix(p.URL, "http") + "/api/v1/namespaces/default/pods/x/exec?command=cat"
	ws, err := websocket.Dial(wsURL, "", p.URL)
	if err != nil {
		t.Fatalf("websocket through watchsan: %v", err)
	}
	defer ws.Close()
	for i := 0; i < 5; i++ {
		msg := fmt.Sprintf("hello %d", i)
		if _, err := ws.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 64)
		n, err := ws.Read(buf)
		if err != nil || string(buf[:n]) != msg {
			t.Fatalf("echo %d: got %q, %v", i, buf[:n], err)
		}
	}
	if upgrades.Load() != 1 {
		t.Fatalf("upstream saw %d upgrades, want 1", upgrades.Load())
	}
	ws.Close() // an upgraded request is logged and counted when its connection ends
	eventually(t, 10*time.Second, "the upgrade to be counted", func() bool {
		return p.Metric("watchsan_requests_total", map[string]string{"code": "101", "verb": "get", "resource": "pods/exec"}) >= 1
	})
}

// TestNotAnOpenProxy: CONNECT and absolute-form targets are refused and never reach upstream.
func TestNotAnOpenProxy(t *testing.T) {
	var hits atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" { // watchsan's own health checks
			hits.Add(1)
		}
	}))
	defer up.Close()
	p := startProxy(t, "--upstream="+up.URL)
	host := strings.TrimPrefix(p.URL, "http://")
	for _, tc := range []struct{ req, wantStatus string }{
		{"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", "405"},
		{"GET http://example.com/api HTTP/1.1\r\nHost: example.com\r\n\r\n", "400"},
		{"GET http://" + host + "/api HTTP/1.1\r\nHost: " + host + "\r\n\r\n", "400"},
	} {
		conn, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write([]byte(tc.req)); err != nil {
			t.Fatal(err)
		}
		status, _ := bufio.NewReader(conn).ReadString('\n')
		conn.Close()
		if !strings.Contains(status, " "+tc.wantStatus+" ") {
			t.Fatalf("%q: got status line %q, want %s", strings.SplitN(tc.req, "\r\n", 2)[0], status, tc.wantStatus)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("refused requests reached the upstream %d times", n)
	}
	// A normal request does reach it (the refusals were not a dead proxy).
	resp, err := http.Get(p.URL + "/version")
	if err != nil || resp.StatusCode != 200 || hits.Load() != 1 {
		t.Fatalf("normal request: %v %v hits=%d", resp, err, hits.Load())
	}
	resp.Body.Close()
}

// TestUpstreamDown: with no apiserver listening, a request gets an apiserver-style Status 503
// naming the problem, and watchsan's /readyz fails.
func TestUpstreamDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	p := startProxy(t, "--upstream="+dead, "--retry-budget=1s", "--health-interval=100ms")
	resp, err := http.Get(p.URL + "/api/v1/namespaces/default/configmaps")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st metav1.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("body is not a Status: %v", err)
	}
	if resp.StatusCode != 503 || st.Kind != "Status" || st.Code != 503 || st.Reason != metav1.StatusReasonServiceUnavailable ||
		!strings.Contains(st.Message, "unavailable") || !strings.Contains(st.Message, ln.Addr().String()) {
		t.Fatalf("got %d %+v, want a 503 Status naming the upstream", resp.StatusCode, st)
	}
	eventually(t, 10*time.Second, "/readyz to fail", func() bool {
		r, err := http.Get(p.AdminURL + "/readyz")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == 503
	})
	// The watch path answers the same way.
	resp2, err := http.Get(p.URL + "/api/v1/namespaces/default/configmaps?watch=true")
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != 503 {
		t.Fatalf("watch with upstream down: %d, want 503", resp2.StatusCode)
	}
}

// TestSIGTERMEndsWatchCleanly: a watch open through watchsan when it gets SIGTERM ends with a
// clean end of stream (the client re-watches), and watchsan exits 0.
func TestSIGTERMEndsWatchCleanly(t *testing.T) {
	c, p, _, _ := frontCluster(t, cluster.Options{}, "--shutdown-timeout=20s")
	ctx := ctxT(t, time.Minute)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/api/v1/namespaces/default/configmaps?watch=true&allowWatchBookmarks=false", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("watch: %d", resp.StatusCode)
	}
	// One event proves the stream is live.
	admin, _ := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if _, err := admin.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "before-term"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(resp.Body)
	var ev struct{ Type string }
	for ev.Type != "ADDED" {
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("reading the watch: %v", err)
		}
	}
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for {
		var e map[string]any
		err := dec.Decode(&e)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("watch ended with %v, want a clean end of stream", err)
		}
	}
	select {
	case <-p.exited:
	case <-time.After(25 * time.Second):
		t.Fatal("watchsan did not exit within the shutdown timeout")
	}
	if p.exitErr != nil {
		t.Fatalf("watchsan exit: %v", p.exitErr)
	}
	t.Logf("watch ended and watchsan exited %v after SIGTERM", time.Since(start))
	if !strings.Contains(p.Log(), `"reason":"shutdown"`) && !strings.Contains(p.Log(), "shutting down") {
		t.Fatal("no shutdown in watchsan's log")
	}
}

// TestBadConfig: every problem is reported at once, exit code 2, no stack trace.
func TestBadConfig(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(cfg, []byte("fix-mode: sometimes\nnot-a-key: 1\n"), 0o600)
	cmd := exec.Command(watchsanBin, "--config="+cfg, "--upstream=ftp://x", "--listen=nope", "--log-level=loud", "--bogus")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 2 {
		t.Fatalf("exit: %v, want code 2\n%s", err, stderr.String())
	}
	out := stderr.String()
	for _, want := range []string{"not-a-key", "ftp://x", "--listen", "--log-level", "--bogus"} {
		if !strings.Contains(out, want) {
			t.Errorf("error output does not mention %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "goroutine ") || strings.Contains(out, "panic") {
		t.Fatalf("stack trace in output:\n%s", out)
	}
	// Lending credentials on a non-loopback listener is refused unless overridden.
	kc := filepath.Join(t.TempDir(), "kc")
	os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: secret-token-value}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600)
	cmd = exec.Command(watchsanBin, "--kubeconfig="+kc, "--listen=0.0.0.0:0")
	stderr.Reset()
	cmd.Stderr = &stderr
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), "allow-non-loopback-credentials") {
		t.Fatalf("lending on 0.0.0.0: %v\n%s", err, stderr.String())
	}
	if strings.Contains(stderr.String(), "secret-token-value") {
		t.Fatal("the token appeared in the output")
	}
}

// TestTLSListenerHTTP2: with serving certificates watchsan speaks HTTPS with HTTP/2 to clients,
// and a watch and a list work over it.
func TestTLSListenerHTTP2(t *testing.T) {
	c := newCluster(t, cluster.Options{})
	dir := t.TempDir()
	direct := filepath.Join(dir, "direct.kubeconfig")
	if err := c.WriteKubeconfig(direct, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	// The harness's serving certificate is valid for 127.0.0.1 and signed by the cluster CA.
	p := startProxy(t, "--kubeconfig="+direct, "--tls-cert-file="+filepath.Join(c.Dir, "serving.crt"),
		"--tls-private-key-file="+filepath.Join(c.Dir, "serving.key"))
	url := "https://" + strings.TrimPrefix(p.URL, "http://")
	cfg := &rest.Config{Host: url, TLSClientConfig: rest.TLSClientConfig{CAFile: c.CAFile}}
	ctx := ctxT(t, time.Minute)
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(url + "/api/v1/namespaces/default/configmaps")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Fatalf("list over TLS: %d %s, want 200 over HTTP/2", resp.StatusCode, resp.Proto)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "tls"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	select {
	case ev := <-w.ResultChan(): // the initial ADDED for "tls": the watch streams
		if cm, ok := ev.Object.(*corev1.ConfigMap); ev.Type != watch.Added || !ok || cm.Name != "tls" {
			t.Fatalf("first event %s %v", ev.Type, ev.Object)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event over the TLS watch")
	}
	p.requireProxied(1, map[string]string{"verb": "list", "resource": "configmaps", "code": "200"})
}
