// Package node runs a real Kubernetes node for the test harness (test/cluster): containerd v2
// and its runc shim (built by hack/cluster-bins.sh), Debian's runc, and the real kubelet
// v1.37.2, all on loopback, registered with a Cluster's apiservers. Pods must use the host
// network: no CNI plugin is installed, and every connection here goes to 127.0.0.1 (the
// node's own address is not loopback, and nothing may connect to it; docs/design.md section 6).
// Images come from hack/image (Image, WatchsanImage), the sandbox image too: no registry is
// reachable.
//
// A Node needs root on Linux with cgroups (v1 or v2). Close undoes everything: it kills the
// pods' processes, the shims, containerd and the kubelet by process id, unmounts what they
// mounted, removes the cgroups and the files, and what containerd leaves under /run/containerd.
//
// It is apart from package cluster so that programs using the harness (watchsan-demo --real) do
// not link it.
package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/test/cluster"
)

// SandboxImage is the pause image the node's containerd runs every pod's sandbox from: built
// from ./pause by Start and imported, since no registry is reachable.
const SandboxImage = "watchsan.test/pause:v1"

// DefaultStartTimeout bounds Start when its context has no deadline: the node is Ready about
// 20 s after the kubelet starts here.
const DefaultStartTimeout = 3 * time.Minute

// Options say how to start a Node.
type Options struct {
	// Name is the Node's name; "" means "watchsan-node".
	Name string
	// Server is the URL the kubelet talks to; "" means apiserver 0. CAFile verifies it ("" the
	// cluster's CA) and Token is the kubelet's bearer token ("" the cluster's admin token).
	Server, CAFile, Token string
	// Log, if set, also receives containerd's and the kubelet's output, each line prefixed.
	Log io.Writer
}

// Node is a running node. Its exported fields are set by Start; do not modify them.
type Node struct {
	// Name is the Node's name.
	Name string
	// Dir holds everything of the node: containerd's root, state and socket, the kubelet's root
	// directory, pod logs, static pod manifests, the logs of containerd and the kubelet.
	Dir string
	// StaticPodDir is the kubelet's staticPodPath: a pod manifest written here runs as a
	// static pod (the kubelet looks every second).
	StaticPodDir string
	// PodLogsDir is the kubelet's podLogsDir: <namespace>_<pod>_<uid>/<container>/<n>.log.
	PodLogsDir string
	// ContainerdSocket is containerd's gRPC socket.
	ContainerdSocket string
	// KubeletLog and ContainerdLog hold their output, appended to across restarts.
	KubeletLog, ContainerdLog string
	// KubeletHealthz is the kubelet's /healthz, on loopback.
	KubeletHealthz string
	// KubeletKubeconfig is the file the kubelet reads its server and credentials from.
	KubeletKubeconfig string

	c          *cluster.Cluster
	o          Options
	cs         kubernetes.Interface
	bins       bins
	cgroupRoot string // the pods' parent cgroup, e.g. /watchsan-node-123
	kubeletCfg string
	mu         sync.Mutex
	containerd *cluster.Process
	kubelet    *cluster.Process
	closeOnce  sync.Once
}

type bins struct {
	containerd, shim, ctr, kubelet, runc string
}

// Check reports why this machine cannot run a Node, nil if it can: not Linux, not root,
// runc not installed, or the binaries of hack/cluster-bins.sh missing.
func Check() error {
	_, err := findBins()
	return err
}

func findBins() (bins, error) {
	if runtime.GOOS != "linux" {
		return bins{}, fmt.Errorf("node: needs Linux, not %s", runtime.GOOS)
	}
	if os.Geteuid() != 0 {
		return bins{}, errors.New("node: needs root (containerd, runc and the kubelet mount and make cgroups)")
	}
	var b bins
	var err error
	if b.runc, err = exec.LookPath("runc"); err != nil {
		return bins{}, errors.New("node: runc not found on PATH (Debian: apt-get install runc; .ci/run installs it)")
	}
	for _, x := range []struct {
		p    *string
		name string
	}{{&b.containerd, "containerd"}, {&b.shim, "containerd-shim-runc-v2"}, {&b.ctr, "ctr"}, {&b.kubelet, "kubelet"}} {
		if *x.p, err = cluster.Binary(x.name); err != nil {
			return bins{}, err
		}
	}
	return b, nil
}

