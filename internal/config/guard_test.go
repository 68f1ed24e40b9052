package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeKubeconfig writes a kubeconfig naming server, with a token, and extra cluster fields.
func writeKubeconfig(t *testing.T, server, extraCluster string) string {
	t.Helper()
	kc := filepath.Join(t.TempDir(), "kc")
	if err := os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q%s}}]
users: [{name: u, user: {token: secret-token-value}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, server, extraCluster)), 0o600); err != nil {
		t.Fatal(err)
	}
	return kc
}

func complete(t *testing.T, args ...string) (*Completed, error) {
	t.Helper()
	c, err := Load(args)
	if err != nil {
		t.Fatal(err)
	}
	return c.Complete()
}

// requireOutcome fails the test unless err is nil when wantErr is empty, or contains wantErr;
// accepted says what it means that a configuration that should be refused was accepted.
func requireOutcome(t *testing.T, err error, wantErr, accepted string) {
	t.Helper()
	switch {
	case wantErr == "" && err != nil:
		t.Fatalf("refused: %v", err)
	case wantErr != "" && err == nil:
		t.Fatal("accepted: " + accepted)
	case wantErr != "" && !strings.Contains(err.Error(), wantErr):
		t.Fatalf("error %q lacks %q", err, wantErr)
	}
}

// TestAttackCredentialsToAnotherUpstream: the lent identity goes only to the server the
// kubeconfig names, over TLS, unless --allow-credentials-to-upstream names the exception.
func TestAttackCredentialsToAnotherUpstream(t *testing.T) {
	kc := writeKubeconfig(t, "https://api.example:18443", "")
	plainKC := writeKubeconfig(t, "http://127.0.0.1:18080", "")
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string // "" for none
	}{
		{"kubeconfig's own server", []string{"--kubeconfig=" + kc}, ""},
		{"the same server spelled with the default port", []string{"--kubeconfig=" + kc, "--upstream=https://API.example:18443/"}, ""},
		{"plain-HTTP upstream", []string{"--kubeconfig=" + kc, "--upstream=http://127.0.0.1:18080"}, "cleartext; use https, pass --no-credentials, or accept this with --allow-credentials-to-upstream=http://127.0.0.1:18080"},
		// clientcmd itself loads no credentials for an http:// server: nothing to lend.
		{"plain-HTTP kubeconfig server", []string{"--kubeconfig=" + plainKC}, ""},
		{"another server", []string{"--kubeconfig=" + kc, "--upstream=https://10.0.0.1:6443"}, "not the kubeconfig's server"},
		{"one of two is another", []string{"--kubeconfig=" + kc, "--upstream=https://api.example:18443", "--upstream=https://other:18443"}, "https://other:18443"},
		{"another server, allowed", []string{"--kubeconfig=" + kc, "--upstream=https://10.0.0.1:6443", "--allow-credentials-to-upstream=https://10.0.0.1:6443"}, ""},
		{"plain HTTP, allowed", []string{"--kubeconfig=" + kc, "--upstream=http://127.0.0.1:18080", "--allow-credentials-to-upstream=http://127.0.0.1:18080"}, ""},
		{"an allowance naming no upstream", []string{"--kubeconfig=" + kc, "--allow-credentials-to-upstream=https://typo:6443"}, "names no upstream"},
		{"not lending", []string{"--kubeconfig=" + kc, "--upstream=http://127.0.0.1:18080", "--no-credentials"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := complete(t, tc.args...)
			requireOutcome(t, err, tc.wantErr, "the lent identity would go where it does not belong")
			if err != nil && strings.Contains(err.Error(), "secret-token-value") {
				t.Fatal("the token is in the error")
			}
		})
	}
}

