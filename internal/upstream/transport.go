// Package upstream holds the apiservers watchsan forwards to: one Backend per upstream URL, each
// with its hardened transports (one that lends watchsan's own identity, one that forwards only
// what the client sent), a health check, and a Pool that picks among them.
package upstream

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
)

// TransportOptions tune every upstream connection. Zero durations take the defaults noted.
type TransportOptions struct {
	DialTimeout           time.Duration // default 10s
	TLSHandshakeTimeout   time.Duration // default 10s
	KeepAlive             time.Duration // TCP keepalive period; default 30s
	HTTP2ReadIdleTimeout  time.Duration // ping an idle HTTP/2 connection after this; default 30s (as client-go)
	HTTP2PingTimeout      time.Duration // drop the connection when a ping is not answered; default 15s
	ResponseHeaderTimeout time.Duration // how long to wait for response headers; default 60s
	// HTTP2StreamWindow bounds what one upstream HTTP/2 stream may send ahead of watchsan
	// reading it, in bytes: what a watch whose client stopped reading holds. Default
	// DefaultHTTP2StreamWindow.
	HTTP2StreamWindow int
	// HTTP2ConnectionWindow bounds the same for all streams of one upstream connection;
	// default DefaultHTTP2ConnectionWindow.
	HTTP2ConnectionWindow int

	// RootCAs verifies the upstream's certificate; nil: the credentials' CA, else system roots.
	RootCAs *x509.CertPool
	// Insecure skips verification of the upstream's certificate.
	Insecure bool
	// Credentials, if not nil, supplies TLS settings (CA, server name, client certificate) and the
	// identity lent to requests that carry no Authorization header.
	Credentials *rest.Config
	// ProbeCredentials, if not nil, is the identity /readyz probes go with (its token, exec
	// plugin or client certificate; the upstream is verified as for every other connection);
	// nil: the lent identity when lending, else none.
	ProbeCredentials *rest.Config
	// Lend enables lending Credentials' identity. Without it requests are forwarded with only
	// the Authorization header they carry.
	Lend bool
	// StripHeaders (canonical names) and StripPrefixes (canonical prefixes) are removed from
	// every lent request: the headers an apiserver takes an identity from when the client
	// certificate watchsan presents is trusted as a front proxy's (--requestheader-*), which a
	// client must not choose.
	StripHeaders, StripPrefixes []string
	// Identity asserts the identity of a client with a verified certificate upstream
	// (identity.go); IdentityOff (the zero value): never. IdentityImpersonate needs
	// Credentials with an identity, IdentityRequestHeader needs FrontProxyCert.
	Identity IdentityMode
	// FrontProxyCert is the client certificate presented, and the only credential sent, on
	// requests that assert an identity with IdentityRequestHeader; nil: none.
	FrontProxyCert *tls.Certificate

	// onDial, if set, is told the outcome of every dial and which connections it was for
	// (ConnRequests, ConnHealth): the Pool's per-backend hook.
	onDial func(conn string, err error)
}

// What a connection to an upstream is for (PoolOptions.OnDial, the dials metric's label).
const (
	// ConnRequests: the connections client requests and watches share.
	ConnRequests = "requests"
	// ConnHealth: the health checker's own, for HTTP/2 PINGs and /readyz probes, never
	// shared with client requests (docs/design.md section 10.5).
	ConnHealth = "health"
	// ConnUnauthenticated: connections for requests the apiserver will not authenticate (no
	// credentials, or a token it refused), never shared with the others (unauthenticated.go).
	ConnUnauthenticated = "unauthenticated"
)

// Defaults of the upstream HTTP/2 receive windows (Go's are 4 MiB per stream and 1 GiB per
// connection: 100 watches whose clients stopped reading held 431 MiB).
const (
	// DefaultHTTP2StreamWindow is kube-apiserver's own receive window per stream (256 KiB, the
	// 99th percentile of an object's size): a watch event or a list page of usual objects
	// comes in one window, and a stalled watch holds at most this much of its upstream.
	DefaultHTTP2StreamWindow = 256 << 10
	// DefaultHTTP2ConnectionWindow is 256 streams' windows: kube-apiserver allows 250 streams
	// per connection by default, so streams whose clients stopped reading cannot use up the
	// window the other streams of their connection need, which a smaller one would allow.
	DefaultHTTP2ConnectionWindow = 256 * DefaultHTTP2StreamWindow
)

