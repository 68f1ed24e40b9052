package cli

import (
	"bytes"
	"strings"
	"testing"
)

func run(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = Main(args, &o, &e)
	return code, o.String(), e.String()
}

// help, version and completion the way kubectl has them.
func TestHelpVersionCompletion(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		code, out, _ := run(args...)
		if code != exitOK {
			t.Fatalf("%q: exit %d", args, code)
		}
		for _, want := range []string{"Usage:\n  watchsan [flags]", "Configuration flags:\n      --config string", "Logging flags:",
			"  -v, --v int", "      --dial-timeout duration", "General flags:\n  -h, --help", "completion", "version"} {
			if !strings.Contains(out, want) {
				t.Errorf("%q: help lacks %q:\n%s", args, want, out)
			}
		}
		if strings.Index(out, "Configuration flags:") > strings.Index(out, "Logging flags:") {
			t.Errorf("%q: groups not in registration order", args)
		}
	}
	// --help is a page: one line per flag, two where the default does not fit; every flag in
	// full is `watchsan flags` (and docs/flags.md).
	_, help, _ := run("--help")
	if n := strings.Count(help, "\n"); n > 230 {
		t.Errorf("--help is %d lines, want at most 230", n)
	}
	for _, block := range strings.Split(help, "\n      --")[1:] {
		if lines := strings.Count(strings.TrimRight(strings.SplitN(block, "\n\n", 2)[0], "\n"), "\n") + 1; lines > 3 {
			t.Errorf("--help gives --%s %d lines", strings.Fields(block)[0], lines)
		}
	}
	if !strings.Contains(help, "serve identical watches from one upstream") || strings.Contains(help, "SelfSubjectAccessReview") {
		t.Errorf("--share-watches in --help is not its short description:\n%s", help)
	}
	if code, full, _ := run("flags"); code != exitOK || !strings.Contains(full, "SelfSubjectAccessReview with their credentials") {
		t.Errorf("watchsan flags: exit %d, lacks --share-watches in full", code)
	}
	for _, args := range [][]string{{"--version"}, {"version"}, {"--listen=x", "--version"}} {
		if code, out, _ := run(args...); code != exitOK || !strings.HasPrefix(out, "watchsan ") {
			t.Errorf("%q: exit %d, output %q", args, code, out)
		}
	}
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		if code, out, errOut := run("completion", shell); code != exitOK || !strings.Contains(out, "watchsan") {
			t.Errorf("completion %s: exit %d, %d bytes, stderr %q", shell, code, len(out), errOut)
		}
	}
	// A shell without a script, or none, is a usage error, not help and exit 0.
	for _, args := range [][]string{{"completion", "tcsh"}, {"completion"}} {
		if code, out, errOut := run(args...); code != exitUsage || out != "" || !strings.Contains(errOut, "bash, zsh, fish, powershell") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	// What the shell scripts ask: flag names, and the values of an enumerated flag.
	if _, out, _ := run("__complete", "--log-f"); !strings.Contains(out, "--log-format") {
		t.Errorf("flag name completion: %q", out)
	}
	if _, out, _ := run("__complete", "--fix-mode", ""); !strings.Contains(out, "repair\nobserve\n") {
		t.Errorf("flag value completion: %q", out)
	}
}

// Bad flags: every problem, each once, exit code 2; an unknown command gets a suggestion.
func TestUsageErrors(t *testing.T) {
	code, _, errOut := run("--dial-timeout", "5", "--listn", "127.0.0.1:1", "--fix-mode=sometimes")
	if code != exitUsage {
		t.Fatalf("exit %d, want %d", code, exitUsage)
	}
	want := "watchsan: invalid configuration:\n" +
		"  - --dial-timeout \"5\": not a duration: use one such as 5s, 500ms or 1m30s\n" +
		"  - unknown flag --listn; did you mean --listen?\n" +
		"  - --fix-mode \"sometimes\": want repair or observe\n" +
		"Run 'watchsan --help' for the flags.\n"
	if errOut != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", errOut, want)
	}
	if code, _, errOut := run("verison"); code != exitUsage || !strings.Contains(errOut, `unknown command "verison"; did you mean "version"?`) {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := run("version", "--bogus"); code != exitUsage || !strings.Contains(errOut, "unknown flag: --bogus") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := run("demo"); code != exitUsage || !strings.Contains(errOut, "watchsan-demo") {
		t.Errorf("demo: exit %d, stderr %q", code, errOut)
	}
}

// `watchsan help check` printed cobra's stub (only -h) while `watchsan check
// --help` printed the real help, on stderr. Both print the real help, on stdout.
func TestHelpCheck(t *testing.T) {
	code, help, errOut := run("help", "check")
	if code != exitOK || errOut != "" || !strings.Contains(help, "--bookmark-wait") || !strings.Contains(help, "Exit codes:") {
		t.Fatalf("help check: exit %d, stdout %q, stderr %q", code, help, errOut)
	}
	code, flagHelp, errOut := run("check", "--help")
	if code != exitOK || errOut != "" || flagHelp != help {
		t.Fatalf("check --help: exit %d, stderr %q, stdout differs from help check:\n%s", code, errOut, flagHelp)
	}
}
