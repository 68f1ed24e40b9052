package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAdminAuthNeedsAnIdentity: off loopback the admin listener's authentication is on unless
// --admin-auth=none, and watchsan must have an identity to ask the apiserver with: the token of
// --admin-auth-token-file, or the lent one. Without either it refuses to start, saying why it
// has none and each fix; on loopback nothing is checked and nothing is needed.
func TestAdminAuthNeedsAnIdentity(t *testing.T) {
	dir := t.TempDir()
	kc := writeKubeconfig(t, "https://127.0.0.1:6443", "")
	noUserKC := filepath.Join(dir, "nouser")
	if err := os.WriteFile(noUserKC, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("reviewer-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	crt, key := testKeyPair(t, dir, "serving")
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, testCA(t), 0o600); err != nil {
		t.Fatal(err)
	}
	frontend := []string{"--no-credentials", "--upstream=https://10.0.0.1:6443"}
	with := func(base []string, a ...string) []string { return append(append([]string(nil), base...), a...) }
	fixes := []string{"--admin-auth-token-file=FILE", "--admin-listen=127.0.0.1:PORT", "--admin-auth=none", "create tokenreviews and subjectaccessreviews"}
	for _, tc := range []struct {
		name      string
		args      []string
		wantErr   string // "" for none
		on        bool
		tokenFile string
	}{
		{"frontend, admin on every address", with(frontend, "--admin-listen=0.0.0.0:9091"), "(--no-credentials: it lends no identity)", false, ""},
		{"frontend, admin on a pod IP", with(frontend, "--admin-listen=10.1.2.3:9091"), "--admin-listen 10.1.2.3:9091 is not a loopback address", false, ""},
		{"frontend, admin on every IPv6 address", with(frontend, "--admin-listen=[::]:9091"), "--no-credentials", false, ""},
		{"frontend, admin with no host", with(frontend, "--admin-listen=:9091"), "--no-credentials", false, ""},
		{"frontend with a review token", with(frontend, "--admin-listen=0.0.0.0:9091", "--admin-auth-token-file="+tokenFile), "", true, tokenFile},
		{"frontend, opted out", with(frontend, "--admin-listen=0.0.0.0:9091", "--admin-auth=none"), "", false, ""},
		{"frontend, admin on loopback", with(frontend, "--admin-listen=127.0.0.1:9091"), "", false, ""},
		{"frontend, admin on localhost", with(frontend, "--admin-listen=localhost:9091"), "", false, ""},
		{"frontend, admin on IPv6 loopback", with(frontend, "--admin-listen=[::1]:9091"), "", false, ""},
		{"sidecar lending its identity", []string{"--kubeconfig=" + kc, "--admin-listen=0.0.0.0:9091"}, "", true, ""},
		{"sidecar with a review token of its own", []string{"--kubeconfig=" + kc, "--admin-listen=0.0.0.0:9091", "--admin-auth-token-file=" + tokenFile}, "", true, tokenFile},
		{"a kubeconfig without credentials", []string{"--kubeconfig=" + noUserKC, "--admin-listen=0.0.0.0:9091"}, "(the kubeconfig's user has no credentials)", false, ""},
		{"identity forwarding lends nothing", []string{"--kubeconfig=" + kc, "--listen=0.0.0.0:6443", "--tls-cert-file=" + crt, "--tls-private-key-file=" + key,
			"--client-ca-file=" + ca, "--identity-forwarding=impersonate", "--admin-listen=0.0.0.0:9091"}, "(--identity-forwarding: it lends no identity)", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done, err := complete(t, tc.args...)
			requireOutcome(t, err, tc.wantErr, "an admin listener off loopback whose every review would be anonymous (and refused), or /debug/feeds open to anyone")
			if err != nil {
				for _, f := range fixes {
					if !strings.Contains(err.Error(), f) {
						t.Errorf("the error does not name the fix %q: %v", f, err)
					}
				}
				return
			}
			if done.AdminAuth.On != tc.on || done.AdminAuth.TokenFile != tc.tokenFile {
				t.Fatalf("admin auth %+v, want on %v with token file %q", done.AdminAuth, tc.on, tc.tokenFile)
			}
			if tc.on && (done.AdminAuth.Verb != "get" || done.AdminAuth.Path != "" || done.AdminAuth.Metrics) {
				t.Errorf("admin auth %+v: the defaults are verb get, the request's own path, /metrics open", done.AdminAuth)
			}
		})
	}
}

// TestAdminAuthFlags: the flags' values are checked on their own, every problem at once; the
// opt-out is warned about where it opens something, and flags that do nothing on loopback are
// said to do nothing.
func TestAdminAuthFlags(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	twoWords := filepath.Join(dir, "two")
	if err := os.WriteFile(twoWords, []byte("a b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load([]string{"--no-credentials", "--upstream=https://10.0.0.1:6443", "--admin-auth=off", "--admin-auth-verb=GET",
		"--admin-auth-path=debug/feeds", "--admin-auth-token-file=" + filepath.Join(dir, "missing")})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Validate()
	for _, want := range []string{`--admin-auth "off": want delegated or none`, `--admin-auth-verb "GET"`, `--admin-auth-path "debug/feeds"`, "--admin-auth-token-file: open " + filepath.Join(dir, "missing")} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validation error %v lacks %q", err, want)
		}
	}
	for _, f := range []string{empty, twoWords} {
		c, err := Load([]string{"--no-credentials", "--upstream=https://10.0.0.1:6443", "--admin-auth-token-file=" + f})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--admin-auth-token-file: "+f) {
			t.Errorf("token file %s: %v, want it refused", f, err)
		}
	}

	warned := func(t *testing.T, args []string, want string) {
		t.Helper()
		done, err := complete(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.Join(done.Warnings, "\n"), want) {
			t.Errorf("warnings %q lack %q", done.Warnings, want)
		}
	}
	frontend := []string{"--no-credentials", "--upstream=https://10.0.0.1:6443"}
	warned(t, append(frontend, "--admin-listen=0.0.0.0:9091", "--admin-auth=none", "--enable-pprof"), "--admin-auth=none on --admin-listen 0.0.0.0:9091, which is not a loopback address: anyone who reaches it reads /metrics")
	warned(t, append(frontend, "--admin-listen=0.0.0.0:9091", "--admin-auth=none", "--enable-pprof"), "and pprof")
	warned(t, append(frontend, "--admin-listen=127.0.0.1:9091", "--admin-auth-metrics"), "the --admin-auth-* flags have no effect")
	done, err := complete(t, append(frontend, "--admin-listen=127.0.0.1:9091", "--admin-auth-metrics")...)
	if err != nil {
		t.Fatal(err)
	}
	if done.AdminAuth != (AdminAuth{}) {
		t.Errorf("on loopback the admin auth is %+v, want none", done.AdminAuth)
	}
	tok := filepath.Join(dir, "tok")
	if err := os.WriteFile(tok, []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	done, err = complete(t, append(frontend, "--admin-listen=0.0.0.0:9091", "--admin-auth-token-file="+tok, "--admin-auth-metrics", "--admin-auth-path=/watchsan/a", "--admin-auth-verb=read")...)
	if err != nil {
		t.Fatal(err)
	}
	if want := (AdminAuth{On: true, Metrics: true, Path: "/watchsan/a", Verb: "read", TokenFile: tok}); done.AdminAuth != want {
		t.Errorf("admin auth %+v, want %+v", done.AdminAuth, want)
	}
	if w := strings.Join(done.Warnings, "\n"); strings.Contains(w, "admin") {
		t.Errorf("a checked admin listener, /metrics included, warned: %s", w)
	}
}
