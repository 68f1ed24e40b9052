package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	c.LogFormat = "xml"
	err = c.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"--listen", "ftp://x", `"https://"`, "--fix-mode", "--tls-cert-file", "--watch-resume-timeout", "--log-format"} {
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
