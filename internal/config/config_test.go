package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/coalesce"
	"github.com/watchsan/watchsan/internal/watch"
)

func TestFlagsWinOverFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(f, []byte("listen: 127.0.0.1:7000\nupstream: [\"https://a:6443\", \"https://b:6443\"]\nfix-mode: observe\nwatch-stall-timeout: 2m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load([]string{"--config", f, "--listen=127.0.0.1:7001", "--upstream", "https://c:6443"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:7001" {
		t.Errorf("listen: %q, want the flag's", c.Listen)
	}
	if strings.Join(c.Upstreams, ",") != "https://c:6443" {
		t.Errorf("upstreams: %q, want only the flag's", c.Upstreams)
	}
	if c.FixMode != "observe" || c.WatchStallTimeout != 2*time.Minute {
		t.Errorf("file values lost: %+v", c)
	}
	if c.AdminListen != "127.0.0.1:9091" {
		t.Errorf("default lost: %q", c.AdminListen)
	}
}

func TestEveryProblemAtOnce(t *testing.T) {
	c, err := Load([]string{"--bogus", "--dial-timeout=abc", "--max-frame-size"})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"--bogus", "--dial-timeout", "--max-frame-size needs a value"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("load error %q lacks %q", err, want)
		}
	}
	c = Default()
	c.Listen = "nope"
	c.Upstreams = []string{"ftp://x", "https://"}
	c.FixMode = "sometimes"
	c.TLSCertFile = "only-cert"
	c.WatchResumeTimeout = 0
	c.WatchStallTimeout = 100 * time.Millisecond // every quiet watch would be resumed 10 times a second
	c.WatchWriteTimeout = -time.Second
	c.WatchMaxLifetime = 0 // a watch kept for ever
	c.LogFormat = "xml"
	err = c.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"--listen", "ftp://x", `"https://"`, "--fix-mode", "--tls-cert-file", "--watch-resume-timeout", "--watch-stall-timeout 100ms: use at least 1s", "--watch-write-timeout -1s: must be positive", "--watch-max-lifetime 0s: must be positive", "--log-format"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("validate error lacks %q:\n%s", want, err)
		}
	}
}

func TestFileUnknownKeyRejected(t *testing.T) {
	f := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(f, []byte("listn: x\n"), 0o600)
	if _, err := Load([]string{"--config=" + f}); err == nil || !strings.Contains(err.Error(), "listn") {
		t.Fatalf("got %v, want an error naming the unknown key", err)
	}
}

func TestLendingNeedsLoopback(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kc")
	os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600)
	for _, tc := range []struct {
		args    []string
		wantErr bool
		lend    bool
	}{
		{[]string{"--kubeconfig=" + kc}, false, true},
		{[]string{"--kubeconfig=" + kc, "--listen=0.0.0.0:8001"}, true, false},
		{[]string{"--kubeconfig=" + kc, "--listen=[::]:8001", "--allow-non-loopback-credentials"}, false, true},
		{[]string{"--kubeconfig=" + kc, "--listen=0.0.0.0:8001", "--no-credentials"}, false, false},
		{[]string{"--upstream=https://10.0.0.1:6443", "--listen=0.0.0.0:8001"}, false, false},
	} {
		c, err := Load(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		done, err := c.Complete()
		if (err != nil) != tc.wantErr {
			t.Fatalf("%v: err %v, want error %v", tc.args, err, tc.wantErr)
		}
		if err == nil && done.Lend != tc.lend {
			t.Fatalf("%v: lend %v, want %v", tc.args, done.Lend, tc.lend)
		}
		if err == nil && done.Upstreams[0].Host == "" {
			t.Fatalf("%v: no upstream", tc.args)
		}
	}
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1:1": true, "[::1]:1": true, "localhost:1": true, "127.9.9.9:1": true,
		"0.0.0.0:1": false, ":1": false, "10.0.0.1:1": false, "[::]:1": false} {
		if IsLoopback(addr) != want {
			t.Errorf("IsLoopback(%q) = %v", addr, !want)
		}
	}
}

