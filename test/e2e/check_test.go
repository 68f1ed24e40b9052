package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/check"
	"github.com/watchsan/watchsan/internal/faults"
	"github.com/watchsan/watchsan/test/cluster"
)

// checkWaits keep each run short: the apiserver's pre-deadline bookmark comes 2 s before a
// 5 s deadline.
var checkWaits = []string{"--bookmark-wait=5s", "--idle-wait=5s"}

// TestCheckCommand runs `watchsan check`, the binary, against the real apiserver directly
// (clean, exit 0), behind the fault layer with the 1.7 bug, an idle cut and bookmarks dropped
// (each reported, exit 1), through watchsan in front of that faulty path (clean again: what
// watchsan is for), and interrupted (exit 2, its namespace deleted).
func TestCheckCommand(t *testing.T) {
	e := newSanEnv(t, cluster.Options{})
	dir := t.TempDir()
	kubeconfig := func(name, server, token, caFile string) string {
		p := filepath.Join(dir, name)
		if err := e.c.WriteKubeconfig(p, server, token, caFile); err != nil {
			t.Fatal(err)
		}
		return p
	}
	direct := kubeconfig("direct", e.c.APIServers[0].URL, e.c.AdminToken, e.c.CAFile)

	t.Run("direct is clean", func(t *testing.T) {
		out := runCheckCmd(t, 0, append([]string{"--kubeconfig=" + direct}, checkWaits...)...)
		for _, want := range []string{"Delete:     ok", "Re-watch:   ok", "Bookmarks:  ok", "Idle watch: ok", "Result: no problem found."} {
			if !strings.Contains(out, want) {
				t.Errorf("report lacks %q", want)
			}
		}
		rep := runCheckJSON(t, 0, append([]string{"--kubeconfig=" + direct}, checkWaits...)...)
		if rep.Affected || len(rep.Problems) != 0 || rep.Delete.WentBackwards || len(rep.Bookmarks.AtSeconds) == 0 || rep.IdleCut.Cut {
			t.Errorf("json report: %+v", rep)
		}
		requireNamespaceGone(t, e, rep.Namespace)
	})

	faulty := faults.Faults{DeleteOldRV: true, EndIdleAfter: 2 * time.Second, DropBookmarks: true}
	t.Run("faulty path: every problem reported", func(t *testing.T) {
		_, layerURL := e.faultFront(t, faulty)
		kc := kubeconfig("faulty", layerURL, "", "")
		out := runCheckCmd(t, 1, append([]string{"--kubeconfig=" + kc}, checkWaits...)...)
		for _, want := range []string{"Delete:     BACKWARDS", "Re-watch:   REPLAY", "Idle watch: CUT after 2", "Result: AFFECTED"} {
			if !strings.Contains(out, want) {
				t.Errorf("report lacks %q", want)
			}
		}
		rep := runCheckJSON(t, 1, append([]string{"--kubeconfig=" + kc}, checkWaits...)...)
		if !rep.Affected || !rep.Delete.WentBackwards || len(rep.Delete.Replayed) == 0 || !rep.IdleCut.Cut {
			t.Errorf("json report: %+v", rep)
		}
		requireNamespaceGone(t, e, rep.Namespace)
	})

	t.Run("bookmarks dropped", func(t *testing.T) {
		_, layerURL := e.faultFront(t, faults.Faults{DropBookmarks: true})
		kc := kubeconfig("nobookmarks", layerURL, "", "")
		out := runCheckCmd(t, 1, "--kubeconfig="+kc, "--bookmark-wait=5s", "--idle-wait=0")
		if !strings.Contains(out, "Bookmarks:  NONE within 5s") || !strings.Contains(out, "AFFECTED, 1 problem") {
			t.Errorf("report does not show the dropped bookmarks alone")
		}
	})

	t.Run("through watchsan the faulty path is clean", func(t *testing.T) {
		// watchsan repairs the deletes and resumes the watches the path cuts. It cannot make up
		// bookmarks the path drops, nor those the apiserver never sends because the path cuts
		// every watch before they are due: the cut comes after the pre-deadline bookmark of
		// the 5s bookmark watch (at about 3s), and before the end of the 6s idle wait.
		_, layerURL := e.faultFront(t, faults.Faults{DeleteOldRV: true, EndIdleAfter: 4500 * time.Millisecond})
		p := startProxy(t, "--upstream="+layerURL)
		kc := kubeconfig("watchsan", p.URL, "", "")
		out := runCheckCmd(t, 0, "--kubeconfig="+kc, "--bookmark-wait=5s", "--idle-wait=6s")
		if !strings.Contains(out, "Result: no problem found.") {
			t.Errorf("report shows problems through watchsan")
		}
		p.requireProxied(4, map[string]string{"verb": "watch", "resource": "configmaps"})
		if n := p.Metric("watchsan_watch_resumes_total", nil); n < 1 {
			t.Errorf("watchsan resumed %v watches, want the idle one resumed after the cut", n)
		}
		if n := p.Metric("watchsan_watch_events_total", map[string]string{"type": "DELETED", "action": "rewritten"}); n < 1 {
			t.Errorf("watchsan rewrote %v DELETED events, want at least 1", n)
		}
	})

	t.Run("interrupted: exit 2, namespace deleted", func(t *testing.T) {
		cmd := exec.Command(watchsanBin, "check", "--kubeconfig="+direct, "--bookmark-wait=60s", "--idle-wait=60s")
		cmd.Env = append(os.Environ(), "KUBECONFIG=/nonexistent")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stdout bytes.Buffer
		cmd.Stdout = &stdout
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 100)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		var errLog []string
		timeout := time.After(60 * time.Second)
	wait:
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("check ended before it waited:\n%s", strings.Join(errLog, "\n"))
				}
				errLog = append(errLog, l)
				if strings.Contains(l, "waiting for bookmarks") {
					break wait
				}
			case <-timeout:
				_ = cmd.Process.Kill()
				t.Fatalf("no waiting line within 60s:\n%s", strings.Join(errLog, "\n"))
			}
		}
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		for l := range lines {
			errLog = append(errLog, l)
		}
		err = cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != check.ExitError {
			t.Fatalf("exit %v, want %d; stderr:\n%s", err, check.ExitError, strings.Join(errLog, "\n"))
		}
		all := strings.Join(errLog, "\n")
		t.Logf("stderr:\n%s", all)
		if !strings.Contains(all, "interrupted") || stdout.Len() != 0 {
			t.Errorf("stderr does not say interrupted, or a report was written: %q", stdout.String())
		}
		nss, err := e.admin.CoreV1().Namespaces().List(ctxT(t, 30*time.Second), metav1.ListOptions{LabelSelector: check.ManagedByLabel + "=" + check.ManagedByValue})
		if err != nil {
			t.Fatal(err)
		}
		for _, ns := range nss.Items {
			requireNamespaceGone(t, e, ns.Name)
		}
	})
}

// runCheckCmd runs `watchsan check args...` and returns its stdout, failing the test unless
// it exits with code want.
func runCheckCmd(t *testing.T, want int, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, watchsanBin, append([]string{"check"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG=/nonexistent")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running watchsan check: %v", err)
	}
	t.Logf("watchsan check %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	if code != want {
		t.Fatalf("exit code %d, want %d", code, want)
	}
	return stdout.String()
}

func runCheckJSON(t *testing.T, want int, args ...string) check.Report {
	t.Helper()
	out := runCheckCmd(t, want, append(args, "--output=json")...)
	var rep check.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("decoding the JSON report: %v", err)
	}
	return rep
}

// requireNamespaceGone fails unless ns is gone or terminating (no namespace controller runs
// in the test cluster, so a deleted namespace stays terminating).
func requireNamespaceGone(t *testing.T, e *sanEnv, ns string) {
	t.Helper()
	got, err := e.admin.CoreV1().Namespaces().Get(ctxT(t, 30*time.Second), ns, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Fatalf("getting namespace %s: %v", ns, err)
	}
	if got.Status.Phase != corev1.NamespaceTerminating {
		t.Fatalf("namespace %s is %s, want it deleted", ns, got.Status.Phase)
	}
}
