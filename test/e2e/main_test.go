// Package e2e runs watchsan, as the real binary, in front of a real kube-apiserver and etcd from
// the harness (test/cluster), with real kubectl and client-go as clients. Every test also checks
// that its traffic went through watchsan (its access metrics), so a bypassed proxy fails.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/clustertest"
)

// watchsanBin is the binary under test, built once by TestMain (with -race unless
// WATCHSAN_E2E_RACE=0), or the one WATCHSAN_E2E_BIN names: a prebuilt binary, so that an older
// commit can be measured by today's tests.
var watchsanBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "watchsan-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if bin := os.Getenv("WATCHSAN_E2E_BIN"); bin != "" { // a prebuilt binary, e.g. an older commit's
		if watchsanBin, err = filepath.Abs(bin); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}
	watchsanBin = filepath.Join(dir, "watchsan")
	root, err := cluster.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	args := []string{"build", "-race", "-o", watchsanBin, "./cmd/watchsan"}
	if os.Getenv("WATCHSAN_E2E_RACE") == "0" { // measuring memory as it is in production
		args = slices.Delete(args, 1, 2)
	}
	build := exec.Command("go", args...)
	build.Dir = root
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building watchsan:", err)
		return 1
	}
	return m.Run()
}

// shipped is watchsan as shipped, without -race (shippedBin).
var shipped struct {
	once     sync.Once
	bin      string
	race     bool // bin is a -race build after all (WATCHSAN_E2E_BIN names one)
	buildErr error
}

// shippedBin is watchsan as shipped, for the tests that measure memory and service times as
// in production (the memory table): the race detector's shadow memory and its 5-10 times
// slower code measure the detector, not watchsan. It is the binary under test when that is
// already built without -race, or is named by WATCHSAN_E2E_BIN (a -race build only if
// WATCHSAN_E2E_RACE says so); else built once, on first use, next to it. race says whether it is
// a -race build.
func shippedBin(t testing.TB) (bin string, race bool) {
	t.Helper()
	shipped.once.Do(func() {
		switch {
		case os.Getenv("WATCHSAN_E2E_BIN") != "":
			shipped.bin, shipped.race = watchsanBin, os.Getenv("WATCHSAN_E2E_RACE") != "0"
		case os.Getenv("WATCHSAN_E2E_RACE") == "0":
			shipped.bin = watchsanBin
		default:
			root, err := cluster.RepoRoot()
			if err != nil {
				shipped.buildErr = err
				return
			}
			shipped.bin = filepath.Join(filepath.Dir(watchsanBin), "watchsan-shipped")
			build := exec.Command("go", "build", "-o", shipped.bin, "./cmd/watchsan")
			build.Dir = root
			if out, err := build.CombinedOutput(); err != nil {
				shipped.buildErr = fmt.Errorf("building watchsan without -race: %v\n%s", err, out)
			}
		}
	})
	if shipped.buildErr != nil {
		t.Fatal(shipped.buildErr)
	}
	return shipped.bin, shipped.race
}

// proxy is a running watchsan process.
type proxy struct {
	t        testing.TB
	cmd      *exec.Cmd
	URL      string // main listener, http://
	AdminURL string
	logMu    sync.Mutex
	logs     []string
	exited   chan struct{}
	exitErr  error
}

// startProxy runs watchsan with args plus loopback listeners on free ports, and waits until it
// listens. It is stopped (SIGTERM, then SIGKILL) in t.Cleanup; its log is dumped on failure.
func startProxy(t testing.TB, args ...string) *proxy {
	t.Helper()
	return startProxyUnder(t, nil, args...)
}

// startProxyUnder is startProxy with watchsan run by the command wrap (e.g. prlimit with its
// arguments), when wrap is not empty.
func startProxyUnder(t testing.TB, wrap []string, args ...string) *proxy {
	t.Helper()
	return startProxyBin(t, watchsanBin, wrap, args...)
}