// each bad value is reported once, with what to give instead; a refused value
// does not also come back from Validate as the zero value the parser left.
func TestBadValueReportedOnceWithHint(t *testing.T) {
	c, err := Load([]string{"--dial-timeout", "5", "--max-connections=many", "--watch-drain-rate=fast", "--enable-pprof=maybe"})
	if err == nil {
		t.Fatal("no error")
	}
	lines := strings.Split(err.Error(), "\n")
	want := []string{
		`--dial-timeout "5": not a duration: use one such as 5s, 500ms or 1m30s`,
		`--max-connections "many": not a whole number: use one such as 100`,
		`--watch-drain-rate "fast": not a number: use one such as 10 or 0.5`,
		`--enable-pprof "maybe": not a boolean: use true or false`,
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("errors:\n%s\nwant:\n%s", err, strings.Join(want, "\n"))
	}
	if verr := c.Validate(); verr != nil {
		t.Fatalf("Validate reports the refused values again: %v", verr)
	}
	var ve *ValueError
	if !errors.As(err, &ve) || ve.Err == nil {
		t.Fatalf("%v: no ValueError with the parser's error in the chain", err)
	}
}

// A mistyped flag gets a suggestion, and its value is not reported as a second problem.
func TestUnknownFlagDidYouMean(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listn", "127.0.0.1:1"}, "unknown flag --listn; did you mean --listen?"},
		{[]string{"--upstream-ca=ca.crt"}, "unknown flag --upstream-ca; did you mean --upstream-ca-file?"},
		{[]string{"-kubeconfig", "kc"}, "unknown flag -kubeconfig; did you mean --kubeconfig?"},
		{[]string{"--watch-stall-timout", "1m"}, "unknown flag --watch-stall-timout; did you mean --watch-stall-timeout?"},
		{[]string{"--zzzzzz", "x"}, "unknown flag --zzzzzz"},
		{[]string{"--enable-prof", "--listen=127.0.0.1:1"}, "unknown flag --enable-prof; did you mean --enable-pprof?"},
	} {
		_, err := Load(tc.args)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%q: got %v, want exactly %q", tc.args, err, tc.want)
		}
	}
	f := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(f, []byte("listn: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load([]string{"--config", f}); err == nil || !strings.Contains(err.Error(), `unknown key "listn"; did you mean "listen"?`) {
		t.Errorf("config file key: got %v", err)
	}
	if err := os.WriteFile(f, []byte("dial-timeout: 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := "--config " + f + `: line 1: key "dial-timeout": "5": not a duration: use one such as 5s, 500ms or 1m30s`
	if _, err := Load([]string{"--config", f}); err == nil || err.Error() != want {
		t.Errorf("config file value: got %v, want %s", err, want)
	}
}

// A value the file gave that Validate refuses names the file and the line, as a value that
// does not parse does; the same value given on the command line (which wins) names the flag.
func TestValidateNamesTheFileAndLine(t *testing.T) {
	f := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(f, []byte("# watchsan\nmax-frame-size: 5\nwatch-stall-timeout: 100ms\nlog-format: xml\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load([]string{"--config", f, "--watch-stall-timeout=200ms"})
	if err != nil {
		t.Fatal(err)
	}
	got := c.Validate()
	for _, want := range []string{
		"--config " + f + ": line 2: --max-frame-size 5: want 1024 to 1073741824 bytes",
		"--config " + f + ": line 4: --log-format \"xml\"",
		"\n--watch-stall-timeout 200ms: use at least 1s",
	} {
		if got == nil || !strings.Contains("\n"+got.Error(), want) {
			t.Errorf("Validate: %v\nlacks %q", got, want)
		}
	}
}

// -v / --v follow klog: higher is more verbose; 0 is info, 1 or more debug; the later of -v
// and --log-level wins.
func TestVerbosityMapsOntoLogLevel(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "info"},
		{[]string{"-v", "2"}, "debug"},
		{[]string{"-v2"}, "debug"},
		{[]string{"--v=1"}, "debug"},
		{[]string{"-v=0"}, "info"},
		{[]string{"--log-level=warn", "-v", "1"}, "debug"},
		{[]string{"-v", "1", "--log-level=error"}, "error"},
		// -v alone said "flag --v needs a value".
		{[]string{"-v"}, "debug"},
		{[]string{"-v", "--listen=127.0.0.1:1"}, "debug"},
		{[]string{"--v"}, "debug"},
	} {
		c, err := Load(tc.args)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if c.LogLevel != tc.want {
			t.Errorf("%q: log level %q, want %q", tc.args, c.LogLevel, tc.want)
		}
	}
	if _, err := Load([]string{"-v", "-1"}); err == nil || !strings.Contains(err.Error(), "want 0 (info) or more (debug)") {
		t.Errorf("-v -1: got %v", err)
	}
}

// With no --upstream and no kubeconfig, the error says where watchsan looked and what to pass,
// not client-go's hint about KUBERNETES_MASTER.
func TestMissingUpstreamSaysWhereItLooked(t *testing.T) {
	// an empty --kubeconfig file got client-go's "no configuration has been provided,
	// try setting KUBERNETES_MASTER environment variable".
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c := Default()
	c.Kubeconfig = empty
	if _, err := c.Complete(); err == nil || strings.Contains(err.Error(), "KUBERNETES_MASTER") || !strings.Contains(err.Error(), "--kubeconfig "+empty+": no cluster, user or context in it") {
		t.Errorf("an empty --kubeconfig: %v", err)
	}
	missing := filepath.Join(t.TempDir(), "nope")
	t.Setenv("KUBECONFIG", missing)
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	c, err := Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Complete()
	if err == nil {
		t.Fatal("no error")
	}
	want := "no upstream: pass --upstream https://HOST:6443 or --kubeconfig FILE; watchsan looked for a kubeconfig in $KUBECONFIG, " +
		missing + " (not found), the in-cluster service account (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT unset: not in a pod)"
	if err.Error() != want {
		t.Fatalf("got  %v\nwant %s", err, want)
	}
}

// --fix-exempt-resource: every kubectl spelling is accepted and completed to the form requests
// are matched in; garbage is refused with a hint.
func TestFixExemptResourceSpellings(t *testing.T) {
	c, err := Load([]string{"--upstream=https://a:6443", "--fix-exempt-resource=Pods", "--fix-exempt-resource", "deployments.apps",
		"--fix-exempt-resource=deployments.v1.apps", "--fix-exempt-resource=widgets/scale"})
	if err != nil {
		t.Fatal(err)
	}
	done, err := c.Complete()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(done.FixExemptResources, ","); got != "pods,apps/deployments,apps/deployments,widgets/scale" {
		t.Errorf("completed %q", got)
	}
	if w := strings.Join(done.Warnings, "\n"); !strings.Contains(w, `"widgets/scale"`) || !strings.Contains(w, "subresource") {
		t.Errorf("no warning about a probable subresource: %q", done.Warnings)
	}
	c.FixExemptResources = []string{"apps/deployments/scale"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--fix-exempt-resource \"apps/deployments/scale\": want a resource") {
		t.Errorf("got %v", err)
	}
	// A name no Kubernetes serves in a group no CRD can add to is a typo: refused, with the
	// nearest name. Any other group's resource may be a CRD's and passes.
	c.FixExemptResources = []string{"podz", "deployment.apps", "widgets.example.com", "leases.coordination.k8s.io"}
	c.ShareExcludeResources = []string{"secret"}
	err = c.Validate()
	for _, want := range []string{
		`--fix-exempt-resource "podz": "podz" is not a resource of the core API group; did you mean pods?`,
		`--fix-exempt-resource "deployment.apps": "deployment" is not a resource of the API group apps; did you mean deployments.apps?`,
		`--share-exclude-resource "secret": "secret" is not a resource of the core API group; did you mean secrets?`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v\nlacks %q", err, want)
		}
	}
	if err != nil && (strings.Contains(err.Error(), "widgets") || strings.Contains(err.Error(), "leases")) {
		t.Errorf("a group's resource that may be a CRD's was refused: %v", err)
	}
}

// TestAttackFileMeansWhatItSays: a two-item YAML list for reject-paths kept
// only its last item (exec answered 200 with the lent identity); garbage and duplicate keys
// were read without a word. A list for a comma-separated flag is now joined; any other list,
// a mapping, duplicate keys or a file that is not a YAML mapping is a problem naming the key.
func TestAttackFileMeansWhatItSays(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		f := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	c, err := Load([]string{"--config", write("reject-paths:\n  - ^/api/.*/pods/.*/exec\n  - ^/api/.*/pods/.*/attach\naccept-hosts: [^localhost$, ^example\\.test$]\nupstream:\n  - https://a:6443\n  - https://b:6443\n")})
	if err != nil {
		t.Fatal(err)
	}
	if c.RejectPaths != "^/api/.*/pods/.*/exec,^/api/.*/pods/.*/attach" || c.AcceptHosts != `^localhost$,^example\.test$` || len(c.Upstreams) != 2 {
		t.Fatalf("lists read as reject-paths %q, accept-hosts %q, upstreams %q", c.RejectPaths, c.AcceptHosts, c.Upstreams)
	}
	g := c.completeGuard(true)
	if !MatchAny(g.RejectPaths, "/api/v1/namespaces/d/pods/p/exec") || !MatchAny(g.RejectPaths, "/api/v1/namespaces/d/pods/p/attach") {
		t.Fatal("a reject-paths list does not reject both of its paths")
	}
	for _, tc := range []struct{ file, want string }{
		{"listen: [127.0.0.1:1, 127.0.0.1:2]\n", `key "listen": line 1: a list, but --listen takes one value`},
		{"reject-paths: [a, 'b,c']\n", `list item "b,c" has a comma`},
		{"listen: {host: x}\n", `key "listen": line 1: a mapping, but --listen takes a value`},
		{"listen: 127.0.0.1:1\nfix-mode: observe\nlisten: 127.0.0.1:2\n", `key "listen" given twice (lines 1 and 3)`},
		{"\x7fELF\x02\x01\x01\x00garbage", "not YAML"},
		{"#!/bin/sh\nexec watchsan\n", "not a mapping of flag names to values"},
		{"- listen\n- x\n", "not a mapping"},
		{"null-but-not: [\n", "not YAML"},
	} {
		_, err := Load([]string{"--config", write(tc.file)})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error containing %q", tc.file, err, tc.want)
		}
	}
	for _, empty := range []string{"", "# nothing set yet\n", "---\n", "~\n"} {
		if c, err := Load([]string{"--config", write(empty)}); err != nil || c.RejectPaths != DefaultRejectPaths {
			t.Errorf("%q: %v, reject-paths %q: an empty file sets nothing", empty, err, c.RejectPaths)
		}
	}
}

