package upstream

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// seenRequest is what a test upstream saw of one request.
type seenRequest struct {
	proto  string
	auth   string
	certs  int
	header http.Header
}

// upgradeUpstream is a TLS upstream with HTTP/2 enabled, as an apiserver is, that asks for
// client certificates and answers an upgrade (over HTTP/1.1, the only way there is) with 101
// and then echoes every byte: the kubelet's side of exec, as far as a proxy can tell.
type upgradeUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	seen []seenRequest
}

func newUpgradeUpstream(t *testing.T) *upgradeUpstream {
	t.Helper()
	u := &upgradeUpstream{}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := seenRequest{proto: r.Proto, auth: r.Header.Get("Authorization"), header: r.Header.Clone()}
		if r.TLS != nil {
			s.certs = len(r.TLS.PeerCertificates)
		}
		u.mu.Lock()
		u.seen = append(u.seen, s)
		u.mu.Unlock()
		up := r.Header.Get("Upgrade")
		if up == "" {
			_, _ = io.WriteString(w, "ok")
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, "cannot hijack: "+err.Error(), http.StatusInternalServerError)
			return
		}
		defer c.Close()
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", up)
		_ = brw.Flush()
		_, _ = io.Copy(c, brw)
	}))
	u.EnableHTTP2 = true
	u.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	u.StartTLS()
	t.Cleanup(u.Close)
	return u
}

func (u *upgradeUpstream) last(t *testing.T) seenRequest {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.seen) == 0 {
		t.Fatal("the upstream saw no request")
	}
	return u.seen[len(u.seen)-1]
}

func (u *upgradeUpstream) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: u.Certificate().Raw})
}

// clientCertPEM is a self-signed client certificate and key: the identity watchsan lends.
func clientCertPEM(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "watchsan"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

// lendingBackend is a backend of u that lends a token and a client certificate.
func lendingBackend(t *testing.T, u *upgradeUpstream, o TransportOptions) *Backend {
	t.Helper()
	cert, key := clientCertPEM(t)
	o.Credentials = &rest.Config{Host: u.URL, BearerToken: "lent-token",
		TLSClientConfig: rest.TLSClientConfig{CAData: u.caPEM(), CertData: cert, KeyData: key}}
	o.Lend = true
	return newPool(t, PoolOptions{Transport: o}, u.URL).Backends()[0]
}

func upgradeRequest(t *testing.T, b *Backend, proto, auth string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.Target(&url.URL{Path: "/api/v1/namespaces/d/pods/p/exec", RawQuery: "command=cat"}).String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", proto)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	return req
}

// TestUpgradeOverHTTP1ToHTTP2Upstream: every upgrade (SPDY as well as WebSocket) reaches an
// upstream that speaks HTTP/2 over HTTP/1.1 and is spliced both ways, lent or with the client's
// own credentials, while other requests keep using HTTP/2.
func TestUpgradeOverHTTP1ToHTTP2Upstream(t *testing.T) {
	u := newUpgradeUpstream(t)
	b := lendingBackend(t, u, TransportOptions{})
	get, _ := http.NewRequest(http.MethodGet, b.Target(&url.URL{Path: "/version"}).String(), nil)
	resp, err := sendDecided(b, get)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if s := u.last(t); s.proto != "HTTP/2.0" || s.auth != "Bearer lent-token" {
		t.Fatalf("a plain request went %s with %q: the upstream must be reached over HTTP/2 for this test to mean anything", s.proto, s.auth)
	}
	for _, tc := range []struct{ proto, auth, wantAuth string }{
		{"SPDY/3.1", "", "Bearer lent-token"},
		{"SPDY/3.1", "Bearer own", "Bearer own"},
		{"websocket", "", "Bearer lent-token"},
	} {
		resp, err := sendDecided(b, upgradeRequest(t, b, tc.proto, tc.auth))
		if err != nil {
			t.Fatalf("%s upgrade (auth %q): %v", tc.proto, tc.auth, err)
		}
		if resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("%s upgrade: %s", tc.proto, resp.Status)
		}
		s := u.last(t)
		if s.proto != "HTTP/1.1" || s.auth != tc.wantAuth {
			t.Fatalf("%s upgrade reached the upstream as %s with %q, want HTTP/1.1 with %q", tc.proto, s.proto, s.auth, tc.wantAuth)
		}
		rwc, ok := resp.Body.(io.ReadWriteCloser)
		if !ok {
			t.Fatalf("%s upgrade: the body is no connection", tc.proto)
		}
		if _, err := io.WriteString(rwc, "ping\n"); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(rwc).ReadString('\n')
		if err != nil || line != "ping\n" {
			t.Fatalf("%s echo: %q, %v", tc.proto, line, err)
		}
		rwc.Close()
	}
}

