// Package kubelet is a stand-in kubelet for the test harness (test/cluster): see Kubelet. It is
// apart from package cluster so that programs using the harness (watchsan-demo --real) do not
// link it and its streaming libraries.
package kubelet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	upgradeproxy "k8s.io/apimachinery/pkg/util/proxy"
	remotecommandconsts "k8s.io/apimachinery/pkg/util/remotecommand"
	translator "k8s.io/apiserver/pkg/util/proxy"
	"k8s.io/client-go/kubernetes"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	remotecommandserver "k8s.io/cri-streaming/pkg/streaming/remotecommand"
	"k8s.io/streaming/pkg/httpstream/wsstream"
	utilexec "k8s.io/utils/exec"

	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/kubecp"
)

// Container is the name of the one container of every pod made by Kubelet.CreatePod.
const Container = "main"

// extendWebSocketsToKubelet is the node feature (status.declaredFeatures) that tells a 1.37
// apiserver to pass WebSocket exec, attach and port-forward through to the kubelet instead of
// translating them to SPDY itself (pkg/registry/core/pod/rest/subresources.go).
const extendWebSocketsToKubelet = "ExtendWebSocketsToKubelet"

// Kubelet stands in for a node's kubelet, so that exec, attach, port-forward and cp can run end
// to end through a real apiserver (no real kubelet runs here: docs/design.md section 6). It
// serves the kubelet's streaming endpoints the way kubelet 1.37 does (pkg/kubelet/server): an
// HTTPS server on 127.0.0.1 that passes SPDY upgrades to a container-runtime streaming server
// (k8s.io/cri-streaming, plain HTTP on loopback), translates WebSocket v5 exec/attach to SPDY
// and unwraps SPDY tunnelled in WebSocket for port-forward (k8s.io/apiserver's translators). It
// records each streaming request, so a test can tell which protocol really arrived.
//
// Its "containers" run a few commands in-process over a shared file system (Root): echo, cat
// (stdin to stdout), exit N, test -d PATH, and the tar that kubectl cp runs (tar cf - PATH;
// tar -xmf - -C DIR). Port-forward to pod port P connects to 127.0.0.1:P, as a host-network
// pod's would. Attach echoes stdin to stdout.
//
// Its exported fields are set by Start and not changed after; do not modify them.
type Kubelet struct {
	// NodeName is the Node registered for it.
	NodeName string
	// URL is https://127.0.0.1:Port. It serves with the cluster's serving certificate and
	// requires a client certificate signed by the cluster CA (the apiservers present the admin
	// one: --kubelet-client-certificate).
	URL string
	// Root is the containers' file system, in the cluster's Dir: a path in a command is taken
	// under it.
	Root string

	cs         kubernetes.Interface
	srv        *http.Server // the kubelet
	runtime    *http.Server // the runtime's streaming server, SPDY only
	runtimeURL *url.URL
	conns      connSet
	closed     chan struct{} // closed by Close: in-process commands end
	closeOnce  sync.Once

	mu      sync.Mutex
	streams []Stream
}

// Stream is one streaming request the kubelet received, as it arrived.
type Stream struct {
	// Kind is "exec", "attach" or "portforward".
	Kind string
	// Namespace, Pod and Container are from the path (Container is empty for portforward).
	Namespace, Pod, Container string
	// Command is the exec command (nil for attach and portforward).
	Command []string
	// Proto is the request's HTTP version, e.g. "HTTP/1.1".
	Proto string
	// Upgrade is the Upgrade header: "SPDY/3.1" or "websocket"; empty if none was asked for.
	Upgrade string
	// Protocols are the subprotocols offered, in order: X-Stream-Protocol-Version for SPDY,
	// Sec-WebSocket-Protocol for WebSocket; nil if none.
	Protocols []string
	// Client is the common name of the client certificate the apiserver presented (the
	// kubelet requires one, so it is never empty).
	Client string
}

// WebSocket reports whether the request asked for a WebSocket upgrade.
func (s Stream) WebSocket() bool { return strings.EqualFold(s.Upgrade, "websocket") }