// Start starts containerd and the kubelet for cluster c, imports the sandbox image, and waits
// until the Node is Ready. ctx bounds only the start (DefaultStartTimeout if it has no
// deadline). On error nothing is left behind. Close the node before c.Stop (t.Cleanup runs
// in reverse order, so start it after the cluster).
func Start(ctx context.Context, c *cluster.Cluster, o Options) (_ *Node, err error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultStartTimeout)
		defer cancel()
	}
	b, err := findBins()
	if err != nil {
		return nil, err
	}
	if o.Name == "" {
		o.Name = "watchsan-node"
	}
	// A short path: containerd's sockets live here, and a unix socket path has at most 107 bytes.
	dir, err := os.MkdirTemp("", "wsnode-")
	if err != nil {
		return nil, fmt.Errorf("node dir: %w", err)
	}
	n := &Node{
		Name:              o.Name,
		Dir:               dir,
		StaticPodDir:      filepath.Join(dir, "manifests"),
		PodLogsDir:        filepath.Join(dir, "pod-logs"),
		ContainerdSocket:  filepath.Join(dir, "containerd.sock"),
		KubeletLog:        filepath.Join(dir, "kubelet.log"),
		ContainerdLog:     filepath.Join(dir, "containerd.log"),
		KubeletKubeconfig: filepath.Join(dir, "kubelet.kubeconfig"),
		c:                 c,
		o:                 o,
		bins:              b,
		cgroupRoot:        "/" + filepath.Base(dir),
	}
	defer func() {
		if err != nil {
			if tail := n.logTails(30); tail != "" {
				err = fmt.Errorf("%w\n%s", err, tail)
			}
			n.Close()
		}
	}()
	if n.cs, err = kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken)); err != nil {
		return nil, fmt.Errorf("node: admin client: %w", err)
	}
	for _, d := range []string{n.StaticPodDir, n.PodLogsDir, n.kubeletRoot()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
	}
	// The kubelet mounts pods' volumes (projected service-account tokens, emptyDirs) under its
	// root directory and containers see them only if that directory is a shared mount.
	if err := makeSharedMount(n.kubeletRoot()); err != nil {
		return nil, err
	}
	if err := makeCgroups(n.cgroupRoot); err != nil {
		return nil, err
	}

	t0 := time.Now()
	if err := n.startContainerd(ctx); err != nil {
		return nil, err
	}
	pause, err := PauseImage(ctx)
	if err != nil {
		return nil, err
	}
	if err := n.Import(ctx, pause); err != nil {
		return nil, err
	}
	tContainerd := time.Since(t0)
	if err := n.writeKubeletConfig(); err != nil {
		return nil, err
	}
	if err := n.startKubelet(ctx); err != nil {
		return nil, err
	}
	if err := n.WaitReady(ctx); err != nil {
		return nil, err
	}
	n.logf("node %s: containerd and sandbox image %.1fs, kubelet to node Ready %.1fs",
		n.Name, tContainerd.Seconds(), (time.Since(t0) - tContainerd).Seconds())
	return n, nil
}

func (n *Node) kubeletRoot() string { return filepath.Join(n.Dir, "kubelet") }

func (n *Node) logf(format string, args ...any) {
	if n.o.Log != nil {
		fmt.Fprintf(n.o.Log, format+"\n", args...)
	}
}

