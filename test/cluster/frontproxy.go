package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// FrontProxyUser is the CommonName of Cluster.FrontProxyCertFile, the one name the apiservers'
// --requestheader-allowed-names accepts (kubeadm's front-proxy-client).
const FrontProxyUser = "front-proxy-client"

// The request-header names the apiservers read a front proxy's assertion from, as kubeadm sets
// them.
const (
	RemoteUserHeader        = "X-Remote-User"
	RemoteGroupHeader       = "X-Remote-Group"
	RemoteExtraHeaderPrefix = "X-Remote-Extra-"
)

// CA is a certificate authority that tests mint certificates with (ECDSA P-256, valid a week).
type CA struct {
	// File is the CA certificate in PEM; PEM its contents.
	File string
	PEM  []byte
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA creates a CA named name whose files go into dir.
func NewCA(dir, name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA %s key: %w", name, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("CA %s certificate: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("CA %s certificate: %w", name, err)
	}
	ca := &CA{File: filepath.Join(dir, name+".crt"), PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), dir: dir, cert: cert, key: key}
	if err := os.WriteFile(ca.File, ca.PEM, 0o600); err != nil {
		return nil, err
	}
	return ca, nil
}

// IssueClient writes a client certificate for user in groups, by the Kubernetes convention
// (CommonName is the user, each Organization a group), and its key; file names start with
// name.
func (ca *CA) IssueClient(name, user string, groups ...string) (certFile, keyFile string, err error) {
	return ca.issue(name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// IssueServing writes a serving certificate for 127.0.0.1, ::1 and localhost, and its key.
func (ca *CA) IssueServing(name string) (certFile, keyFile string, err error) {
	return ca.IssueServingFor(name, "127.0.0.1", "::1", "localhost")
}

// IssueServingFor writes a serving certificate for hosts (IP addresses or DNS names), and its
// key.
func (ca *CA) IssueServingFor(name string, hosts ...string) (certFile, keyFile string, err error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.issue(name, tmpl)
}

func (ca *CA) issue(name string, tmpl *x509.Certificate) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	now := time.Now()
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = now.Add(7 * 24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return "", "", fmt.Errorf("certificate %s: %w", name, err)
	}
	certFile, keyFile = filepath.Join(ca.dir, name+".crt"), filepath.Join(ca.dir, name+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, writeECKey(keyFile, key)
}

// writeFrontProxy creates the front-proxy CA and its client certificate for FrontProxyUser
// (kubeadm's front-proxy-ca and front-proxy-client) in dir, and sets c's fields.
func (c *Cluster) writeFrontProxy(dir string) error {
	ca, err := NewCA(dir, "front-proxy-ca")
	if err != nil {
		return err
	}
	c.FrontProxyCAFile = ca.File
	c.FrontProxyCertFile, c.FrontProxyKeyFile, err = ca.IssueClient(FrontProxyUser, FrontProxyUser)
	return err
}

// requestHeaderArgs are the apiserver flags of request-header authentication: the front-proxy
// CA, the one name allowed, and kubeadm's header names.
func (c *Cluster) requestHeaderArgs() []string {
	return []string{
		"--requestheader-client-ca-file=" + c.FrontProxyCAFile,
		"--requestheader-allowed-names=" + FrontProxyUser,
		"--requestheader-username-headers=" + RemoteUserHeader,
		"--requestheader-group-headers=" + RemoteGroupHeader,
		"--requestheader-extra-headers-prefix=" + RemoteExtraHeaderPrefix,
	}
}