// Start starts a Kubelet for cluster c and registers the Node nodeName for it (InternalIP
// 127.0.0.1, its port as the kubelet endpoint, Ready, declaring ExtendWebSocketsToKubelet as
// kubelet 1.37 does). Its files live in c.Dir. Close it before or after c.Stop.
func Start(ctx context.Context, c *cluster.Cluster, nodeName string) (_ *Kubelet, err error) {
	cs, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		return nil, fmt.Errorf("kubelet: admin client: %w", err)
	}
	root := filepath.Join(c.Dir, "kubelet-"+nodeName)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("kubelet: root: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(c.ServingCertFile, c.ServingKeyFile)
	if err != nil {
		return nil, fmt.Errorf("kubelet: serving certificate: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(c.CAData)

	k := &Kubelet{NodeName: nodeName, Root: root, cs: cs, closed: make(chan struct{})}
	defer func() {
		if err != nil {
			k.Close()
		}
	}()
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("kubelet: runtime listener: %w", err)
	}
	k.runtimeURL = &url.URL{Scheme: "http", Host: rl.Addr().String()}
	k.runtime = k.conns.server(k.runtimeMux())
	go func() { _ = k.runtime.Serve(rl) }()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("kubelet: listener: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	k.URL = "https://" + l.Addr().String()
	k.srv = k.conns.server(k.kubeletMux())
	k.srv.TLSConfig = &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    roots,
		MinVersion:   tls.VersionTLS12,
	}
	go func() { _ = k.srv.ServeTLS(l, "", "") }()

	if err := poll(ctx, func(ctx context.Context) error {
		_, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{})
		return ignoreExists(err)
	}); err != nil {
		return nil, fmt.Errorf("kubelet: node %s: %w", nodeName, err)
	}
	if err := poll(ctx, func(ctx context.Context) error {
		node, err := cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}
		node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(port)
		node.Status.DeclaredFeatures = []string{extendWebSocketsToKubelet}
		node.Status.Conditions = []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
		}}
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	}); err != nil {
		return nil, fmt.Errorf("kubelet: node %s status: %w", nodeName, err)
	}
	return k, nil
}

// CreatePod creates a pod on the kubelet's node with one container, Container, and
// marks it Running. The namespace's default ServiceAccount is created if missing (no
// controller-manager runs to do it, and admission wants it).
func (k *Kubelet) CreatePod(ctx context.Context, namespace, name string) error {
	if err := poll(ctx, func(ctx context.Context) error {
		_, err := k.cs.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{
			ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
		return ignoreExists(err)
	}); err != nil {
		return fmt.Errorf("pod %s/%s: service account: %w", namespace, name, err)
	}
	automount := false
	if err := poll(ctx, func(ctx context.Context) error {
		_, err := k.cs.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{
				NodeName:                     k.NodeName,
				HostNetwork:                  true, // port-forward reaches 127.0.0.1
				AutomountServiceAccountToken: &automount,
				Containers:                   []corev1.Container{{Name: Container, Image: "watchsan.test/fake"}},
			},
		}, metav1.CreateOptions{})
		return ignoreExists(err)
	}); err != nil {
		return fmt.Errorf("pod %s/%s: %w", namespace, name, err)
	}
	if err := poll(ctx, func(ctx context.Context) error {
		pod, err := k.cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.HostIP, pod.Status.PodIP = "127.0.0.1", "127.0.0.1"
		_, err = k.cs.CoreV1().Pods(namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("pod %s/%s status: %w", namespace, name, err)
	}
	return nil
}

// Streams returns the streaming requests received since the last call, and forgets them.
func (k *Kubelet) Streams() []Stream {
	k.mu.Lock()
	defer k.mu.Unlock()
	s := k.streams
	k.streams = nil
	return s
}

// Close stops both servers and closes every connection, upgraded ones too, which ends every
// stream. It is idempotent and safe to call from any goroutine.
func (k *Kubelet) Close() {
	k.closeOnce.Do(func() {
		close(k.closed)
		for _, s := range []*http.Server{k.srv, k.runtime} {
			if s != nil {
				_ = s.Close()
			}
		}
		k.conns.closeAll()
	})
}

func (k *Kubelet) record(kind string, r *http.Request) {
	s := Stream{
		Kind:      kind,
		Namespace: r.PathValue("ns"),
		Pod:       r.PathValue("pod"),
		Container: r.PathValue("container"),
		Proto:     r.Proto,
		Upgrade:   r.Header.Get("Upgrade"),
	}
	if kind == "exec" {
		s.Command = r.URL.Query()["command"]
	}
	for _, h := range []string{"X-Stream-Protocol-Version", "Sec-Websocket-Protocol"} {
		for _, v := range r.Header.Values(h) {
			for _, p := range strings.Split(v, ",") {
				s.Protocols = append(s.Protocols, strings.TrimSpace(p))
			}
		}
	}
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		s.Client = r.TLS.PeerCertificates[0].Subject.CommonName
	}
	k.mu.Lock()
	k.streams = append(k.streams, s)
	k.mu.Unlock()
}

