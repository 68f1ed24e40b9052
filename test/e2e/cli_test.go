package e2e

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCommandLine runs the built binary as a new user would: every bad
// value once with a hint, did-you-mean, no upstream explained, help, version and completion.
func TestCommandLine(t *testing.T) {
	run := func(env []string, args ...string) (int, string, string) {
		cmd := exec.CommandContext(ctxT(t, 20*time.Second), watchsanBin, args...)
		cmd.Env = append(os.Environ(), env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
	}
	code, _, errOut := run(nil, "--dial-timeout", "5", "--listn", "127.0.0.1:1", "--upstream=https://127.0.0.1:1")
	want := "watchsan: invalid configuration:\n" +
		"  - --dial-timeout \"5\": not a duration: use one such as 5s, 500ms or 1m30s\n" +
		"  - unknown flag --listn; did you mean --listen?\n" +
		"Run 'watchsan --help' for the flags.\n"
	if code != 2 || errOut != want {
		t.Errorf("exit %d, stderr:\n%s\nwant exit 2 and:\n%s", code, errOut, want)
	}

	missing := filepath.Join(t.TempDir(), "no-kubeconfig")
	code, _, errOut = run([]string{"KUBECONFIG=" + missing, "KUBERNETES_SERVICE_HOST=", "KUBERNETES_SERVICE_PORT="}, "--listen=127.0.0.1:0", "--admin-listen=127.0.0.1:0")
	if code != 2 || !strings.Contains(errOut, "pass --upstream https://HOST:6443 or --kubeconfig FILE") || !strings.Contains(errOut, missing+" (not found)") ||
		strings.Contains(errOut, "KUBERNETES_MASTER") {
		t.Errorf("no upstream: exit %d, stderr:\n%s", code, errOut)
	}

	for _, args := range [][]string{{"--help"}, {"help"}, {"--version"}, {"version"}, {"completion", "bash"}, {"completion", "zsh"}} {
		code, out, errOut := run(nil, args...)
		if code != 0 || !strings.Contains(out, "watchsan") {
			t.Errorf("%q: exit %d, stdout %d bytes, stderr %q", args, code, len(out), errOut)
		}
	}
	if code, _, errOut := run(nil, "verison"); code != 2 || !strings.Contains(errOut, `did you mean "version"?`) {
		t.Errorf("verison: exit %d, stderr %q", code, errOut)
	}
	if code, out, errOut := run(nil, "completion", "tcsh"); code != 2 || out != "" || !strings.Contains(errOut, `completion "tcsh": not a shell`) {
		t.Errorf("completion tcsh: exit %d, stdout %d bytes, stderr %q", code, len(out), errOut)
	}
	if code, out, errOut := run(nil, "--fix-exempt-resource", "podz", "--upstream=https://127.0.0.1:1"); code != 2 || out != "" || !strings.Contains(errOut, "did you mean pods?") {
		t.Errorf("--fix-exempt-resource podz: exit %d, stderr %q", code, errOut)
	}
	// check: every flag problem at once, each named, before it reaches for a cluster.
	code, _, errOut = run(nil, "check", "--bookmark-wait=2s", "--idle-wait=-1s", "--kubeconfig=/nonexistent")
	want = "watchsan check: invalid flags:\n" +
		"  - --bookmark-wait 2s: want 0 (skip) or at least 5s\n" +
		"  - --idle-wait -1s: want 0 (skip) or positive\n" +
		"Run 'watchsan check --help' for the flags.\n"
	if code != 2 || errOut != want {
		t.Errorf("check with bad flags: exit %d, stderr:\n%s\nwant:\n%s", code, errOut, want)
	}
}