// WaitReady waits until the Node exists and its Ready condition is True.
func (n *Node) WaitReady(ctx context.Context) error {
	var last string
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		node, err := n.cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		switch {
		case err != nil:
			last = err.Error()
		default:
			last = "no Ready condition"
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					if cond.Status == corev1.ConditionTrue {
						return nil
					}
					last = fmt.Sprintf("Ready %s: %s", cond.Status, cond.Message)
				}
			}
		}
		if k := n.kubeletProc(); k != nil && k.Exited() {
			return fmt.Errorf("node %s: kubelet exited (%v)", n.Name, k.ExitError())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s not Ready: %w (last: %s)", n.Name, ctx.Err(), last)
		case <-t.C:
		}
	}
}

// startContainerd writes containerd's config and starts it, then waits for its socket.
func (n *Node) startContainerd(ctx context.Context) error {
	cfg := filepath.Join(n.Dir, "containerd.toml")
	if err := os.WriteFile(cfg, []byte(n.containerdConfig()), 0o600); err != nil {
		return fmt.Errorf("containerd config: %w", err)
	}
	for _, d := range []string{n.cniDir(), n.cniBinDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// Some CNI configuration, or the runtime reports NetworkReady false and the node is never
	// Ready. Its plugin does not exist: host-network pods never call it, and any other pod
	// fails to start ("failed to find plugin") without an interface being made.
	const cni = `{"cniVersion":"1.0.0","name":"watchsan-none","plugins":[{"type":"watchsan-no-such-plugin"}]}`
	if err := os.WriteFile(filepath.Join(n.cniDir(), "10-none.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	p, err := cluster.StartProcess(cluster.ProcessOptions{
		Name:    "containerd",
		Path:    n.bins.containerd,
		Args:    []string{"--config=" + cfg},
		Env:     n.env(),
		LogFile: n.ContainerdLog,
		Log:     n.o.Log,
	})
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.containerd = p
	n.mu.Unlock()
	return p.WaitReady(ctx, func(ctx context.Context) error {
		_, err := n.Ctr(ctx, "version")
		return err
	})
}

// env is containerd's and the kubelet's environment: the shim and runc found on PATH.
func (n *Node) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PATH=") || strings.HasPrefix(kv, "KUBECONFIG=") || strings.HasPrefix(kv, "CONTAINERD_") {
			continue
		}
		env = append(env, kv)
	}
	path := filepath.Dir(n.bins.shim) + ":" + filepath.Dir(n.bins.runc) + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	return append(env, "PATH="+path)
}

func (n *Node) cniDir() string    { return filepath.Join(n.Dir, "cni", "net.d") }
func (n *Node) cniBinDir() string { return filepath.Join(n.Dir, "cni", "bin") }

// containerdConfig is containerd v2's configuration (version 3): every path under Dir, NRI off,
// the CRI's runtime runc with its state under Dir, the sandbox image ours.
func (n *Node) containerdConfig() string {
	d := n.Dir
	q := strconv.Quote
	return `version = 3
root = ` + q(filepath.Join(d, "containerd-root")) + `
state = ` + q(filepath.Join(d, "containerd-state")) + `
# NRI would listen on /var/run/nri/nri.sock.
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = ` + q(n.ContainerdSocket) + `

[ttrpc]
  address = ` + q(n.ContainerdSocket+".ttrpc") + `

[plugins."io.containerd.internal.v1.opt"]
  path = ` + q(filepath.Join(d, "opt")) + `

[plugins."io.containerd.grpc.v1.cri"]
  # exec, attach and port-forward streams: loopback only.
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images"]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = ` + q(SandboxImage) + `

[plugins."io.containerd.cri.v1.runtime"]
  # This VM lacks CAP_SYS_RESOURCE: without it every sandbox fails to lower its
  # oom_score_adj ("nsexec: failed to update /proc/self/oom_score_adj: Permission denied").
  restrict_oom_score_adj = true
  cdi_spec_dirs = [` + q(filepath.Join(d, "cdi")) + `]
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [` + q(n.cniBinDir()) + `]
    conf_dir = ` + q(n.cniDir()) + `
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = ` + q(n.bins.runc) + `
        Root = ` + q(filepath.Join(d, "runc")) + `
        SystemdCgroup = false
`
}