// startProxyBin is startProxyUnder with the binary bin.
func startProxyBin(t testing.TB, bin string, wrap []string, args ...string) *proxy {
	t.Helper()
	all := append([]string{"--listen=127.0.0.1:0", "--admin-listen=127.0.0.1:0", "--log-format=json", "--log-level=debug"}, args...)
	argv := append(append(append([]string(nil), wrap...), bin), all...)
	p := &proxy{t: t, cmd: exec.Command(argv[0], argv[1:]...), exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), "KUBECONFIG=/nonexistent") // never the developer's kubeconfig
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrs := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.logMu.Lock()
			p.logs = append(p.logs, line)
			p.logMu.Unlock()
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "listening" {
				addrs <- [2]string{fmt.Sprint(m["listen"]), fmt.Sprint(m["admin"])}
			}
		}
	}()
	go func() { p.exitErr = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("watchsan log:\n%s", p.Log())
		}
	})
	select {
	case a := <-addrs:
		p.URL, p.AdminURL = "http://"+a[0], "http://"+a[1]
	case <-p.exited:
		t.Fatalf("watchsan exited at start: %v\n%s", p.exitErr, p.Log())
	case <-time.After(20 * time.Second):
		t.Fatalf("watchsan did not start listening within 20s\n%s", p.Log())
	}
	return p
}

// Log returns everything watchsan logged so far.
func (p *proxy) Log() string {
	p.logMu.Lock()
	defer p.logMu.Unlock()
	return strings.Join(p.logs, "\n")
}

// Stop sends SIGTERM and waits for the exit (SIGKILL after 30s). It returns the exit error.
func (p *proxy) Stop() error {
	select {
	case <-p.exited:
		return p.exitErr
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	return p.exitErr
}

// Metric returns the sum of every sample of the named metric whose labels include all of want.
func (p *proxy) Metric(name string, want map[string]string) float64 {
	p.t.Helper()
	resp, err := http.Get(p.AdminURL + "/metrics")
	if err != nil {
		p.t.Fatalf("reading watchsan metrics: %v", err)
	}
	defer resp.Body.Close()
	return sumMetric(resp.Body, name, want)
}

// requireProxied fails the test unless watchsan served at least n requests matching labels;
// every test calls it, so a client that bypassed watchsan fails.
//
// A request is counted when watchsan's handler returns, which for a watch the client stopped
// can be after the client has moved on: the count is waited for, up to 10s.
func (p *proxy) requireProxied(n float64, labels map[string]string) {
	p.t.Helper()
	var got float64
	if !testutil.Until(10*time.Second, func() bool {
		got = p.Metric("watchsan_requests_total", labels)
		return got >= n
	}) {
		p.t.Fatalf("watchsan served %v requests matching %v, want at least %v: traffic bypassed the proxy", got, labels, n)
	}
}

// sumMetric parses the Prometheus text format just enough for tests.
func sumMetric(r io.Reader, name string, want map[string]string) float64 {
	var sum float64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		labels := map[string]string{}
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			for _, kv := range strings.Split(rest[1:end], ",") {
				k, v, _ := strings.Cut(kv, "=")
				labels[k] = strings.Trim(v, `"`)
			}
			rest = rest[end+1:]
		} else if !strings.HasPrefix(rest, " ") {
			continue // a longer metric name
		}
		ok := true
		for k, v := range want {
			if labels[k] != v {
				ok = false
			}
		}
		if !ok {
			continue
		}
		var v float64
		fmt.Sscan(strings.TrimSpace(rest), &v)
		sum += v
	}
	return sum
}

// eventually is testutil.Eventually, the one polling helper of every test package.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, timeout, what, cond)
}

// newCluster starts a real control plane for one test (warm start takes seconds), stopped in
// t.Cleanup; in -short mode the test is skipped.
func newCluster(t *testing.T, o cluster.Options) *cluster.Cluster {
	t.Helper()
	return clustertest.Start(t, o)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
