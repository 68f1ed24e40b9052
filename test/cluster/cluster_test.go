package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func TestBinariesMissingNamesTheBuild(t *testing.T) {
	t.Setenv(BinDirEnv, t.TempDir())
	_, err := Binaries()
	if err == nil || !strings.Contains(err.Error(), "make cluster-bins") || !strings.Contains(err.Error(), "kube-apiserver") {
		t.Fatalf("Binaries() error = %v, want one naming the missing binaries and `make cluster-bins`", err)
	}
}

func TestRepoRoot(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if mod, err := moduleOf(filepath.Join(root, "go.mod")); err != nil || mod != ModulePath {
		t.Fatalf("RepoRoot() = %s with module %q (%v)", root, mod, err)
	}
}

func TestLastLines(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"a\nb\nc\n", 2, "b\nc"},
		{"a\nb\nc", 5, "a\nb\nc"},
		{"a\nb\nc", 1, "c"},
		{"", 3, ""},
	} {
		if got := lastLines(tc.in, tc.n); got != tc.want {
			t.Errorf("lastLines(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestPrefixWriterWholeLines(t *testing.T) {
	var out bytes.Buffer
	var mu sync.Mutex
	a := &prefixWriter{mu: &mu, w: &out, prefix: []byte("a | ")}
	b := &prefixWriter{mu: &mu, w: &out, prefix: []byte("b | ")}
	a.Write([]byte("one "))
	b.Write([]byte("x\n"))
	a.Write([]byte("line\ntwo"))
	a.Write([]byte("\n"))
	if got, want := out.String(), "b | x\na | one line\na | two\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// TestEtcdMovesOffATakenPort gives etcd a client port that is taken, as another process may take
// a port between freePorts and the bind; the start must retry on fresh ports.
func TestEtcdMovesOffATakenPort(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the etcd binary; skipped in -short mode")
	}
	bins, err := Binaries()
	if err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	calls := 0
	c := &Cluster{Dir: t.TempDir(), bins: bins, client: newProbeClient(nil)}
	c.pickPorts = func(n int) ([]int, error) {
		calls++
		ports, err := freePorts(n)
		if calls == 1 && err == nil {
			ports[0] = takenPort
		}
		return ports, err
	}
	defer c.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.startEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	if calls != 2 || strings.HasSuffix(c.EtcdURL, ":"+strconv.Itoa(takenPort)) {
		t.Fatalf("etcd at %s after %d port picks; want a second pick off port %d", c.EtcdURL, calls, takenPort)
	}
	if err := c.etcdHealthy(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSingleAPIServer(t *testing.T) {
	start := time.Now()
	c := startT(t, Options{})
	t.Logf("warm start, 1 apiserver (etcd + apiserver ready + RBAC in force): %v (%s)", time.Since(start), c.startReport())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	admin := clientset(t, c, 0, c.AdminToken)
	user := clientset(t, c, 0, c.UserToken)

	t.Run("admin creates a configmap", func(t *testing.T) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "hello"}, Data: map[string]string{"k": "v"}}
		if _, err := admin.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		got, err := admin.CoreV1().ConfigMaps("default").Get(ctx, "hello", metav1.GetOptions{})
		if err != nil || got.Data["k"] != "v" {
			t.Fatalf("get = %v, %v", got, err)
		}
	})

	t.Run("limited user gets exactly its RBAC", func(t *testing.T) {
		if _, err := user.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("list secrets in default: %v, want 403", err)
		}
		if _, err := user.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("list configmaps in default: %v, want 403", err)
		}
		if _, err := user.CoreV1().ConfigMaps(LimitedNamespace).List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("list configmaps in %s: %v, want 200", LimitedNamespace, err)
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "nope"}}
		if _, err := user.CoreV1().ConfigMaps(LimitedNamespace).Create(ctx, cm, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("create configmap in %s: %v, want 403", LimitedNamespace, err)
		}
		w, err := user.CoreV1().ConfigMaps(LimitedNamespace).Watch(ctx, metav1.ListOptions{})
		if err != nil {
			t.Errorf("watch configmaps in %s: %v", LimitedNamespace, err)
		} else {
			w.Stop()
		}
	})

	t.Run("kubectl", func(t *testing.T) {
		kc := filepath.Join(t.TempDir(), "kubeconfig")
		if err := c.WriteKubeconfig(kc, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
			t.Fatal(err)
		}
		// Not `kubectl version`: it rejects the unstamped client version of a plain go build
		// ("v0.0.0-master+$Format:%H$") until hack/cluster-bins.sh sets the version ldflags.
		out, _, err := c.Kubectl(ctx, kc, "get", "--raw", "/version")
		if err != nil {
			t.Fatal(err)
		}
		var v struct{ GitVersion string }
		if err := json.Unmarshal(out, &v); err != nil || v.GitVersion == "" {
			t.Fatalf("kubectl get --raw /version: %v: %s", err, out)
		}
		t.Logf("kube-apiserver /version: %s", out)
		out, _, err = c.Kubectl(ctx, kc, "get", "configmap", "hello", "-o", "jsonpath={.data.k}")
		if err != nil || string(out) != "v" {
			t.Fatalf("kubectl get configmap: %q, %v", out, err)
		}

		ukc := filepath.Join(t.TempDir(), "kubeconfig")
		if err := c.WriteKubeconfig(ukc, c.APIServers[0].URL, c.UserToken, c.CAFile); err != nil {
			t.Fatal(err)
		}
		if _, stderr, err := c.Kubectl(ctx, ukc, "get", "secrets"); err == nil || !bytes.Contains(stderr, []byte("Forbidden")) {
			t.Fatalf("limited kubectl get secrets: err %v, stderr %s; want Forbidden", err, stderr)
		}
	})

	t.Run("no CBOR without the feature gate", func(t *testing.T) {
		resp := rawGet(t, ctx, c, 0, "/api/v1/namespaces/default/configmaps?watch=1", "application/cbor")
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotAcceptable {
			t.Fatalf("CBOR watch without the gate: %s, want 406", resp.Status)
		}
	})

	t.Run("SIGSTOP freezes, SIGCONT thaws", func(t *testing.T) {
		a := c.APIServers[0]
		if err := a.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		sctx, scancel := context.WithTimeout(ctx, 500*time.Millisecond)
		err := a.ready(sctx)
		scancel()
		if err == nil {
			t.Error("a stopped apiserver answered /readyz")
		}
		if err := a.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if err := a.Ready(ctx); err != nil {
			t.Fatal(err)
		}
	})

	// Stop must also end a frozen apiserver, as a fault test that fails mid-freeze leaves it.
	if err := c.APIServers[0].Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	pids := []int{c.etcd.pid(), c.APIServers[0].Pid()}
	c.Stop()
	assertGone(t, c.Dir, pids)
	c.Stop() // idempotent
}