func (o *TransportOptions) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.DialTimeout, 10*time.Second)
	def(&o.TLSHandshakeTimeout, 10*time.Second)
	def(&o.KeepAlive, 30*time.Second)
	def(&o.HTTP2ReadIdleTimeout, 30*time.Second)
	def(&o.HTTP2PingTimeout, 15*time.Second)
	def(&o.ResponseHeaderTimeout, 60*time.Second)
	if o.HTTP2StreamWindow <= 0 {
		o.HTTP2StreamWindow = DefaultHTTP2StreamWindow
	}
	if o.HTTP2ConnectionWindow <= 0 {
		o.HTTP2ConnectionWindow = DefaultHTTP2ConnectionWindow
	}
}

// transports are the round trippers of a backend.
type transports struct {
	// forward carries a client's own Authorization and never presents watchsan's client
	// certificate: with both a certificate and a token the apiserver authenticates the
	// certificate first, so the client would act with watchsan's identity, not its own.
	forward http.RoundTripper
	// lend adds watchsan's identity (token, exec plugin, client certificate); nil when not lending.
	lend http.RoundTripper
	// forwardUpgrade and lendUpgrade are forward and lend for protocol upgrades (exec, attach,
	// port-forward over SPDY or WebSocket): the same TLS and credentials, HTTP/1.1 only. An
	// upgrade cannot travel over HTTP/2, and Go's transport falls back to HTTP/1.1 by itself
	// only for "Upgrade: websocket"; "SPDY/3.1" would fail with "http2: invalid Upgrade
	// request header".
	forwardUpgrade, lendUpgrade http.RoundTripper
	// assert and assertUpgrade send a request that asserts its client's verified identity
	// (Credentials.Asserted), with the credentials of TransportOptions.Identity; nil when it is
	// IdentityOff.
	assert, assertUpgrade asserter
	// probe sends the health checker's /readyz probes over connections of its own, with the
	// lent identity when there is one, else none: an anonymous request on HTTP/2 makes the
	// apiserver close its connection (UnauthenticatedHTTP2DOSMitigation), which must not be
	// the connection client requests share (docs/design.md section 10.5).
	probe http.RoundTripper
	// probeIdentity: probes carry an identity (the probe identity or the lent one), which the
	// apiserver can authorize; probeWho names it for logs.
	probeIdentity bool
	probeWho      string
	// unauth carries the requests the apiserver will not authenticate, over connections of
	// their own (unauthenticated.go); refused is the tokens it answered 401.
	unauth  http.RoundTripper
	refused *refusedSet
	// closeIdle drops pooled connections of all (after a GOAWAY storm or a failed health check).
	closeIdle func()
	// tls is forward's TLS configuration (the pinger's: a ping needs no identity).
	tls *tls.Config
}

