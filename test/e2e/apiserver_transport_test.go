package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"testing"
)

// faultLayerTransport is the transport of a fault layer's reverse proxy in front of a real
// apiserver. It keeps what watchsan keeps apart (docs/design.md, "connections of their own"
// for unauthenticated requests): the apiserver answers a request it cannot authenticate on
// HTTP/2 with a graceful GOAWAY for the whole connection (kubernetes/kubernetes#121120), and
// a proxy that funnels every client onto one connection would fail the others' requests in
// flight with 502 (a POST's body cannot be sent again), which no apiserver does to watchsan.
// Requests without an Authorization header so go on HTTP/1.1 connections of their own.
func faultLayerTransport(t testing.TB, roots *x509.CertPool) http.RoundTripper {
	h2 := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
	h1 := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}
	t.Cleanup(func() {
		h2.CloseIdleConnections()
		h1.CloseIdleConnections()
	})
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Header.Get("Authorization") == "" {
			return h1.RoundTrip(r)
		}
		return h2.RoundTrip(r)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
