package node_test

// kubectl exec, attach, port-forward and cp to a pod a real kubelet and containerd run, through
// the node-local watchsan from deploy/.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/clustertest"
	"github.com/watchsan/watchsan/test/cluster/node"
	"github.com/watchsan/watchsan/test/cluster/node/nodetest"
)

// TestUpgradesToARealPod: the real kubectl runs exec (stdin, stdout, exit code), attach,
// port-forward and cp (both ways) against a pod of the real kubelet, directly and through the
// node-local watchsan of deploy/overlays/node-local (its image, as a static pod, the client's
// own token: --no-credentials), each over WebSocket (kubectl's default) and SPDY
// (KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false, KUBECTL_PORT_FORWARD_WEBSOCKETS=false). Through
// watchsan, every one of them is counted as an upgrade it relayed (101).
//
// The apiserver dials the kubelet at one of the node's addresses; here the node's own address
// is not loopback and nothing may connect to it (../shared/REALNODE.md), and a kubelet refuses
// a loopback --node-ip. So the node is named localhost (its Hostname address) and the
// apiserver prefers Hostname addresses: it dials localhost at the kubelet's port, verifying
// the kubelet's serving certificate (issued for localhost) with the cluster CA and presenting
// the admin client certificate, which the kubelet's x509 authentication accepts.
func TestUpgradesToARealPod(t *testing.T) {
	nodetest.Skip(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := clustertest.Start(t, cluster.Options{APIServerFlags: []string{"--kubelet-preferred-address-types=Hostname,InternalIP,ExternalIP"}})
	n := nodetest.Start(t, c, node.Options{Name: "localhost"})
	cs, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	box, err := node.ToolboxImage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wsTar, wsRef, err := node.WatchsanImage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tarball := range []string{box, wsTar} {
		if err := n.Import(ctx, tarball); err != nil {
			t.Fatal(err)
		}
	}
	ports, err := node.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	listen, admin, echoPort := ports[0], ports[1], ports[2]

	// The node-local watchsan, as TestNodeLocalKubelet runs it.
	manifest, ns := renderNodeLocal(t, c, n, nodeLocalPatch{image: wsRef, listenPort: listen, adminPort: admin, apiserverPort: c.APIServers[0].Port})
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.StaticPodDir, "watchsan-node-local.yaml"), manifest, 0o644); err != nil {
		t.Fatal(err)
	}
	waitPodReadyIn(ctx, t, cs, nodeLocalNS, "watchsan-node-local-"+n.Name)
	adminURL := "http://127.0.0.1:" + strconv.Itoa(admin)

	// The pod: the toolbox, as root (it links its commands into /bin at start).
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "box", Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:                      n.Name, // no scheduler runs
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			AutomountServiceAccountToken:  ptr.To(false),
			Containers: []corev1.Container{{
				Name:            "main",
				Image:           node.ToolboxImageRef,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"/bin/box", "serve", strconv.Itoa(echoPort)},
				SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](0)},
				ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
					TCPSocket: &corev1.TCPSocketAction{Host: "127.0.0.1", Port: intstr.FromInt32(int32(echoPort))}}},
			}},
		},
	}
	// No controller manager runs to make the namespace's service account.
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodReadyIn(ctx, t, cs, "default", "box")

	dir := t.TempDir()
	direct := filepath.Join(dir, "direct.kubeconfig")
	if err := c.WriteKubeconfig(direct, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	viaWatchsan := filepath.Join(dir, "node-local.kubeconfig")
	if err := c.WriteKubeconfig(viaWatchsan, "https://127.0.0.1:"+strconv.Itoa(listen), c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	upgrades := func(resource string) float64 {
		return metricWith(ctx, t, adminURL, "watchsan_requests_total", `resource="`+resource+`"`, `code="101"`)
	}
	requests := func(resource string) float64 {
		return metricWith(ctx, t, adminURL, "watchsan_requests_total", `resource="`+resource+`"`)
	}
	for _, route := range []struct {
		name, kubeconfig string
		watchsan         bool
	}{{"direct", direct, false}, {"node-local", viaWatchsan, true}} {
		for _, ws := range []bool{true, false} {
			proto := map[bool]string{true: "websocket", false: "spdy"}[ws]
			t.Run(route.name+"/"+proto, func(t *testing.T) {
				r := &realUpgrade{t: t, c: c, kubeconfig: route.kubeconfig, name: route.name + "-" + proto,
					env: []string{"KUBECTL_REMOTE_COMMAND_WEBSOCKETS=" + strconv.FormatBool(ws),
						"KUBECTL_PORT_FORWARD_WEBSOCKETS=" + strconv.FormatBool(ws)}}
				execs, attaches, forwards := upgrades("pods/exec"), upgrades("pods/attach"), upgrades("pods/portforward")
				before := requests("pods/exec") + requests("pods/attach") + requests("pods/portforward")
				start := time.Now()
				r.exec()
				r.exitCode()
				r.attach()
				r.portForward(echoPort)
				r.cp()
				t.Logf("upgrades: %s: exec, exit code, attach, port-forward, cp both ways in %.1fs", r.name, time.Since(start).Seconds())
				e, a, f := upgrades("pods/exec")-execs, upgrades("pods/attach")-attaches, upgrades("pods/portforward")-forwards
				// exec cat, exec exit, cp to the pod (test -d, tar -x), cp from it (tar c).
				want := map[bool][3]float64{true: {5, 1, 1}, false: {0, 0, 0}}[route.watchsan]
				if route.watchsan {
					// An upgrade is counted when watchsan's side of it ends, which can be after
					// kubectl has exited.
					if err := nodetest.Poll(ctx, func() error {
						if e, a, f = upgrades("pods/exec")-execs, upgrades("pods/attach")-attaches, upgrades("pods/portforward")-forwards; e < 5 || a < 1 || f < 1 {
							return errNotYet
						}
						return nil
					}); err != nil {
						t.Fatalf("watchsan counted %v exec, %v attach, %v portforward upgrades (101), want 5, 1, 1", e, a, f)
					}
				}
				if got := [3]float64{e, a, f}; got != want {
					t.Fatalf("watchsan relayed %v exec, %v attach, %v portforward upgrades (101), want %v", e, a, f, want)
				}
				// Nothing else was asked: kubectl falls back from WebSocket to SPDY after a
				// failed upgrade, which would show here as a request that got no 101.
				if all := requests("pods/exec") + requests("pods/attach") + requests("pods/portforward") - before; all != e+a+f {
					t.Fatalf("watchsan answered %v streaming requests, %v of them with 101: a fallback or a failure", all, e+a+f)
				}
			})
		}
	}
}

// realUpgrade runs kubectl's streaming commands against pod default/box over one route and
// protocol.
type realUpgrade struct {
	t          *testing.T
	c          *cluster.Cluster
	kubeconfig string
	env        []string
	name       string // unique per run: file names, payloads
}

func (r *realUpgrade) kubectl(stdin io.Reader, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := r.c.KubectlCmd(ctx, r.kubeconfig, args...)
	cmd.Env = append(cmd.Env, r.env...)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// exec: stdin reaches a process in the container and its stdout comes back.
func (r *realUpgrade) exec() {
	r.t.Helper()
	in := "hello from " + r.name + "\n" + strings.Repeat("x", 64<<10) + "\n"
	stdout, stderr, err := r.kubectl(strings.NewReader(in), "exec", "-i", "box", "--", "cat")
	if err != nil || stdout != in {
		r.t.Fatalf("kubectl exec -i box -- cat: %v, %d bytes back of %d\n%s", err, len(stdout), len(in), stderr)
	}
}

// exitCode: the command's exit code is kubectl's.
func (r *realUpgrade) exitCode() {
	r.t.Helper()
	_, stderr, err := r.kubectl(nil, "exec", "box", "--", "exit", "3")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		r.t.Fatalf("kubectl exec box -- exit 3: %v, want exit status 3\n%s", err, stderr)
	}
}

var tickRE = regexp.MustCompile(`^tick \d+$`)

// attach: the main process's stdout (a tick every 200 ms) comes to kubectl attach.
func (r *realUpgrade) attach() {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := r.c.KubectlCmd(ctx, r.kubeconfig, "attach", "box", "-c", "main")
	cmd.Env = append(cmd.Env, r.env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		r.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	ticks := make(chan int, 1)
	go func() {
		n := 0
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if tickRE.MatchString(sc.Text()) {
				if n++; n == 3 {
					ticks <- n
				}
			}
		}
	}()
	select {
	case <-ticks:
	case <-ctx.Done():
		r.t.Fatalf("kubectl attach box showed no 3 ticks of the main process: %s", stderr.String())
	}
}

var forwardingRE = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) ->`)

// portForward: bytes written to kubectl's local port come back from the pod's echo port, on
// two connections in turn.
func (r *realUpgrade) portForward(podPort int) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := r.c.KubectlCmd(ctx, r.kubeconfig, "port-forward", "pod/box", ":"+strconv.Itoa(podPort))
	cmd.Env = append(cmd.Env, r.env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		r.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	local := make(chan string, 1)
	go func() {
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
		r.t.Fatalf("kubectl port-forward never listened: %s", stderr.String())
	}
	for i := range 2 {
		conn, err := net.DialTimeout("tcp", "127.0.0.1:"+port, 5*time.Second)
		if err != nil {
			r.t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		msg := fmt.Sprintf("%s connection %d %s\n", r.name, i, strings.Repeat("y", 32<<10))
		if _, err := io.WriteString(conn, msg); err != nil {
			r.t.Fatal(err)
		}
		back := make([]byte, len(msg))
		if _, err := io.ReadFull(conn, back); err != nil || string(back) != msg {
			r.t.Fatalf("port-forward connection %d: %v\n%s", i, err, stderr.String())
		}
		conn.Close()
	}
}

// cp: a local file copied into the container and back out is the same file.
func (r *realUpgrade) cp() {
	r.t.Helper()
	local := r.t.TempDir()
	src := filepath.Join(local, "in.txt")
	content := "to the pod and back via " + r.name + "\n" + strings.Repeat("z", 100<<10)
	if err := os.WriteFile(src, []byte(content), 0o644); err != nil {
		r.t.Fatal(err)
	}
	inPod := "/tmp/" + r.name + ".txt"
	if _, stderr, err := r.kubectl(nil, "cp", src, "box:"+inPod); err != nil {
		r.t.Fatalf("kubectl cp to the pod: %v\n%s", err, stderr)
	}
	back := filepath.Join(local, "back.txt")
	if _, stderr, err := r.kubectl(nil, "cp", "box:"+inPod, back); err != nil {
		r.t.Fatalf("kubectl cp from the pod: %v\n%s", err, stderr)
	}
	got, err := os.ReadFile(back)
	if err != nil || string(got) != content {
		r.t.Fatalf("copied to the pod and back: %v, %d bytes of %d, equal %v", err, len(got), len(content), string(got) == content)
	}
}

// metricWith sums the series of name on watchsan's /metrics whose labels contain each of
// labels (`key="value"`).
func metricWith(ctx context.Context, t *testing.T, adminURL, name string, labels ...string) float64 {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, adminURL+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		t.Fatalf("watchsan /metrics: %v", err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
next:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue next
			}
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		sum += v
	}
	return sum
}