// TestGuardWarnings: what is allowed but unsafe is said at start.
func TestGuardWarnings(t *testing.T) {
	insecureKC := writeKubeconfig(t, "https://127.0.0.1:6443", ", insecure-skip-tls-verify: true")
	kc := writeKubeconfig(t, "https://127.0.0.1:6443", "")
	ca := filepath.Join(t.TempDir(), "ca.crt")
	os.WriteFile(ca, testCA(t), 0o600)
	for _, tc := range []struct {
		args []string
		want string // "" for no warning
	}{
		{[]string{"--kubeconfig=" + kc}, ""},
		{[]string{"--kubeconfig=" + insecureKC}, "kubeconfig sets insecure-skip-tls-verify"},
		{[]string{"--kubeconfig=" + insecureKC, "--upstream-ca-file=" + ca}, ""},
		{[]string{"--kubeconfig=" + kc, "--insecure-skip-tls-verify"}, "--insecure-skip-tls-verify"},
		{[]string{"--kubeconfig=" + kc, "--admin-listen=0.0.0.0:9091", "--enable-pprof", "--admin-auth=none"}, "pprof (the command line, goroutine stacks"},
		{[]string{"--kubeconfig=" + kc, "--admin-listen=0.0.0.0:9091", "--admin-auth-metrics"}, ""},
		{[]string{"--kubeconfig=" + kc, "--admin-listen=0.0.0.0:9091"}, "/metrics"},
		{[]string{"--kubeconfig=" + kc, "--listen=[::1]:8001"}, ""},
		{[]string{"--kubeconfig=" + kc, "--listen=127.0.0.2:8001", "--allow-non-loopback-credentials"}, "add it to --accept-hosts"},
		{[]string{"--kubeconfig=" + kc, "--max-connections=5000"}, "lowered"},
	} {
		done, err := complete(t, tc.args...)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		got := strings.Join(done.Warnings, "\n")
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%v: warnings %q, want one containing %q", tc.args, got, tc.want)
		}
	}
}

// Every test sees the same limits, whatever the machine's.
func init() {
	openFileLimit = func() uint64 { return 4096 }
	memoryLimit = func() int64 { return 0 }
}

// The rings' total: as configured, else a quarter of the memory limit, else the fixed default;
// a configured total above half the limit is kept, with a warning.
func TestFitRingTotal(t *testing.T) {
	for _, tc := range []struct {
		configured, memLimit, want int64
		warn                       bool
	}{
		{0, 0, 32 << 20, false},          // no limit known: the fixed default
		{0, 256 << 20, 64 << 20, false},  // the sidecar's 256 Mi
		{0, 1 << 30, 256 << 20, false},   // HA's 1 Gi
		{0, 2 << 20, 1 << 20, false},     // absurdly low: still a ring's worth of something
		{100 << 20, 0, 100 << 20, false}, // configured
		{100 << 20, 1 << 30, 100 << 20, false},
		{200 << 20, 256 << 20, 200 << 20, true}, // more than half the limit
	} {
		got, w := FitRingTotal(tc.configured, tc.memLimit)
		if got != tc.want || (w != "") != tc.warn {
			t.Errorf("FitRingTotal(%d, %d) = %d, %q; want %d, warning %v", tc.configured, tc.memLimit, got, w, tc.want, tc.warn)
		}
	}
}

func TestFitMemoryBudget(t *testing.T) {
	for _, tc := range []struct {
		configured, memLimit, want int64
		warn                       bool
	}{
		{0, 0, 64 << 20, false},                 // no limit known: the fixed default
		{0, 256 << 20, 128 << 20, false},        // the sidecar's 256 Mi
		{0, 1 << 30, 512 << 20, false},          // HA's 1 Gi
		{0, 8 << 20, 16 << 20, false},           // absurdly low: the least a budget is
		{100 << 20, 0, 100 << 20, false},        // configured
		{200 << 20, 256 << 20, 200 << 20, true}, // more than three quarters of the limit
	} {
		got, w := FitMemoryBudget(tc.configured, tc.memLimit)
		if got != tc.want || (w != "") != tc.warn {
			t.Errorf("FitMemoryBudget(%d, %d) = %d, %q; want %d, warning %v", tc.configured, tc.memLimit, got, w, tc.want, tc.warn)
		}
	}
}

func TestFitConnections(t *testing.T) {
	for _, tc := range []struct {
		configured int
		nofile     uint64
		want       int
		warn       bool
	}{
		{1000, 0, 1000, false},         // unknown limit: as configured
		{1000, 1048576, 1000, false},   // a container's usual limit
		{1000, 1024, 448, true},        // the machine: half of what is left after the reserve
		{100, 1024, 100, false},        // fits
		{1000, 100, 16, true},          // absurdly low: still serve a few
		{1000, 1<<63 + 5, 1000, false}, // RLIM_INFINITY
	} {
		got, w := FitConnections(tc.configured, tc.nofile)
		if got != tc.want || (w != "") != tc.warn {
			t.Errorf("FitConnections(%d, %d) = %d, %q; want %d, warning %v", tc.configured, tc.nofile, got, w, tc.want, tc.warn)
		}
	}
}