// kubeletMux serves what the apiserver proxies pods/exec, pods/attach and pods/portforward to,
// composed as kubelet 1.37's getExec, getAttach and getPortForward are.
func (k *Kubelet) kubeletMux() *http.ServeMux {
	mux := http.NewServeMux()
	remote := func(kind string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			k.record(kind, r)
			opts, err := remotecommandserver.NewOptions(r)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			loc := k.runtimeLocation(r)
			var h http.Handler = upgradeproxy.NewUpgradeAwareHandler(loc, nil, false, true, responder{})
			if wsstream.IsWebSocketRequestWithStreamCloseProtocol(r) {
				h = translator.NewStreamTranslatorHandler(loc, nil, 0, translator.Options{
					Stdin: opts.Stdin, Stdout: opts.Stdout, Stderr: opts.Stderr, Tty: opts.TTY})
			}
			h.ServeHTTP(w, r)
		}
	}
	mux.HandleFunc("/exec/{ns}/{pod}/{container}", remote("exec"))
	mux.HandleFunc("/attach/{ns}/{pod}/{container}", remote("attach"))
	mux.HandleFunc("/portForward/{ns}/{pod}", func(w http.ResponseWriter, r *http.Request) {
		k.record("portforward", r)
		var h http.Handler = upgradeproxy.NewUpgradeAwareHandler(k.runtimeLocation(r), nil, false, true, responder{})
		if wsstream.IsWebSocketRequestWithTunnelingProtocol(r) {
			h = translator.NewTunnelingHandler(h)
		}
		h.ServeHTTP(w, r)
	})
	return mux
}

// runtimeLocation is r's path and query on the runtime's streaming server.
func (k *Kubelet) runtimeLocation(r *http.Request) *url.URL {
	u := *k.runtimeURL
	u.Path, u.RawQuery = r.URL.Path, r.URL.RawQuery
	return &u
}

type responder struct{}

