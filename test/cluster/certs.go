package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the files written by writePKI.
type pki struct {
	caData                  []byte
	caPath                  string
	servingCert, servingKey string // one serving certificate for every apiserver
	saKey                   string // service-account signing key (its public half verifies)
	adminCert, adminKey     string // client certificate in system:masters
	ca                      *CA    // the CA itself, to issue more certificates
}

// KubernetesServiceIP is the ClusterIP of the default/kubernetes Service (the first address of the
// apiservers' --service-cluster-ip-range), which pods' in-cluster configuration names.
const KubernetesServiceIP = "10.0.0.1"

// kubernetesServiceNames are the kubernetes Service's DNS names.
var kubernetesServiceNames = []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}

// writePKI generates a CA, a serving certificate for 127.0.0.1, ::1, localhost, the kubernetes
// Service and extra, a client
// certificate for an admin in system:masters, and a service-account key, all ECDSA P-256, and
// writes them as PEM files into dir.
func writePKI(dir string, extra []string) (*pki, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "watchsan-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}

	p := &pki{
		ca:          &CA{File: filepath.Join(dir, "ca.crt"), dir: dir, cert: ca, key: caKey},
		caPath:      filepath.Join(dir, "ca.crt"),
		servingCert: filepath.Join(dir, "serving.crt"),
		servingKey:  filepath.Join(dir, "serving.key"),
		saKey:       filepath.Join(dir, "service-account.key"),
		adminCert:   filepath.Join(dir, "admin.crt"),
		adminKey:    filepath.Join(dir, "admin.key"),
	}
	p.caData = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	p.ca.PEM = p.caData
	if err := os.WriteFile(p.caPath, p.caData, 0o600); err != nil {
		return nil, err
	}

	leaf := func(tmpl *x509.Certificate, certPath, keyPath string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl.SerialNumber = serial()
		tmpl.NotBefore = now.Add(-time.Hour)
		tmpl.NotAfter = now.Add(7 * 24 * time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
			return err
		}
		return writeECKey(keyPath, key)
	}
	// The kubernetes Service's address and names too, as kubeadm's certificate has them, so
	// that a pod's in-cluster configuration verifies an apiserver it reaches through the
	// Service (a node of package node forwards it).
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.ParseIP(KubernetesServiceIP)}
	for _, a := range extra {
		if ip := net.ParseIP(a); ip != nil && !ip.Equal(ips[0]) {
			ips = append(ips, ip)
		}
	}
	if err := leaf(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "watchsan-test-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: ips,
		DNSNames:    append([]string{"localhost"}, kubernetesServiceNames...),
	}, p.servingCert, p.servingKey); err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	if err := leaf(&x509.Certificate{
		Subject:     pkix.Name{CommonName: AdminUser + "-cert", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, p.adminCert, p.adminKey); err != nil {
		return nil, fmt.Errorf("admin client certificate: %w", err)
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("service-account key: %w", err)
	}
	if err := writeECKey(p.saKey, saKey); err != nil {
		return nil, fmt.Errorf("service-account key: %w", err)
	}
	return p, nil
}

func writeECKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

// randomToken returns 32 hex characters from crypto/rand.
func randomToken() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}