func TestGuardFlags(t *testing.T) {
	c := Default()
	c.AcceptHosts = `^ok$,(`
	c.RejectPaths = `[`
	c.RejectMethods = `*`
	c.StripIdentityHeaders = "X-Remote-*,bad header,*"
	c.IdleTimeout = 0
	c.MaxConnections = 0
	c.HTTP2MaxStreams = 0
	c.AllowCredentialsToUpstream = []string{"ftp://x"}
	err := c.Validate()
	for _, want := range []string{"--accept-hosts", "--reject-paths", "--reject-methods", `"bad header"`, `"*"`, "--idle-timeout",
		"--max-connections", "--http2-max-streams-per-connection", "--allow-credentials-to-upstream"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validate error lacks %q:\n%v", want, err)
		}
	}

	kc := writeKubeconfig(t, "https://127.0.0.1:6443", "")
	done, err := complete(t, "--kubeconfig="+kc, "--reject-paths=", "--strip-identity-headers=x-remote-*, X-Auth-User")
	if err != nil {
		t.Fatal(err)
	}
	g := done.Guard
	if !g.On || len(g.RejectPaths) != 0 || len(g.AcceptHosts) != 3 || len(g.RejectMethods) != 0 {
		t.Fatalf("guard %+v", g)
	}
	if strings.Join(g.StripPrefixes, ",") != "X-Remote-" || strings.Join(g.StripHeaders, ",") != "X-Auth-User" {
		t.Fatalf("strip: %q %q", g.StripPrefixes, g.StripHeaders)
	}
	done, _ = complete(t, "--kubeconfig="+kc, "--no-credentials")
	if done.Guard.On {
		t.Fatal("the guard protects the lent identity: off when nothing is lent")
	}
	if d, _ := complete(t, "--kubeconfig="+kc, "--idle-timeout=5s"); d.HeaderTimeout() != d.IdleTimeout {
		t.Fatal("a short idle timeout bounds the wait for headers too")
	}
}

func TestHostForMatch(t *testing.T) {
	for in, want := range map[string]string{
		"localhost:8001": "localhost", "LocalHost": "localhost", "127.0.0.1:8001": "127.0.0.1",
		"[::1]:8001": "[::1]", "[::1]": "[::1]", "evil.example:8001": "evil.example", "": "",
	} {
		if got := HostForMatch(in); got != want {
			t.Errorf("HostForMatch(%q) = %q, want %q", in, got, want)
		}
	}
	hosts, _ := regexList(DefaultAcceptHosts)
	for h, want := range map[string]bool{"localhost": true, "127.0.0.1": true, "[::1]": true,
		"evil.example": false, "localhost.evil.example": false, "127.0.0.1.nip.io": false, "[::ffff:127.0.0.1]": false} {
		if MatchAny(hosts, h) != want {
			t.Errorf("default --accept-hosts on %q: %v, want %v", h, !want, want)
		}
	}
}

// testCA is a self-signed certificate in PEM (loadCA only parses it).
func testCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestClientLimitFlags: the main listener's HTTP/2 health and header flags are checked, every
// problem at once, and the per-source header budget resolves as the per-source limits do.
func TestClientLimitFlags(t *testing.T) {
	c := Default()
	c.ClientHTTP2WriteByteTimeout = -1
	c.ClientHTTP2PingInterval = -1
	c.ClientHTTP2PingTimeout = 0
	c.MaxRequestHeaderBytes = 2 << 20
	c.MaxHeaderBytesPerConnection = 1
	c.MaxHeaderBytesPerSource = -2
	err := c.Validate()
	for _, want := range []string{"--client-http2-write-byte-timeout", "--client-http2-ping-interval", "--client-http2-ping-timeout",
		"--max-request-header-bytes", "--max-header-bytes-per-connection", "--max-header-bytes-per-source"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validate error lacks %q:\n%v", want, err)
		}
	}
	c = Default()
	c.MaxHeaderBytesPerConnection = 100 << 10 // under twice the 64 KiB request limit
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--max-header-bytes-per-connection") {
		t.Errorf("a connection budget an anonymous request at the limit cannot fit: %v", err)
	}

	for _, tc := range []struct {
		args []string
		want int
	}{
		{nil, 0},
		{[]string{"--listen=0.0.0.0:8443", "--no-credentials"}, DefaultMaxHeaderBytesPerSource},
		{[]string{"--listen=0.0.0.0:8443", "--no-credentials", "--max-header-bytes-per-source=-1"}, 0},
		{[]string{"--max-header-bytes-per-source=1048576"}, 1 << 20},
	} {
		d, err := complete(t, append([]string{"--upstream=https://127.0.0.1:6443"}, tc.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		if d.SourceHeaderBytes != tc.want {
			t.Errorf("%v: SourceHeaderBytes %d, want %d", tc.args, d.SourceHeaderBytes, tc.want)
		}
	}
}