// The sharing flags: on by default, --share-watches=false turns it off, bounds checked, and a subscriber's buffer holds at least
// one event of the largest size.
func TestShareFlags(t *testing.T) {
	c, err := Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !c.ShareWatches {
		t.Error("--share-watches off by default")
	}
	if c, err := Load([]string{"--share-watches=false"}); err != nil || c.ShareWatches {
		t.Errorf("--share-watches=false: sharing %v, err %v", c.ShareWatches, err)
	}
	c, err = Load([]string{"--share-watches", "--share-ring-events=0", "--share-subscriber-buffer-bytes=1024", "--memory-budget-bytes=1000"})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Validate()
	for _, want := range []string{"--share-ring-events 0", "--share-subscriber-buffer-bytes 1024: want at least --max-frame-size", "--memory-budget-bytes 1000: want 0"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validate error %v lacks %q", err, want)
		}
	}
}

// --share-exclude-resource is parsed and validated as --fix-exempt-resource is, and
// --share-max-feeds is bounded (0 is refused: --share-watches=false turns sharing off); every
// bad value is reported by one Validate.
func TestShareExcludeAndMaxFeeds(t *testing.T) {
	c, err := Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.ShareMaxFeeds != watch.DefaultShareMaxFeeds || len(c.ShareExcludeResources) != 0 {
		t.Errorf("defaults: --share-max-feeds %d, --share-exclude-resource %q", c.ShareMaxFeeds, c.ShareExcludeResources)
	}
	c, err = Load([]string{"--upstream=https://a:6443", "--share-watches", "--share-exclude-resource=Secrets",
		"--share-exclude-resource", "leases.coordination.k8s.io", "--share-exclude-resource=widgets/scale", "--share-max-feeds=3"})
	if err != nil {
		t.Fatal(err)
	}
	done, err := c.Complete()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(done.ShareExcludeResources, ","); got != "secrets,coordination.k8s.io/leases,widgets/scale" || done.ShareMaxFeeds != 3 {
		t.Errorf("completed %q, max feeds %d", got, done.ShareMaxFeeds)
	}
	if w := strings.Join(done.Warnings, "\n"); !strings.Contains(w, `--share-exclude-resource "widgets/scale"`) || !strings.Contains(w, "exclude its resource instead") {
		t.Errorf("no warning about a probable subresource: %q", done.Warnings)
	}
	for _, max := range []string{"0", "-1", "1000001"} {
		c, err = Load([]string{"--share-watches", "--share-exclude-resource=apps/deployments/scale", "--share-exclude-resource=",
			"--fix-exempt-resource=a/b/c/d", "--share-max-feeds=" + max})
		if err != nil {
			t.Fatal(err)
		}
		err = c.Validate()
		for _, want := range []string{`--share-exclude-resource "apps/deployments/scale": want a resource`, `--share-exclude-resource "":`,
			`--fix-exempt-resource "a/b/c/d"`, "--share-max-feeds " + max + ": want 1 to 1000000"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("--share-max-feeds=%s: validate error %v lacks %q", max, err, want)
			}
		}
	}
}

