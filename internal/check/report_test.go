package check

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

func affectedReport() Report {
	r := Report{
		Server:    "https://gw.example:443",
		Namespace: "watchsan-check-abcde",
		Version:   VersionResult{GitVersion: "v1.8.3", Known: true, Affected: true},
		Delete: DeleteResult{
			Events:     []Event{{"ADDED", "a", "10"}, {"ADDED", "other-1", "11"}, {"DELETED", "a", "10"}},
			DeletedRV:  "10",
			PreviousRV: "11",
			OutOfOrder: []Event{{"DELETED", "a", "10"}},
			Replayed:   []Event{{"ADDED", "other-1", "11"}, {"DELETED", "a", "10"}},
		},
		Bookmarks: BookmarkResult{Checked: true, WaitSeconds: 5, AtSeconds: []float64{}},
		IdleCut:   IdleResult{Checked: true, WaitSeconds: 5, Cut: true, CutAfterSeconds: 2, How: "the stream ended cleanly"},
		Cleanup:   CleanupResult{Deleted: true},
	}
	r.Version.Affected, r.Version.Known, r.Version.Detail = VersionAffected(r.Version.GitVersion)
	r.Delete.WentBackwards = true
	r.Problems = problems(&r)
	r.Affected = len(r.Problems) > 0
	return r
}

// Every problem a report shows is listed once, in plain words, and the text says each.
func TestReportProblemsAndText(t *testing.T) {
	r := affectedReport()
	if len(r.Problems) != 5 {
		t.Fatalf("problems %q, want version, backwards, replay, bookmarks, idle cut", r.Problems)
	}
	var b bytes.Buffer
	r.WriteText(&b)
	out := b.String()
	for _, want := range []string{
		"Version:    v1.8.3, in the affected range 1.8.0-1.8.7",
		"Delete:     BACKWARDS: the DELETED event carried resourceVersion 10, the event before it 11.",
		"Re-watch:   REPLAY: a watch from 10 delivered 2 events again: ADDED other-1@11, DELETED a@10",
		"Bookmarks:  NONE within 5s",
		"Idle watch: CUT after 2s (the stream ended cleanly).",
		"Result: AFFECTED, 5 problem(s):",
		"Cleanup: namespace watchsan-check-abcde deleted.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}

	clean := Report{Server: "s", Namespace: "n", Delete: DeleteResult{DeletedRV: "12", PreviousRV: "11"},
		Bookmarks: BookmarkResult{Checked: true, WaitSeconds: 70, AtSeconds: []float64{60.1, 68}}, Cleanup: CleanupResult{Deleted: true}}
	if p := problems(&clean); len(p) != 0 {
		t.Errorf("clean report has problems %q", p)
	}
	b.Reset()
	clean.WriteText(&b)
	if out := b.String(); !strings.Contains(out, "Bookmarks:  ok: 2 within 70s, at 60.1s, 68s after the watch started (the first periodic one after 60.1s;") ||
		!strings.Contains(out, "Result: no problem found.") || !strings.Contains(out, "Idle watch: not checked") {
		t.Errorf("clean text:\n%s", out)
	}
}

// The JSON field names are an interface: scripts read them.
func TestReportJSONFieldNames(t *testing.T) {
	r := affectedReport()
	var b bytes.Buffer
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"":          {"affected", "bookmarks", "cleanup", "delete", "idleCut", "namespace", "problems", "server", "version"},
		"version":   {"affected", "detail", "gitVersion", "known"},
		"delete":    {"deletedRV", "events", "outOfOrder", "previousRV", "replayed", "wentBackwards"},
		"bookmarks": {"atSeconds", "checked", "waitSeconds"},
		"idleCut":   {"checked", "cut", "cutAfterSeconds", "how", "waitSeconds"},
		"cleanup":   {"deleted"},
	}
	for obj, fields := range want {
		o := m
		if obj != "" {
			o = m[obj].(map[string]any)
		}
		var got []string
		for k := range o {
			got = append(got, k)
		}
		sort.Strings(got)
		if strings.Join(got, ",") != strings.Join(fields, ",") {
			t.Errorf("%q fields %v, want %v", obj, got, fields)
		}
	}
	ev := m["delete"].(map[string]any)["events"].([]any)[0].(map[string]any)
	if ev["type"] != "ADDED" || ev["name"] != "a" || ev["rv"] != "10" {
		t.Errorf("event %v", ev)
	}
}