func newTransports(o TransportOptions) (*transports, error) {
	o.defaults()
	var tc *transport.Config
	base := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.Credentials != nil {
		var err error
		if tc, err = o.Credentials.TransportConfig(); err != nil {
			return nil, fmt.Errorf("kubeconfig credentials: %w", err)
		}
		if o.RootCAs != nil || o.Insecure {
			tc.TLS.CAFile, tc.TLS.CAData = "", nil
			tc.TLS.Insecure = false
		}
		cfg, err := transport.TLSConfigFor(tc)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig TLS settings: %w", err)
		}
		if cfg != nil {
			base = cfg
		}
	}
	if o.RootCAs != nil {
		base.RootCAs = o.RootCAs
	}
	if o.Insecure {
		base.InsecureSkipVerify = true
	}

	forwardTLS := base.Clone()
	forwardTLS.Certificates = nil
	forwardTLS.GetClientCertificate = nil
	forward := newHTTPTransport(o, forwardTLS, false, ConnRequests)
	forwardUpgrade := newHTTPTransport(o, forwardTLS, true, ConnRequests)
	// HTTP/2 like the shared connections, with their bounded stream windows: an
	// unauthenticated watch whose client stops reading holds no more than a window
	// (TestAttackNonReadingWatches; over HTTP/1.1 the kernel's socket buffer held ~2 MiB each).
	unauth := newHTTPTransport(o, forwardTLS, false, ConnUnauthenticated)
	t := &transports{forward: forward, forwardUpgrade: forwardUpgrade, unauth: unauth, refused: &refusedSet{}, tls: forwardTLS}
	closers := []*http.Transport{forward, forwardUpgrade, unauth}
	if o.Lend && o.Credentials != nil {
		for _, l := range []struct {
			rt      *http.RoundTripper
			upgrade bool
		}{{&t.lend, false}, {&t.lendUpgrade, true}} {
			lendBase := newHTTPTransport(o, base, l.upgrade, ConnRequests)
			rt, err := transport.HTTPWrappersForConfig(tc, lendBase)
			if err != nil {
				return nil, fmt.Errorf("kubeconfig credentials: %w", err)
			}
			*l.rt = stripIdentity(rt, o.StripHeaders, o.StripPrefixes)
			closers = append(closers, lendBase)
		}
	}
	switch o.Identity {
	case IdentityImpersonate:
		if tc == nil || o.Credentials == nil {
			return nil, fmt.Errorf("identity forwarding by impersonation needs credentials to impersonate with")
		}
		for _, l := range []struct {
			rt      *asserter
			upgrade bool
		}{{&t.assert, false}, {&t.assertUpgrade, true}} {
			b := newHTTPTransport(o, base, l.upgrade, ConnRequests)
			rt, err := transport.HTTPWrappersForConfig(tc, b)
			if err != nil {
				return nil, fmt.Errorf("kubeconfig credentials: %w", err)
			}
			*l.rt = assertIdentity(rt, o.Identity, o.StripHeaders, o.StripPrefixes)
			closers = append(closers, b)
		}
	case IdentityRequestHeader:
		if o.FrontProxyCert == nil {
			return nil, fmt.Errorf("identity forwarding by request headers needs a front-proxy client certificate")
		}
		// The front-proxy certificate and nothing else: no token or exec plugin of the
		// kubeconfig, which the apiserver would authenticate instead of the headers.
		fp := forwardTLS.Clone()
		fp.Certificates = []tls.Certificate{*o.FrontProxyCert}
		for _, l := range []struct {
			rt      *asserter
			upgrade bool
		}{{&t.assert, false}, {&t.assertUpgrade, true}} {
			b := newHTTPTransport(o, fp, l.upgrade, ConnRequests)
			*l.rt = assertIdentity(b, o.Identity, o.StripHeaders, o.StripPrefixes)
			closers = append(closers, b)
		}
	}
	probe, probeBase, err := newProbeTransport(o, tc, base, forwardTLS)
	if err != nil {
		return nil, err
	}
	t.probe = probe
	switch {
	case o.ProbeCredentials != nil:
		t.probeIdentity, t.probeWho = true, "the probe identity (--probe-kubeconfig)"
	case o.Lend && o.Credentials != nil:
		t.probeIdentity, t.probeWho = true, "the lent identity"
	case o.Identity == IdentityImpersonate && o.Credentials != nil:
		t.probeIdentity, t.probeWho = true, "the kubeconfig's identity (the one that impersonates)"
	}
	closers = append(closers, probeBase)
	t.closeIdle = func() {
		for _, c := range closers {
			c.CloseIdleConnections()
		}
	}
	return t, nil
}

// newProbeTransport builds the /readyz probes' transport, on connections of its own (ConnHealth):
// with ProbeCredentials' identity when set, else the kubeconfig's (tc, over base) when it is
// lent or impersonates, else with none (over forwardTLS).
func newProbeTransport(o TransportOptions, tc *transport.Config, base, forwardTLS *tls.Config) (http.RoundTripper, *http.Transport, error) {
	if o.ProbeCredentials != nil {
		ptc, err := o.ProbeCredentials.TransportConfig()
		if err != nil {
			return nil, nil, fmt.Errorf("probe credentials: %w", err)
		}
		// Only its client certificate matters here: the upstream is verified as every
		// connection to it is.
		ptc.TLS.CAFile, ptc.TLS.CAData, ptc.TLS.Insecure, ptc.TLS.ServerName = "", nil, false, ""
		pcfg, err := transport.TLSConfigFor(ptc)
		if err != nil {
			return nil, nil, fmt.Errorf("probe credentials' TLS settings: %w", err)
		}
		cfg := forwardTLS.Clone()
		if pcfg != nil {
			cfg.Certificates, cfg.GetClientCertificate = pcfg.Certificates, pcfg.GetClientCertificate
		}
		b := newHTTPTransport(o, cfg, false, ConnHealth)
		rt, err := transport.HTTPWrappersForConfig(ptc, b)
		if err != nil {
			return nil, nil, fmt.Errorf("probe credentials: %w", err)
		}
		return rt, b, nil
	}
	if (o.Lend || o.Identity == IdentityImpersonate) && o.Credentials != nil {
		// The identity watchsan lends, or impersonates with: both checked to belong to the
		// upstreams (config.checkLending).
		b := newHTTPTransport(o, base, false, ConnHealth)
		rt, err := transport.HTTPWrappersForConfig(tc, b)
		if err != nil {
			return nil, nil, fmt.Errorf("kubeconfig credentials: %w", err)
		}
		return rt, b, nil
	}
	b := newHTTPTransport(o, forwardTLS, false, ConnHealth)
	return b, b, nil
}

// probeAs names whom the probes go as, for logs and errors.
func (t *transports) probeAs() string {
	if t.probeWho == "" {
		return "watchsan's anonymous probe"
	}
	return t.probeWho
}