func TestTwoAPIServersRestart(t *testing.T) {
	start := time.Now()
	c := startT(t, Options{
		APIServers:     2,
		FeatureGates:   "CBORServingAndStorage=true",
		APIServerFlags: []string{"--shutdown-delay-duration=1s"},
	})
	t.Logf("warm start, 2 apiservers (etcd + apiservers ready + RBAC in force): %v (%s)", time.Since(start), c.startReport())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if c.APIServers[0].Port == c.APIServers[1].Port {
		t.Fatalf("both apiservers on port %d", c.APIServers[0].Port)
	}
	a0, a1 := clientset(t, c, 0, c.AdminToken), clientset(t, c, 1, c.AdminToken)

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "shared"}, Data: map[string]string{"from": "0"}}
	created, err := a0.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sameObject := func(t *testing.T, cs *kubernetes.Clientset, which string) {
		t.Helper()
		got, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "shared", metav1.GetOptions{})
		if err != nil || got.UID != created.UID || got.Data["from"] != "0" {
			t.Fatalf("%s: get shared = %v, %v; want uid %s", which, got, err, created.UID)
		}
	}
	sameObject(t, a1, "apiserver 1")

	// FeatureGates reach every apiserver: both serve a CBOR watch.
	for i := range c.APIServers {
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		resp := rawGet(t, wctx, c, i, "/api/v1/namespaces/default/configmaps?watch=1", "application/cbor")
		first := make([]byte, 3)
		_, err := io.ReadFull(resp.Body, first) // the initial ADDED of "shared"
		resp.Body.Close()
		wcancel()
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "application/cbor-seq" ||
			err != nil || !bytes.Equal(first, []byte{0xd9, 0xd9, 0xf7}) {
			t.Fatalf("apiserver %d: CBOR watch: %s, Content-Type %q, first bytes %x (%v)", i, resp.Status, ct, first, err)
		}
	}

	// Hard kill and restart on the same port.
	s0 := c.APIServers[0]
	url, pid := s0.URL, s0.Pid()
	if err := s0.Kill(); err != nil {
		t.Fatal(err)
	}
	if s0.Running() || alive(pid) {
		t.Fatalf("apiserver 0 (pid %d) still running after Kill", pid)
	}
	sameObject(t, a1, "apiserver 1 while 0 is down")
	t0 := time.Now()
	if err := s0.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("apiserver 0 restarted after SIGKILL, ready in %v", time.Since(t0))
	if s0.URL != url || s0.Pid() == pid {
		t.Fatalf("restart: url %s pid %d, was %s pid %d", s0.URL, s0.Pid(), url, pid)
	}
	sameObject(t, a0, "apiserver 0 after restart")

	// Graceful: SIGTERM, wait for the exit, restart.
	s1 := c.APIServers[1]
	pid = s1.Pid()
	t0 = time.Now()
	if err := s1.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := s1.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	t.Logf("apiserver 1 exited %v after SIGTERM (--shutdown-delay-duration=1s)", took)
	if took < time.Second {
		t.Errorf("apiserver 1 exited %v after SIGTERM, before its --shutdown-delay-duration=1s: APIServerFlags not applied?", took)
	}
	if err := s1.Signal(syscall.SIGCONT); err == nil {
		t.Error("Signal to an exited apiserver succeeded")
	}
	if err := s1.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if s1.Pid() == pid {
		t.Fatal("restart kept the old pid")
	}
	sameObject(t, a1, "apiserver 1 after graceful restart")

	pids := []int{c.etcd.pid(), s0.Pid(), s1.Pid()}
	c.Stop()
	assertGone(t, c.Dir, pids)
	if err := s0.Restart(ctx); err == nil {
		t.Fatal("Restart after Stop succeeded")
	}
}