// Ctr runs ctr against the node's containerd in its k8s.io namespace (the CRI's) and returns
// its combined output.
func (n *Node) Ctr(ctx context.Context, args ...string) ([]byte, error) {
	all := append([]string{"--address=" + n.ContainerdSocket, "--namespace=k8s.io"}, args...)
	cmd := exec.CommandContext(ctx, n.bins.ctr, all...)
	cmd.Env = n.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// Import imports an image tarball (a `docker load` tarball, as hack/image writes) into the
// node's containerd, where the kubelet finds it (no pull: the images' pull policy must allow
// a present image, as IfNotPresent, the default for a tag other than latest, does).
func (n *Node) Import(ctx context.Context, tarball string) error {
	_, err := n.Ctr(ctx, "images", "import", tarball)
	if err != nil {
		return fmt.Errorf("node: import %s: %w", tarball, err)
	}
	return nil
}

// writeKubeletConfig writes the kubelet's configuration, kubeconfig and serving certificate.
func (n *Node) writeKubeletConfig() error {
	ports, err := cluster.FreePorts(2)
	if err != nil {
		return err
	}
	n.KubeletHealthz = "http://127.0.0.1:" + strconv.Itoa(ports[1]) + "/healthz"
	cert, key, err := n.c.CA.IssueServing("kubelet-" + n.Name)
	if err != nil {
		return fmt.Errorf("kubelet serving certificate: %w", err)
	}
	if err := n.writeKubeconfig(n.o.Server, n.o.CAFile, n.o.Token); err != nil {
		return err
	}
	d := n.Dir
	q := strconv.Quote
	cfg := `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This VM has cgroups v1 (hybrid); the config file's default is to refuse them.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: ` + q(n.cgroupRoot) + `
containerRuntimeEndpoint: ` + q("unix://"+n.ContainerdSocket) + `
# Leave the host's iptables and sysctls alone: without protectKernelDefaults the kubelet
# rewrites kernel.panic, kernel.panic_on_oops and vm.overcommit_memory; with it, it refuses to
# start unless they have its values, which it sees in a mount namespace of its own
# (kubeletSysctlView).
makeIPTablesUtilChains: false
protectKernelDefaults: true
failSwapOn: false
address: 127.0.0.1
port: ` + strconv.Itoa(ports[0]) + `
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ` + strconv.Itoa(ports[1]) + `
tlsCertFile: ` + q(cert) + `
tlsPrivateKeyFile: ` + q(key) + `
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: ` + q(n.c.CAFile) + `
authorization:
  mode: AlwaysAllow
staticPodPath: ` + q(n.StaticPodDir) + `
fileCheckFrequency: 1s
podLogsDir: ` + q(n.PodLogsDir) + `
volumePluginDir: ` + q(filepath.Join(d, "volume-plugins")) + `
# No eviction or image garbage collection on a shared test machine.
evictionHard:
  memory.available: "0%"
  nodefs.available: "0%"
  imagefs.available: "0%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 2s
`
	n.kubeletCfg = filepath.Join(d, "kubelet.yaml")
	return os.WriteFile(n.kubeletCfg, []byte(cfg), 0o600)
}

// writeKubeconfig writes the kubelet's kubeconfig: server ("" apiserver 0), caFile ("" the
// cluster CA), token ("" the admin token).
func (n *Node) writeKubeconfig(server, caFile, token string) error {
	if server == "" {
		server = n.c.APIServers[0].URL
	}
	if caFile == "" {
		caFile = n.c.CAFile
	}
	if token == "" {
		token = n.c.AdminToken
	}
	return n.c.WriteKubeconfig(n.KubeletKubeconfig, server, token, caFile)
}

func (n *Node) startKubelet(ctx context.Context) error {
	args := []string{
		"--config=" + n.kubeletCfg,
		"--kubeconfig=" + n.KubeletKubeconfig,
		"--root-dir=" + n.kubeletRoot(),
		"--cert-dir=" + filepath.Join(n.Dir, "kubelet-pki"),
		"--hostname-override=" + n.Name,
		"--v=2",
	}
	path, args, err := n.kubeletSysctlView(args)
	if err != nil {
		return err
	}
	p, err := cluster.StartProcess(cluster.ProcessOptions{
		Name:    "kubelet",
		Path:    path,
		Args:    args,
		Env:     n.env(),
		LogFile: n.KubeletLog,
		Log:     n.o.Log,
	})
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.kubelet = p
	n.mu.Unlock()
	return p.WaitReady(ctx, n.kubeletHealthy)
}

func (n *Node) kubeletHealthy(ctx context.Context) error {
	return httpOK(ctx, n.KubeletHealthz)
}

func (n *Node) kubeletProc() *cluster.Process {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.kubelet
}

// RestartKubelet kills the kubelet and starts it again talking to server with caFile and
// token ("" for each: as in Options), then waits for its /healthz (not for the Node: see
// WaitReady). Its pods keep running meanwhile, as they do when a real node's kubelet restarts.
func (n *Node) RestartKubelet(ctx context.Context, server, caFile, token string) error {
	if k := n.kubeletProc(); k != nil {
		k.Kill()
	}
	if err := n.writeKubeconfig(server, caFile, token); err != nil {
		return err
	}
	return n.startKubelet(ctx)
}

// KubeletPid is the kubelet's process id.
func (n *Node) KubeletPid() int {
	if k := n.kubeletProc(); k != nil {
		return k.Pid()
	}
	return 0
}

// LogTails returns the last lines of containerd's and the kubelet's logs, for a failure report.
func (n *Node) LogTails(lines int) string { return n.logTails(lines) }

func (n *Node) logTails(lines int) string {
	var b strings.Builder
	for _, f := range []string{n.ContainerdLog, n.KubeletLog} {
		if t := fileTail(f, lines); t != "" {
			fmt.Fprintf(&b, "--- %s\n%s\n", filepath.Base(f), t)
		}
	}
	return b.String()
}

// Close kills the kubelet, every process in the pods' cgroups, the shims of this containerd
// and containerd itself, each by process id, then unmounts everything under Dir, removes the
// pods' cgroups, Dir, and what containerd left under /run/containerd. Idempotent.
func (n *Node) Close() {
	n.closeOnce.Do(func() {
		n.mu.Lock()
		kubelet, containerd := n.kubelet, n.containerd
		n.mu.Unlock()
		if kubelet != nil {
			kubelet.Kill()
		}
		// The containers first (they are in the pods' cgroups), then the shims (their own
		// sessions, outside containerd's process group), then containerd.
		killCgroupProcs(n.cgroupRoot)
		killShims(n.ContainerdSocket)
		if containerd != nil {
			containerd.Kill()
		}
		if err := unmountUnder(n.Dir); err != nil {
			n.logf("node %s: %v", n.Name, err)
		}
		if err := removeCgroups(n.cgroupRoot); err != nil {
			n.logf("node %s: %v", n.Name, err)
		}
		if err := os.RemoveAll(n.Dir); err != nil {
			n.logf("node %s: %v", n.Name, err)
		}
		cleanRunDir()
		cleanDevicePluginDir()
	})
}

// FreePorts returns n distinct loopback ports that were free a moment ago, for host-network
// pods' listeners (the machine is shared: fixed ports may be taken).
func FreePorts(n int) ([]int, error) { return cluster.FreePorts(n) }

// fileTail returns the last n lines of a file, "" if it cannot be read.
func fileTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ContainerPid returns the process id, in this machine's pid namespace, of a running
// container's first process (its task in containerd), from the container's ID as the pod's
// status gives it ("containerd://ID" or ID).
func (n *Node) ContainerPid(ctx context.Context, containerID string) (int, error) {
	id := strings.TrimPrefix(containerID, "containerd://")
	out, err := n.Ctr(ctx, "tasks", "ls")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == id {
			if f[2] != "RUNNING" {
				return 0, fmt.Errorf("container %s is %s", id, f[2])
			}
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("container %s: no task in containerd (ctr tasks ls:\n%s)", id, out)
}