// TestAttackForgedIdentityHeadersStripped: a request that gets the lent identity (which here
// includes a client certificate an apiserver may trust as a front proxy's) reaches the upstream
// without the X-Remote-* headers the client forged, on the plain and the upgrade transport; a
// request with its own credentials goes without watchsan's certificate, so its headers mean
// nothing to the apiserver. The caller's request is never modified.
func TestAttackForgedIdentityHeadersStripped(t *testing.T) {
	u := newUpgradeUpstream(t)
	b := lendingBackend(t, u, TransportOptions{StripPrefixes: []string{"X-Remote-"}, StripHeaders: []string{"X-Auth-User"}})
	forge := func(req *http.Request) {
		req.Header.Set("X-Remote-User", "admin")
		req.Header.Add("X-Remote-Group", "system:masters")
		req.Header.Set("X-Remote-Extra-Scopes", "all")
		req.Header.Set("x-auth-user", "admin") // set in a client's non-canonical form
		req.Header["x-remote-uid"] = []string{"0"}
	}
	get, _ := http.NewRequest(http.MethodGet, b.Target(&url.URL{Path: "/api/v1/secrets"}).String(), nil)
	up := upgradeRequest(t, b, "SPDY/3.1", "")
	for _, req := range []*http.Request{get, up} {
		forge(req)
		resp, err := sendDecided(b, req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		s := u.last(t)
		if s.certs != 1 || s.auth != "Bearer lent-token" {
			t.Fatalf("lent request: certs %d auth %q, want watchsan's certificate and token", s.certs, s.auth)
		}
		for k := range s.header {
			if strings.HasPrefix(http.CanonicalHeaderKey(k), "X-Remote-") || http.CanonicalHeaderKey(k) == "X-Auth-User" {
				t.Fatalf("%s %s: forged %s reached the upstream alongside watchsan's client certificate", req.Method, req.URL.Path, k)
			}
		}
		if req.Header.Get("X-Remote-User") != "admin" {
			t.Fatal("the caller's request was modified")
		}
	}
	own, _ := http.NewRequest(http.MethodGet, b.Target(&url.URL{Path: "/api/v1/secrets"}).String(), nil)
	forge(own)
	own.Header.Set("Authorization", "Bearer own")
	resp, err := sendDecided(b, own)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if s := u.last(t); s.certs != 0 || s.auth != "Bearer own" {
		t.Fatalf("own credentials: certs %d auth %q, want no certificate of watchsan's", s.certs, s.auth)
	}
}

func TestSetForwardedDropsForwarded(t *testing.T) {
	in := httptest.NewRequest(http.MethodGet, "/api/v1/pods?watch=1", nil)
	in.Header.Set("Forwarded", "for=1.2.3.4;host=evil")
	in.Header.Set("X-Forwarded-Host", "evil")
	in.Header.Set("X-Forwarded-For", "10.0.0.1")
	out := in.Clone(in.Context())
	SetForwarded(out, in)
	if out.Header.Get("Forwarded") != "" || out.Header.Get("X-Forwarded-Host") != in.Host ||
		out.Header.Get("X-Forwarded-For") != "10.0.0.1, 192.0.2.1" {
		t.Fatalf("forwarding headers: %v", out.Header)
	}
}

// sendDecided sends req as the server does: with the credentials decided on req as it is
// (Decide), lending when the backend lends and asserting as its pool's options say.
func sendDecided(b *Backend, req *http.Request) (*http.Response, error) {
	return b.Send(req, Decide(req.Header, req.TLS, b.t.lend != nil, b.pool.opts.Transport.Identity))
}

// TestAttackDecidedOnce: the transport sends with the credentials decided on the client's
// request, whatever became of its headers on the way. It once decided again on the
// request it was handed: one whose Authorization a hop-by-hop removal (Connection:
// Authorization) had deleted went upstream with watchsan's lent token and certificate.
func TestAttackDecidedOnce(t *testing.T) {
	u := newUpgradeUpstream(t)
	b := lendingBackend(t, u, TransportOptions{})
	for _, req := range []*http.Request{
		func() *http.Request {
			r, _ := http.NewRequest(http.MethodGet, b.Target(&url.URL{Path: "/api/v1/secrets"}).String(), nil)
			r.Header.Set("Authorization", "Bearer junk")
			return r
		}(),
		upgradeRequest(t, b, "SPDY/3.1", "Bearer junk"),
	} {
		cred := Decide(req.Header, req.TLS, true, IdentityOff)
		if cred.Lent() || cred.String() != "own" || !strings.HasPrefix(cred.Principal(), "token:") || strings.Contains(cred.Principal(), "junk") {
			t.Fatalf("a request with its own Authorization decided as %s (%q)", cred, cred.Principal())
		}
		req.Header.Del("Authorization") // what the hop-by-hop removal did
		resp, err := b.Send(req, cred)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if s := u.last(t); s.auth != "" || s.certs != 0 {
			t.Fatalf("%s: decided as the client's own, sent with auth %q and %d certificates of watchsan's", req.Method, s.auth, s.certs)
		}
	}
	// The zero value never lends either.
	req, _ := http.NewRequest(http.MethodGet, b.Target(&url.URL{Path: "/api/v1/secrets"}).String(), nil)
	resp, err := b.Send(req, Credentials{})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if s := u.last(t); s.auth != "" || s.certs != 0 {
		t.Fatalf("undecided: sent with auth %q and %d certificates of watchsan's", s.auth, s.certs)
	}
}