const orphanHelperEnv = "WATCHSAN_CLUSTER_ORPHAN_HELPER"

// TestProcessesDieWithTheirStarter kills (SIGKILL, so no cleanup runs) a process that started a
// cluster and checks that etcd and the apiserver die with it.
func TestProcessesDieWithTheirStarter(t *testing.T) {
	if os.Getenv(orphanHelperEnv) == "1" {
		c, err := Start(context.Background(), Options{})
		if err != nil {
			fmt.Println("HELPER-ERROR", err)
			os.Exit(1)
		}
		fmt.Printf("HELPER %s %d %d\n", c.Dir, c.etcd.pid(), c.APIServers[0].Pid())
		select {} // until killed
	}
	if testing.Short() {
		t.Skip("needs a real control plane; skipped in -short mode")
	}
	if _, err := Binaries(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestProcessesDieWithTheirStarter$", "-test.timeout=3m")
	cmd.Env = append(os.Environ(), orphanHelperEnv+"=1")
	cmd.SysProcAttr = sysProcAttr()
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()

	var dir string
	var pids []int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && f[0] == "HELPER-ERROR" {
			t.Fatal(sc.Text())
		}
		if len(f) == 4 && f[0] == "HELPER" {
			dir = f[1]
			for _, s := range f[2:] {
				pid, _ := strconv.Atoi(s)
				pids = append(pids, pid)
			}
			break
		}
	}
	if dir == "" {
		t.Fatalf("helper printed no cluster: %v", sc.Err())
	}
	defer os.RemoveAll(dir) // the helper had no chance to
	for _, pid := range pids {
		if !alive(pid) {
			t.Fatalf("pid %d not running before the helper is killed", pid)
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("pid %d still running 10s after its starter died", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// rawGet sends a GET with the admin token to apiserver i.
func rawGet(t *testing.T, ctx context.Context, c *Cluster, i int, path, accept string) *http.Response {
	t.Helper()
	hc, err := rest.HTTPClientFor(c.RESTConfig(i, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.APIServers[i].URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", accept)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func clientset(t *testing.T, c *Cluster, i int, token string) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.RESTConfig(i, token))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// assertGone checks that dir is removed and that none of pids, nor any process whose command
// line names dir, is running.
func assertGone(t *testing.T, dir string, pids []int) {
	t.Helper()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("cluster dir %s still there after Stop (%v)", dir, err)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("pid %d still running after Stop", pid)
		}
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(dir)) && alive(pid) {
			t.Errorf("pid %d still running after Stop: %s", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		}
	}
}

// alive reports whether pid is a process that has not exited (a zombie has).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses; the state follows the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// startT is clustertest.Start for this package's own tests (which cannot import clustertest:
// it imports this package).
func startT(t *testing.T, o Options) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a real control plane; skipped in -short mode")
	}
	c, err := Start(context.Background(), o)
	if err != nil {
		t.Fatalf("starting the test cluster: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}
