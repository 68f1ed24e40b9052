package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/upstream"
)

// testKeyPair writes a self-signed certificate and its key into dir.
func testKeyPair(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestIdentityForwardingFlags: every combination that would assert nothing, or would lend
// watchsan's identity to clients it did not verify, is refused at start with a message naming
// the flags; the good ones resolve to the mode, no lending, and (requestheader) the front-proxy
// certificate.
func TestIdentityForwardingFlags(t *testing.T) {
	dir := t.TempDir()
	kc := writeKubeconfig(t, "https://127.0.0.1:6443", "")
	noUserKC := filepath.Join(dir, "nouser")
	os.WriteFile(noUserKC, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600)
	asKC := filepath.Join(dir, "as")
	os.WriteFile(asKC, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t, as: someone}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600)
	crt, key := testKeyPair(t, dir, "serving")
	fpCrt, fpKey := testKeyPair(t, dir, "front-proxy-client")
	ca := filepath.Join(dir, "ca.crt")
	os.WriteFile(ca, testCA(t), 0o600)
	tlsArgs := []string{"--listen=0.0.0.0:6443", "--tls-cert-file=" + crt, "--tls-private-key-file=" + key}
	with := func(a ...string) []string { return append(append([]string(nil), tlsArgs...), a...) }
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
		want    upstream.IdentityMode
	}{
		{"impersonate", with("--kubeconfig="+kc, "--client-ca-file="+ca, "--identity-forwarding=impersonate"), "", upstream.IdentityImpersonate},
		{"requestheader", with("--kubeconfig="+kc, "--client-ca-file="+ca, "--identity-forwarding=requestheader",
			"--requestheader-client-cert-file="+fpCrt, "--requestheader-client-key-file="+fpKey), "", upstream.IdentityRequestHeader},
		{"requestheader without a kubeconfig identity", with("--upstream=https://10.0.0.1:6443", "--upstream-ca-file="+ca, "--client-ca-file="+ca,
			"--identity-forwarding=requestheader", "--requestheader-client-cert-file="+fpCrt, "--requestheader-client-key-file="+fpKey), "", upstream.IdentityRequestHeader},
		{"unknown mode", with("--kubeconfig="+kc, "--client-ca-file="+ca, "--identity-forwarding=trust-me"), `--identity-forwarding "trust-me": want impersonate or requestheader`, 0},
		{"client CA alone", with("--no-credentials", "--upstream=https://10.0.0.1:6443", "--client-ca-file="+ca), "--client-ca-file without --identity-forwarding", 0},
		{"no client CA", with("--kubeconfig="+kc, "--identity-forwarding=impersonate"), "needs --tls-cert-file, --tls-private-key-file and --client-ca-file", 0},
		{"no TLS", []string{"--kubeconfig=" + kc, "--client-ca-file=" + ca, "--identity-forwarding=impersonate"}, "--client-ca-file verifies client certificates on the TLS listener", 0},
		{"bad client CA", with("--kubeconfig="+kc, "--client-ca-file="+key, "--identity-forwarding=impersonate"), "--client-ca-file: ", 0},
		{"impersonate without credentials", with("--kubeconfig="+kc, "--client-ca-file="+ca, "--identity-forwarding=impersonate", "--no-credentials"), "cannot go with --no-credentials", 0},
		{"impersonate without an identity", with("--kubeconfig="+noUserKC, "--client-ca-file="+ca, "--identity-forwarding=impersonate"), "impersonates with the kubeconfig's identity, and there is none", 0},
		{"impersonate with a kubeconfig that impersonates", with("--kubeconfig="+asKC, "--client-ca-file="+ca, "--identity-forwarding=impersonate"), "the kubeconfig itself impersonates", 0},
		{"impersonate to another server", with("--kubeconfig="+kc, "--upstream=https://10.0.0.1:6443", "--client-ca-file="+ca, "--identity-forwarding=impersonate"), "not the kubeconfig's server", 0},
		{"requestheader without its certificate", with("--kubeconfig="+kc, "--client-ca-file="+ca, "--identity-forwarding=requestheader"), "--requestheader-client-cert-file and --requestheader-client-key-file", 0},
		{"requestheader to plain HTTP", with("--upstream=http://127.0.0.1:8080", "--no-credentials", "--client-ca-file="+ca, "--identity-forwarding=requestheader",
			"--requestheader-client-cert-file="+fpCrt, "--requestheader-client-key-file="+fpKey), "is not https", 0},
		{"front-proxy certificate without the mode", with("--kubeconfig="+kc, "--requestheader-client-cert-file="+fpCrt, "--requestheader-client-key-file="+fpKey), "used only with --identity-forwarding=requestheader", 0},
		{"front-proxy certificate that does not load", with("--kubeconfig="+kc, "--client-ca-file="+ca, "--identity-forwarding=requestheader",
			"--requestheader-client-cert-file="+fpCrt, "--requestheader-client-key-file="+key), "--requestheader-client-cert-file/--requestheader-client-key-file: ", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done, err := complete(t, tc.args...)
			requireOutcome(t, err, tc.wantErr, "a combination that asserts nothing or lends to unverified clients")
			if err != nil {
				return
			}
			if done.Identity != tc.want || done.Lend || done.Guard.On {
				t.Fatalf("identity %v lend %v guard %v, want %v and no lending: a client with neither token nor certificate must not get watchsan's identity", done.Identity, done.Lend, done.Guard.On, tc.want)
			}
			if (done.FrontProxyCert != nil) != (tc.want == upstream.IdentityRequestHeader) {
				t.Fatalf("front-proxy certificate loaded: %v", done.FrontProxyCert != nil)
			}
		})
	}
}