func TestProgress(t *testing.T) {
	now := time.Unix(1000, 0)
	var plain bytes.Buffer
	p := NewProgress(&plain, false)
	p.Step("creating a temporary namespace")
	for i := 0; i <= 20; i++ {
		p.Waiting(now.Add(time.Duration(i)*time.Second), "waiting", time.Duration(i)*time.Second, 70*time.Second)
	}
	p.Done()
	want := "watchsan check: creating a temporary namespace\n" +
		"watchsan check: waiting: 0s of 70s\nwatchsan check: waiting: 10s of 70s\nwatchsan check: waiting: 20s of 70s\n"
	if plain.String() != want {
		t.Errorf("plain progress %q, want %q", plain.String(), want)
	}

	var tty bytes.Buffer
	p = NewProgress(&tty, true)
	p.Step("a")
	p.Waiting(now, "waiting", time.Second, 5*time.Second)
	p.Done()
	if got := tty.String(); got != "\r\033[Kwatchsan check: a\r\033[Kwatchsan check: waiting: 1s of 5s\r\033[K" {
		t.Errorf("tty progress %q", got)
	}
	var nilP *Progress
	nilP.Step("nothing")
	nilP.Done()
}

// `watchsan check` with no kubeconfig, or an empty one, printed client-go's
// "no configuration has been provided, try setting KUBERNETES_MASTER"; --help went to stderr
// (`| less` showed nothing), unwrapped.
func TestCheckHelpAndKubeconfigMessages(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no kubeconfig: pass --kubeconfig FILE"},
		{[]string{"--kubeconfig=" + empty}, "no cluster, user or context in it"},
	} {
		var stdout, stderr bytes.Buffer
		if code := Main(tc.args, &stdout, &stderr); code != ExitError || !strings.Contains(stderr.String(), tc.want) || strings.Contains(stderr.String(), "KUBERNETES_MASTER") {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, stderr.String(), ExitError, tc.want)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"--help"}, &stdout, &stderr); code != ExitClean || stderr.Len() != 0 || !strings.Contains(stdout.String(), "--bookmark-wait") {
		t.Fatalf("--help: exit %d, stdout %q, stderr %q; want the help on stdout", code, stdout.String(), stderr.String())
	}
	for _, line := range strings.Split(stdout.String(), "\n") {
		if len(line) > helpWidth {
			t.Errorf("help line of %d columns, over %d: %q", len(line), helpWidth, line)
		}
	}
	var again bytes.Buffer
	WriteHelp(&again)
	if again.String() != stdout.String() {
		t.Error("WriteHelp (watchsan help check) writes other help than --help")
	}
}

// Every flag problem at once, each naming its flag, before anything talks to a cluster.
func TestMainReportsEveryFlagError(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := Main([]string{"--bookmark-wait=2s", "--idle-wait=-1s", "--objects=500", "-o", "yaml", "--timout=1m", "--kubeconfig=/nonexistent"}, &stdout, &stderr)
	want := "watchsan check: invalid flags:\n" +
		"  - unknown flag --timout; did you mean --timeout?\n" +
		"  - --output \"yaml\": want text or json\n" +
		"  - --objects 500: want 1 to 100\n" +
		"  - --bookmark-wait 2s: want 0 (skip) or at least 5s\n" +
		"  - --idle-wait -1s: want 0 (skip) or positive\n" +
		"Run 'watchsan check --help' for the flags.\n"
	if code != ExitError || stderr.String() != want || stdout.Len() != 0 {
		t.Errorf("exit %d, stderr:\n%s\nwant:\n%s", code, stderr.String(), want)
	}
}

func TestMainUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--output=yaml"}, `--output "yaml": want text or json`},
		{[]string{"--bookmark-wait=2s"}, "--bookmark-wait 2s: want 0 (skip) or at least 5s"},
		{[]string{"--bookmark-wait=2"}, `--bookmark-wait "2": not a duration`},
		{[]string{"--objects=0"}, "--objects 0"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--no-such-flag"}, "unknown flag"},
		{[]string{"--kubeconfig=/nonexistent/kubeconfig"}, "--kubeconfig /nonexistent/kubeconfig: stat"},
	} {
		var stdout, stderr bytes.Buffer
		if code := Main(tc.args, &stdout, &stderr); code != ExitError {
			t.Errorf("%v: exit %d, want %d", tc.args, code, ExitError)
		}
		if !strings.Contains(stderr.String(), tc.want) || stdout.Len() != 0 {
			t.Errorf("%v: stderr %q lacks %q (stdout %q)", tc.args, stderr.String(), tc.want, stdout.String())
		}
	}
}