func (responder) Error(w http.ResponseWriter, _ *http.Request, err error) {
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

// Timeouts of the runtime's streams, the kubelet's defaults (--streaming-connection-idle-timeout).
const (
	streamIdleTimeout     = 4 * time.Hour
	streamCreationTimeout = remotecommandconsts.DefaultStreamCreationTimeout
)

// runtimeMux is the container runtime's streaming server: SPDY (and WebSocket v4, unused) for
// exec, attach and port-forward, from k8s.io/cri-streaming.
func (k *Kubelet) runtimeMux() *http.ServeMux {
	mux := http.NewServeMux()
	rt := fakeRuntime{k: k}
	mux.HandleFunc("/exec/{ns}/{pod}/{container}", func(w http.ResponseWriter, r *http.Request) {
		opts, err := remotecommandserver.NewOptions(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		remotecommandserver.ServeExec(w, r, rt, r.PathValue("pod"), "", r.PathValue("container"),
			r.URL.Query()["command"], opts, streamIdleTimeout, streamCreationTimeout,
			remotecommandconsts.SupportedStreamingProtocols)
	})
	mux.HandleFunc("/attach/{ns}/{pod}/{container}", func(w http.ResponseWriter, r *http.Request) {
		opts, err := remotecommandserver.NewOptions(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		remotecommandserver.ServeAttach(w, r, rt, r.PathValue("pod"), "", r.PathValue("container"),
			opts, streamIdleTimeout, streamCreationTimeout, remotecommandconsts.SupportedStreamingProtocols)
	})
	mux.HandleFunc("/portForward/{ns}/{pod}", func(w http.ResponseWriter, r *http.Request) {
		opts, err := portforward.NewV4Options(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		portforward.ServePortForward(w, r, rt, r.PathValue("pod"), "", opts, streamIdleTimeout,
			streamCreationTimeout, portforward.SupportedProtocols)
	})
	return mux
}

// fakeRuntime runs the containers' commands in-process.
type fakeRuntime struct{ k *Kubelet }

// ExecInContainer runs cmd. An unknown command exits 127, as a shell's would.
func (f fakeRuntime) ExecInContainer(ctx context.Context, _, _, _ string, cmd []string, in io.Reader, out, errOut io.WriteCloser, _ bool, _ <-chan remotecommandserver.TerminalSize, _ time.Duration) error {
	if out == nil {
		out = nopWriteCloser{io.Discard}
	}
	if errOut == nil {
		errOut = nopWriteCloser{io.Discard}
	}
	if in == nil {
		in = strings.NewReader("")
	}
	exit := func(code int, format string, args ...any) error {
		msg := fmt.Sprintf(format, args...)
		if msg != "" {
			fmt.Fprintln(errOut, msg)
		}
		return utilexec.CodeExitError{Err: fmt.Errorf("exit status %d", code), Code: code}
	}
	if len(cmd) == 0 {
		return exit(127, "no command")
	}
	switch args := cmd[1:]; cmd[0] {
	case "echo":
		_, err := fmt.Fprintln(out, strings.Join(args, " "))
		return err
	case "cat":
		return f.copyUntilDone(ctx, out, in)
	case "exit":
		code := 0
		if len(args) > 0 {
			n, err := strconv.Atoi(args[0])
			if err != nil {
				return exit(2, "exit: %q: numeric argument required", args[0])
			}
			code = n
		}
		if code == 0 {
			return nil
		}
		return exit(code, "")
	case "test":
		if len(args) != 2 || args[0] != "-d" {
			return exit(2, "test: only test -d PATH")
		}
		if fi, err := os.Stat(f.path(args[1])); err != nil || !fi.IsDir() {
			return exit(1, "")
		}
		return nil
	case "tar":
		err := kubecp.Tar(f.k.Root, args, in, out)
		if e := (*kubecp.ExitError)(nil); errors.As(err, &e) {
			return exit(e.Code, "%s", e.Msg)
		}
		return err
	}
	return exit(127, "%s: command not found", cmd[0])
}

// AttachContainer echoes stdin to stdout until stdin ends.
func (f fakeRuntime) AttachContainer(ctx context.Context, _, _, _ string, in io.Reader, out, _ io.WriteCloser, _ bool, _ <-chan remotecommandserver.TerminalSize) error {
	if in == nil || out == nil {
		<-ctx.Done()
		return nil
	}
	return f.copyUntilDone(ctx, out, in)
}

// PortForward connects stream to 127.0.0.1:port.
func (f fakeRuntime) PortForward(ctx context.Context, _, _ string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
	if err != nil {
		return fmt.Errorf("port-forward to %d: %w", port, err)
	}
	defer conn.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(conn, stream); done <- struct{}{} }()
	go func() { _, _ = io.Copy(stream, conn); done <- struct{}{} }()
	select { // either direction ending ends both: the deferred closes unblock the other copy
	case <-done:
	case <-ctx.Done():
	case <-f.k.closed:
	}
	return nil
}

// copyUntilDone copies in to out until in ends, ctx ends or the kubelet closes.
func (f fakeRuntime) copyUntilDone(ctx context.Context, out io.Writer, in io.Reader) error {
	errc := make(chan error, 1)
	go func() { _, err := io.Copy(out, in); errc <- err }() // ends when the stream is closed
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-f.k.closed:
		return errors.New("kubelet closed")
	}
}

// path maps a container path to the file system under Root.
func (f fakeRuntime) path(p string) string {
	return filepath.Join(f.k.Root, filepath.FromSlash(path.Clean("/"+p)))
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// connSet tracks a server's connections, hijacked (upgraded) ones included, which
// http.Server.Close does not close.
type connSet struct {
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func (s *connSet) server(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ConnState: func(c net.Conn, st http.ConnState) {
			s.mu.Lock()
			defer s.mu.Unlock()
			switch {
			case st == http.StateNew && s.closed:
				c.Close()
			case st == http.StateNew:
				if s.conns == nil {
					s.conns = map[net.Conn]struct{}{}
				}
				s.conns[c] = struct{}{}
			case st == http.StateClosed:
				delete(s.conns, c) // a hijacked one stays until closeAll: the server no longer sees it
			}
		},
	}
}

func (s *connSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.conns = nil
}

// poll runs f every 100 ms until it succeeds or ctx ends; then it returns f's last error.
func poll(ctx context.Context, f func(context.Context) error) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		err := f(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

func ignoreExists(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