// roundTrip sends req with the credentials cred says, over the transport for an upgrade when
// upgrade: the one place a request's credentials pick its transport, from the decision alone.
func (t *transports) roundTrip(req *http.Request, cred Credentials, upgrade bool) (*http.Response, error) {
	pick := func(plain, up http.RoundTripper) http.RoundTripper {
		if upgrade {
			return up
		}
		return plain
	}
	switch cred.how {
	case credUndecided:
		if len(req.Header.Values("Authorization")) == 0 {
			return pick(t.unauth, t.forwardUpgrade).RoundTrip(req)
		}
		return pick(t.forward, t.forwardUpgrade).RoundTrip(req)
	case credOwn:
		if upgrade {
			return t.forwardUpgrade.RoundTrip(req)
		}
		return t.sendOwn(req, cred)
	case credAnonymous:
		return pick(t.unauth, t.forwardUpgrade).RoundTrip(req)
	case credSelf:
		if t.lend != nil {
			return pick(t.lend, t.lendUpgrade).RoundTrip(req)
		}
		return pick(t.unauth, t.forwardUpgrade).RoundTrip(req)
	case credLent:
		if t.lend != nil {
			return pick(t.lend, t.lendUpgrade).RoundTrip(req)
		}
	case credAsserted:
		if t.assert != nil {
			if upgrade {
				return t.assertUpgrade(req, cred.identity)
			}
			return t.assert(req, cred.identity)
		}
	}
	// Refused rather than sent with other credentials than those decided.
	return nil, fmt.Errorf("watchsan: a request decided as %s has no transport for it (a bug)", cred)
}

// stripIdentity removes the identity headers a client must not choose from every request
// before rt, which lends watchsan's identity, sends it.
func stripIdentity(rt http.RoundTripper, names, prefixes []string) http.RoundTripper {
	if len(names) == 0 && len(prefixes) == 0 {
		return rt
	}
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		var drop []string
		for k := range req.Header {
			if identityHeader(k, names, prefixes) {
				drop = append(drop, k)
			}
		}
		if len(drop) > 0 {
			out := *req // a shallow copy: the caller's request and headers stay as they are
			out.Header = req.Header.Clone()
			for _, k := range drop {
				delete(out.Header, k)
			}
			req = &out
		}
		return rt.RoundTrip(req)
	})
}

func identityHeader(k string, names, prefixes []string) bool {
	k = http.CanonicalHeaderKey(k) // a client's HTTP/2 headers arrive canonical too; be sure
	for _, n := range names {
		if k == n {
			return true
		}
	}
	for _, p := range prefixes {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// newHTTPTransport builds one upstream transport; upgrade: HTTP/1.1 only (see transports); conn
// says what its connections are for (ConnRequests, ConnHealth), for the dial hook.
func newHTTPTransport(o TransportOptions, tlsCfg *tls.Config, upgrade bool, conn string) *http.Transport {
	d := &net.Dialer{Timeout: o.DialTimeout, KeepAlive: o.KeepAlive}
	dial := d.DialContext
	if o.onDial != nil {
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			o.onDial(conn, err)
			return c, err
		}
	}
	t := &http.Transport{
		Proxy:                 nil, // never through $HTTPS_PROXY: watchsan is the proxy
		DialContext:           dial,
		TLSClientConfig:       tlsCfg.Clone(),
		TLSHandshakeTimeout:   o.TLSHandshakeTimeout,
		ResponseHeaderTimeout: o.ResponseHeaderTimeout,
		ForceAttemptHTTP2:     !upgrade,
		MaxIdleConns:          1000,
		MaxIdleConnsPerHost:   100,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		// Responses are relayed as they are; a client that asked for gzip gets the apiserver's
		// gzip (the watch path asks for identity itself, since it parses).
		DisableCompression: true,
	}
	if upgrade {
		t.Protocols = new(http.Protocols)
		t.Protocols.SetHTTP1(true)
		return t
	}
	// Why: a dead HTTP/2 connection otherwise stays in the pool for the 13-30 minutes Linux
	// needs to notice (docs/design.md section 1b); client-go pings with these values since 1.20. net/http's
	// own HTTP/2 settings replace golang.org/x/net/http2.ConfigureTransports (deprecated).
	// The receive windows bound what an upstream may send ahead of watchsan reading it: a
	// watch whose client does not read stops being read too, and holds no more than its window.
	t.HTTP2 = &http.HTTP2Config{SendPingTimeout: o.HTTP2ReadIdleTimeout, PingTimeout: o.HTTP2PingTimeout,
		MaxReceiveBufferPerStream: o.HTTP2StreamWindow, MaxReceiveBufferPerConnection: o.HTTP2ConnectionWindow}
	return t
}