// The --coalesce-* bounds have their defaults, and every bad one is reported by one Validate;
// --coalesce-reads=false turns coalescing off.
func TestCoalesceFlags(t *testing.T) {
	c, err := Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !c.CoalesceReads || c.CoalesceMaxMembers != coalesce.DefaultMaxMembers || c.CoalesceMaxGroups != coalesce.DefaultMaxGroups ||
		c.CoalesceLagBytes != coalesce.DefaultLagBytes || c.CoalesceTotalBytes != coalesce.DefaultTotalBytes {
		t.Errorf("defaults: %v %d %d %d %d", c.CoalesceReads, c.CoalesceMaxMembers, c.CoalesceMaxGroups, c.CoalesceLagBytes, c.CoalesceTotalBytes)
	}
	if c, err = Load([]string{"--coalesce-reads=false"}); err != nil || c.CoalesceReads {
		t.Errorf("--coalesce-reads=false: %v, on %v", err, c.CoalesceReads)
	}
	c, err = Load([]string{"--coalesce-max-members=0", "--coalesce-max-groups=1000001", "--coalesce-lag-bytes=1000", "--coalesce-total-bytes=999"})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Validate()
	for _, want := range []string{"--coalesce-max-members 0: want 1 to 1000000", "--coalesce-max-groups 1000001: want 1 to 1000000",
		"--coalesce-lag-bytes 1000: want 65536", "--coalesce-total-bytes 999: want --coalesce-lag-bytes (1000)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validate error %v lacks %q", err, want)
		}
	}
}

func TestReplicaFlags(t *testing.T) {
	c, err := Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Shedding() || c.ConnectionShedRate != DefaultConnectionShedRate {
		t.Errorf("defaults: shedding %v, rate %v", c.Shedding(), c.ConnectionShedRate)
	}
	c, err = Load([]string{"--frontend-replicas=3", "--frontend-expected-connections=300"})
	if err != nil || !c.Shedding() {
		t.Fatalf("replicas and expected connections: %v, shedding %v", err, c.Shedding())
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--frontend-replicas=3"}, "--frontend-replicas 3 needs --frontend-expected-connections"},
		{[]string{"--frontend-expected-connections=30"}, "--frontend-expected-connections 30 needs --frontend-replicas"},
		{[]string{"--frontend-replicas=-1"}, "--frontend-replicas -1: want 0 (no shedding) to 10000"},
		{[]string{"--connection-shed-rate=0"}, "--connection-shed-rate 0: want more than 0 and at most 100 a second"},
		{[]string{"--connection-shed-rate=NaN"}, "--connection-shed-rate NaN: want more than 0"},
	} {
		c, err := Load(bad.args)
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: error %v lacks %q", bad.args, err, bad.want)
		}
	}
}
