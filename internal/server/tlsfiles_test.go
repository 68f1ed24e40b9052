package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/watchsan/watchsan/internal/testutil"
)

// testCA signs certificates for the TLS reload tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate and key in PEM: a serving one for 127.0.0.1 when server, else a
// client one for cn.
func (ca *testCA) issue(t *testing.T, cn string, serial int64, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	// As a Secret volume does: the new file is complete before it takes the name.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestTLSFilesReload: a rotated serving certificate is presented and a rotated client CA
// verifies, from a handshake after the change on, without a restart; files caught half-way
// through a rotation leave the previous material in use; a client certificate from a CA the
// listener does not trust fails the handshake, and a client without one is let through.
func TestTLSFilesReload(t *testing.T) {
	dir := t.TempDir()
	servingCA, clientCA1, clientCA2 := newTestCA(t, "serving-ca"), newTestCA(t, "client-ca-1"), newTestCA(t, "client-ca-2")
	certFile, keyFile, caFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "client-ca.crt")
	c1, k1 := servingCA.issue(t, "serving-1", 101, true)
	writeFile(t, certFile, c1)
	writeFile(t, keyFile, k1)
	writeFile(t, caFile, clientCA1.pem)

	var mu sync.Mutex
	results := map[string]int{}
	files, err := newTLSFiles(certFile, keyFile, caFile, zap.NewNop(), func(r string) { mu.Lock(); results[r]++; mu.Unlock() })
	if err != nil {
		t.Fatal(err)
	}
	files.interval = 20 * time.Millisecond
	ln, err := tls.Listen("tcp", "127.0.0.1:0", files.serverConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // handshake every connection, then close it; ends when the listener closes
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(servingCA.pem)
	// handshake returns the serving certificate's serial, or the handshake's error (a
	// refused client certificate shows on the client's first read in TLS 1.3).
	handshake := func(clientCert, clientKey []byte) (int64, error) {
		cfg := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}
		if clientCert != nil {
			cert, err := tls.X509KeyPair(clientCert, clientKey)
			if err != nil {
				t.Fatal(err)
			}
			// Always sent, as openssl or curl would: Go's own client sends none that the
			// server's list of acceptable CAs does not name.
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
		}
		conn, err := tls.Dial("tcp", ln.Addr().String(), cfg)
		if err != nil {
			return 0, err
		}
		defer conn.Close()
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); err != nil && !isEOF(err) {
			return 0, err
		}
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64(), nil
	}

	alice1, aliceKey1 := clientCA1.issue(t, "alice", 201, false)
	alice2, aliceKey2 := clientCA2.issue(t, "alice", 202, false)
	if serial, err := handshake(alice1, aliceKey1); err != nil || serial != 101 {
		t.Fatalf("first handshake: serial %d, %v", serial, err)
	}
	if _, err := handshake(alice2, aliceKey2); err == nil {
		t.Fatal("a client certificate from an untrusted CA was accepted")
	}
	if serial, err := handshake(nil, nil); err != nil || serial != 101 {
		t.Fatalf("a client without a certificate: %d, %v", serial, err)
	}

	// Half a rotation: a new certificate whose key has not arrived yet. Nothing changes.
	c2, k2 := servingCA.issue(t, "serving-2", 102, true)
	writeFile(t, certFile, c2)
	time.Sleep(3 * files.interval) // a handshake after the check interval must look at the files
	if serial, err := handshake(nil, nil); err != nil || serial != 101 {
		t.Fatalf("with a certificate that does not match its key: serial %d, %v; want the old one, 101", serial, err)
	}
	// The key arrives, and the client CA rotates.
	writeFile(t, keyFile, k2)
	writeFile(t, caFile, clientCA2.pem)
	testutil.Eventually(t, 5*time.Second, "the rotated serving certificate", func() bool {
		serial, err := handshake(nil, nil)
		return err == nil && serial == 102
	})
	if _, err := handshake(alice2, aliceKey2); err != nil {
		t.Fatalf("a certificate of the rotated client CA: %v", err)
	}
	if _, err := handshake(alice1, aliceKey1); err == nil {
		t.Fatal("a certificate of the replaced client CA is still accepted")
	}
	mu.Lock()
	defer mu.Unlock()
	if results["error"] != 1 || results["ok"] < 1 {
		t.Fatalf("reload results %v, want one error (the half rotation) and at least one ok", results)
	}
}

func isEOF(err error) bool { return err != nil && err.Error() == "EOF" }
