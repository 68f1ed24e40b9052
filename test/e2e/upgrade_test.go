package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/kubelet"
)

// TestUpgradeKubectlThroughRealAPIServer: every upgrade request, WebSocket
// and SPDY, reaches the apiserver over HTTP/1.1 and works as it does directly. The real kubectl
// runs exec (stdin, stdout, exit code), attach, port-forward (bytes both ways through a local
// port) and cp (both directions) against a real apiserver, which proxies them to the harness's kubelet
// (test/cluster/kubelet): directly, through watchsan lending its kubeconfig identity on loopback,
// and through watchsan over TLS with --no-credentials and the client's own token; each with
// WebSocket (kubectl's default) and with SPDY (KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false,
// KUBECTL_PORT_FORWARD_WEBSOCKETS=false). The kubelet records the upgrade it received, so a
// run that claims one protocol and fell back to the other fails.
//
// HTTP/1.1 to the apiserver: watchsan reaches the apiserver through a recording TLS hop that
// offers HTTP/2 (protoHop); every upgrade arrives there over HTTP/1.1, while watchsan's other
// requests use HTTP/2. Besides, the apiserver answers pods/exec, attach and portforward only
// with 101 Switching Protocols (its handler requires an upgrade), which HTTP/2 cannot carry.
// The kubelet sees HTTP/1.1 too.
func TestUpgradeKubectlThroughRealAPIServer(t *testing.T) {
	c := newCluster(t, cluster.Options{})
	ctx := ctxT(t, 5*time.Minute)
	k, err := kubelet.Start(ctx, c, "fake-node")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	if err := k.CreatePod(ctx, "default", "box"); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(k.Root, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	echoPort := startEchoServer(t)

	dir := t.TempDir()
	direct := filepath.Join(dir, "direct.kubeconfig")
	if err := c.WriteKubeconfig(direct, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	hop := startProtoHop(t, c)
	viaHop := filepath.Join(dir, "hop.kubeconfig")
	if err := c.WriteKubeconfig(viaHop, hop.URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	// Lending: a controller that execs sets --reject-paths without the exec entry (docs/security.md).
	lent := startProxy(t, "--kubeconfig="+viaHop, "--reject-paths=")
	lentKC := filepath.Join(dir, "lent.kubeconfig")
	if err := c.WriteKubeconfig(lentKC, lent.URL, "", ""); err != nil {
		t.Fatal(err)
	}
	// A frontend: TLS (HTTP/2 offered to clients), no identity of its own.
	own := startProxy(t, "--upstream="+hop.URL, "--upstream-ca-file="+c.CAFile, "--no-credentials",
		"--tls-cert-file="+c.ServingCertFile, "--tls-private-key-file="+c.ServingKeyFile)
	ownKC := filepath.Join(dir, "own.kubeconfig")
	if err := c.WriteKubeconfig(ownKC, "https://"+strings.TrimPrefix(own.URL, "http://"), c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}

	routes := []struct {
		name, kubeconfig string
		p                *proxy
	}{{"direct", direct, nil}, {"lent", lentKC, lent}, {"own-credentials", ownKC, own}}
	for _, r := range routes {
		for _, ws := range []bool{true, false} {
			proto := map[bool]string{true: "websocket", false: "spdy"}[ws]
			t.Run(r.name+"/"+proto, func(t *testing.T) {
				u := &upgradeRun{t: t, c: c, k: k, kubeconfig: r.kubeconfig, websocket: ws, name: r.name + "-" + proto}
				u.env = []string{"KUBECTL_REMOTE_COMMAND_WEBSOCKETS=" + strconv.FormatBool(ws),
					"KUBECTL_PORT_FORWARD_WEBSOCKETS=" + strconv.FormatBool(ws)}
				var execs, forwards, attaches float64
				if r.p != nil {
					execs, forwards = r.p.upgrades()
					attaches = r.p.Metric("watchsan_requests_total", map[string]string{"resource": "pods/attach", "code": "101"})
				}
				k.Streams() // forget earlier ones
				hop.take()
				u.exec()
				u.exitCode()
				u.attach()
				u.portForward(echoPort)
				u.cpToPod()
				u.cpFromPod()
				if r.p != nil {
					// exec cat, exec exit, cp to the pod (test -d, tar -x), cp from it (tar c). An
					// upgrade is counted when watchsan's side of it ends, which can be after kubectl
					// has exited: the count is waited for (up to 10s), then must be exact.
					var e, f float64
					testutil.Until(10*time.Second, func() bool {
						e, f = r.p.upgrades()
						return e-execs >= 5 && f-forwards >= 1
					})
					if e-execs != 5 || f-forwards != 1 {
						t.Fatalf("watchsan relayed %v exec and %v portforward upgrades (101), want 5 and 1", e-execs, f-forwards)
					}
					if a := r.p.Metric("watchsan_requests_total", map[string]string{"resource": "pods/attach", "code": "101"}) - attaches; a != 1 {
						t.Fatalf("watchsan relayed %v attach upgrades (101), want 1", a)
					}
					hop.requireProtocols(t, 7)
				}
			})
		}
	}

	// The lending guard's default --reject-paths refuses exec and attach with watchsan's
	// identity with a 403 whose message, shown by kubectl, names the flag that would allow it;
	// kubectl's WebSocket attempt falls back to SPDY, refused too. Port-forward stays allowed.
	t.Run("lent-default-guard", func(t *testing.T) {
		guarded := startProxy(t, "--kubeconfig="+direct)
		kc := filepath.Join(dir, "guarded.kubeconfig")
		if err := c.WriteKubeconfig(kc, guarded.URL, "", ""); err != nil {
			t.Fatal(err)
		}
		for _, ws := range []bool{true, false} {
			u := &upgradeRun{t: t, c: c, k: k, kubeconfig: kc, websocket: ws, name: "guarded",
				env: []string{"KUBECTL_REMOTE_COMMAND_WEBSOCKETS=" + strconv.FormatBool(ws),
					"KUBECTL_PORT_FORWARD_WEBSOCKETS=" + strconv.FormatBool(ws)}}
			for _, sub := range []struct {
				resource string
				args     []string
			}{
				{"pods/exec", []string{"exec", "box", "--", "echo", "hi"}},
				{"pods/attach", []string{"attach", "-i", "box"}},
			} {
				k.Streams()
				refused := guarded.Metric("watchsan_requests_total", map[string]string{"resource": sub.resource, "code": "403"})
				_, stderr, err := u.kubectl(strings.NewReader("hi\n"), sub.args...)
				if err == nil || !strings.Contains(stderr, "is refused to requests that would get watchsan's identity (--reject-paths") {
					t.Fatalf("kubectl %s with the lent identity under the default guard (websocket %v): %v\n%s", sub.args[0], ws, err, stderr)
				}
				if s := k.Streams(); len(s) != 0 {
					t.Fatalf("a refused %s reached the kubelet: %+v", sub.args[0], s)
				}
				attempts := map[bool]float64{true: 2, false: 1}[ws] // WebSocket, then the SPDY fallback
				if n := guarded.Metric("watchsan_requests_total", map[string]string{"resource": sub.resource, "code": "403"}) - refused; n != attempts {
					t.Fatalf("watchsan answered %v %s upgrades with 403, want %v", n, sub.resource, attempts)
				}
			}
			u.portForward(echoPort)
		}
		if n := guarded.Metric("watchsan_requests_refused_total", nil); n != 6 {
			t.Fatalf("watchsan_requests_refused_total = %v, want the 6 refused exec and attach upgrades", n)
		}
		if _, f := guarded.upgrades(); f != 2 {
			t.Fatalf("watchsan relayed %v portforward upgrades under the default guard, want 2", f)
		}
	})
}

// upgrades returns how many exec and portforward upgrades watchsan relayed (code 101).
func (p *proxy) upgrades() (exec, portforward float64) {
	return p.Metric("watchsan_requests_total", map[string]string{"resource": "pods/exec", "code": "101"}),
		p.Metric("watchsan_requests_total", map[string]string{"resource": "pods/portforward", "code": "101"})
}

// upgradeRun runs kubectl's streaming commands against pod default/box over one route and
// protocol.
type upgradeRun struct {
	t          *testing.T
	c          *cluster.Cluster
	k          *kubelet.Kubelet
	kubeconfig string
	websocket  bool
	env        []string
	name       string // unique per run: file names, payloads
}

// kubectl runs kubectl with the run's environment and stdin; stdout and stderr are returned.
func (u *upgradeRun) kubectl(stdin io.Reader, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := u.c.KubectlCmd(ctx, u.kubeconfig, args...)
	cmd.Env = append(cmd.Env, u.env...)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// requireStreams fails unless the kubelet received exactly the streams of kind with commands
// (none for attach and portforward), each over HTTP/1.1 with the run's protocol, from the apiserver's
// client certificate.
func (u *upgradeRun) requireStreams(kind string, commands ...[]string) {
	u.t.Helper()
	got := u.k.Streams()
	n := max(len(commands), 1)
	if len(got) != n {
		u.t.Fatalf("the kubelet received %d %s streams, want %d: %+v", len(got), kind, n, got)
	}
	want := map[string]map[bool]string{ // a subprotocol the client must have offered
		"exec":        {true: "v5.channel.k8s.io", false: "v4.channel.k8s.io"},
		"attach":      {true: "v5.channel.k8s.io", false: "v4.channel.k8s.io"},
		"portforward": {true: "SPDY/3.1+portforward.k8s.io", false: "portforward.k8s.io"},
	}[kind][u.websocket]
	for i, s := range got {
		if s.Kind != kind || s.Proto != "HTTP/1.1" || s.WebSocket() != u.websocket ||
			!slices.Contains(s.Protocols, want) || s.Client != cluster.AdminUser+"-cert" {
			u.t.Fatalf("stream %d reached the kubelet as %+v; want %s over HTTP/1.1, websocket %v, offering %s, from the apiserver",
				i, s, kind, u.websocket, want)
		}
		if kind == "exec" && !slices.Equal(s.Command, commands[i]) {
			u.t.Fatalf("exec %d ran %q, want %q", i, s.Command, commands[i])
		}
	}
}

// exec: stdin reaches the container and its stdout comes back.
func (u *upgradeRun) exec() {
	u.t.Helper()
	in := "hello from " + u.name + "\n" + strings.Repeat("x", 64<<10) + "\n"
	stdout, stderr, err := u.kubectl(strings.NewReader(in), "exec", "-i", "box", "--", "cat")
	if err != nil || stdout != in {
		u.t.Fatalf("kubectl exec -i box -- cat: %v, %d bytes back of %d\n%s", err, len(stdout), len(in), stderr)
	}
	u.requireStreams("exec", []string{"cat"})
}

// attach: stdin reaches the container's main process (which echoes it) and its stdout comes
// back.
func (u *upgradeRun) attach() {
	u.t.Helper()
	in := "attached via " + u.name + "\n"
	stdout, stderr, err := u.kubectl(strings.NewReader(in), "attach", "-i", "box")
	if err != nil || stdout != in {
		u.t.Fatalf("kubectl attach -i box: %v, %q back, want %q\n%s", err, stdout, in, stderr)
	}
	u.requireStreams("attach")
}

// exitCode: the command's exit code is kubectl's.
func (u *upgradeRun) exitCode() {
	u.t.Helper()
	_, stderr, err := u.kubectl(nil, "exec", "box", "--", "exit", "3")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		u.t.Fatalf("kubectl exec box -- exit 3: %v, want exit status 3\n%s", err, stderr)
	}
	u.requireStreams("exec", []string{"exit", "3"})
}

var forwardingRE = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) ->`)

// portForward: bytes written to kubectl's local port come back from the echo server behind
// the pod's port, on two connections in turn.
func (u *upgradeRun) portForward(podPort int) {
	u.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := u.c.KubectlCmd(ctx, u.kubeconfig, "port-forward", "pod/box", ":"+strconv.Itoa(podPort))
	cmd.Env = append(cmd.Env, u.env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		u.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		u.t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	local := make(chan string, 1)
	go func() { // ends when kubectl exits and its stdout closes
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := forwardingRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case local <- m[1]:
				default:
				}
			}
		}
	}()
	var port string
	select {
	case port = <-local:
	case <-ctx.Done():
		u.t.Fatalf("kubectl port-forward never listened: %s", stderr.String())
	}
	for i := range 2 {
		conn, err := net.DialTimeout("tcp", "127.0.0.1:"+port, 5*time.Second)
		if err != nil {
			u.t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		msg := fmt.Sprintf("%s connection %d %s\n", u.name, i, strings.Repeat("y", 32<<10))
		if _, err := io.WriteString(conn, msg); err != nil {
			u.t.Fatal(err)
		}
		back := make([]byte, len(msg))
		if _, err := io.ReadFull(conn, back); err != nil || string(back) != msg {
			u.t.Fatalf("port-forward connection %d: %v, %d bytes matched\n%s", i, err, commonPrefix(back, msg), stderr.String())
		}
		conn.Close()
	}
	u.requireStreams("portforward")
}

func commonPrefix(b []byte, s string) int {
	n := 0
	for n < len(b) && n < len(s) && b[n] == s[n] {
		n++
	}
	return n
}

// cpToPod: kubectl cp tars a local file into the container.
func (u *upgradeRun) cpToPod() {
	u.t.Helper()
	src := filepath.Join(u.t.TempDir(), "in.txt")
	content := "to the pod via " + u.name + "\n" + strings.Repeat("z", 100<<10)
	if err := os.WriteFile(src, []byte(content), 0o644); err != nil {
		u.t.Fatal(err)
	}
	dst := "/data/" + u.name + "-in.txt"
	if _, stderr, err := u.kubectl(nil, "cp", src, "box:"+dst); err != nil {
		u.t.Fatalf("kubectl cp to the pod: %v\n%s", err, stderr)
	}
	got, err := os.ReadFile(filepath.Join(u.k.Root, filepath.FromSlash(dst)))
	if err != nil || string(got) != content {
		u.t.Fatalf("the container's %s: %v, %d bytes matched of %d", dst, err, commonPrefix(got, content), len(content))
	}
	u.requireStreams("exec", []string{"test", "-d", dst}, []string{"tar", "-xmf", "-", "-C", "/data"})
}

// cpFromPod: kubectl cp untars a container file locally.
func (u *upgradeRun) cpFromPod() {
	u.t.Helper()
	src := "/data/" + u.name + "-out.txt"
	content := "from the pod via " + u.name + "\n" + strings.Repeat("w", 100<<10)
	if err := os.WriteFile(filepath.Join(u.k.Root, filepath.FromSlash(src)), []byte(content), 0o644); err != nil {
		u.t.Fatal(err)
	}
	dst := filepath.Join(u.t.TempDir(), "out.txt")
	if _, stderr, err := u.kubectl(nil, "cp", "box:"+src, dst); err != nil {
		u.t.Fatalf("kubectl cp from the pod: %v\n%s", err, stderr)
	}
	got, err := os.ReadFile(dst)
	if err != nil || string(got) != content {
		u.t.Fatalf("copied %s: %v, %d bytes matched of %d", src, err, commonPrefix(got, content), len(content))
	}
	u.requireStreams("exec", []string{"tar", "cf", "-", src})
}

// startEchoServer listens on a loopback port and echoes every connection; closed in Cleanup.
// It returns the port.
func startEchoServer(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return // closed
			}
			go func() { defer conn.Close(); _, _ = io.Copy(conn, conn) }() // ends when the client closes
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// protoHop is a TLS hop in front of apiserver 0 that offers HTTP/2 and HTTP/1.1 and records the
// HTTP version each request arrived with: what watchsan sends its upstream. It passes
// everything on (upgrades too) with httputil.ReverseProxy, over HTTP/1.1.
type protoHop struct {
	*httptest.Server
	mu   sync.Mutex
	seen []hopRequest
}

type hopRequest struct{ method, path, proto, upgrade string }

func startProtoHop(t *testing.T, c *cluster.Cluster) *protoHop {
	t.Helper()
	target, err := url.Parse(c.APIServers[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(c.ServingCertFile, c.ServingKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(c.CAData)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, Protocols: new(http.Protocols)}
	tr.Protocols.SetHTTP1(true)
	t.Cleanup(tr.CloseIdleConnections)
	rp := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target); pr.Out.Host = "" },
		Transport:     tr,
		FlushInterval: -1,
	}
	h := &protoHop{}
	h.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.seen = append(h.seen, hopRequest{r.Method, r.URL.Path, r.Proto, r.Header.Get("Upgrade")})
		h.mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	h.EnableHTTP2 = true
	h.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	h.StartTLS()
	t.Cleanup(h.Close)
	return h
}

func (h *protoHop) take() []hopRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.seen
	h.seen = nil
	return s
}

// requireProtocols fails unless exactly upgrades upgrade requests came through since the last
// take, all over HTTP/1.1, and every other pods request (kubectl's GET of the pod) over HTTP/2.
func (h *protoHop) requireProtocols(t *testing.T, upgrades int) {
	t.Helper()
	n, plain := 0, 0
	for _, r := range h.take() {
		switch {
		case r.upgrade != "":
			n++
			if r.proto != "HTTP/1.1" {
				t.Fatalf("the upgrade %s %s (%s) reached the apiserver over %s", r.method, r.path, r.upgrade, r.proto)
			}
		case strings.Contains(r.path, "/pods/"):
			plain++
			if r.proto != "HTTP/2.0" {
				t.Fatalf("%s %s reached the apiserver over %s; the hop must offer HTTP/2 for this test to mean anything", r.method, r.path, r.proto)
			}
		}
	}
	if n != upgrades || plain == 0 {
		t.Fatalf("%d upgrades and %d other pods requests came through the hop, want %d and some", n, plain, upgrades)
	}
}
