package cluster

import (
	"net/http"
	"slices"
	"testing"

	"k8s.io/client-go/rest"
)

// TestRequestHeaderAuth: the harness's apiservers trust the front-proxy certificate's
// X-Remote-User/-Group, and only with that certificate; a client certificate minted by a CA
// gives its CommonName and Organizations as user and groups to whoever trusts that CA.
func TestRequestHeaderAuth(t *testing.T) {
	c := startT(t, Options{})
	whoami := func(certFile, keyFile string, h http.Header) (int, string, []string) {
		t.Helper()
		hc, err := rest.HTTPClientFor(&rest.Config{Host: c.APIServers[0].URL,
			TLSClientConfig: rest.TLSClientConfig{CAData: c.CAData, CertFile: certFile, KeyFile: keyFile}})
		if err != nil {
			t.Fatal(err)
		}
		code, user, groups, err := WhoAmI(hc, c.APIServers[0].URL, h)
		if err != nil {
			t.Fatal(err)
		}
		return code, user, groups
	}
	asserted := http.Header{RemoteUserHeader: {"carol"}, RemoteGroupHeader: {"g1", "g2"}}
	if code, user, groups := whoami(c.FrontProxyCertFile, c.FrontProxyKeyFile, asserted); code != http.StatusCreated || user != "carol" ||
		!slices.Contains(groups, "g1") || !slices.Contains(groups, "g2") || !slices.Contains(groups, "system:authenticated") {
		t.Fatalf("front-proxy certificate with X-Remote-*: %d %q %v, want carol [g1 g2 system:authenticated]", code, user, groups)
	}
	// The same headers with the admin's certificate (the cluster CA, not the front-proxy CA)
	// mean nothing: the certificate is the identity.
	if _, user, _ := whoami(c.AdminCertFile, c.AdminKeyFile, asserted); user == "carol" {
		t.Fatal("X-Remote-User was trusted on a certificate that is not the front proxy's")
	}
	// A CA of the test's own mints certificates by the x509 convention.
	ca, err := NewCA(t.TempDir(), "test-ca")
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := ca.IssueClient("dave", "dave", "devs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rest.HTTPClientFor(&rest.Config{Host: c.APIServers[0].URL, TLSClientConfig: rest.TLSClientConfig{CAFile: ca.File, CertFile: crt, KeyFile: key}}); err != nil {
		t.Fatalf("a minted certificate does not load: %v", err)
	}
}
