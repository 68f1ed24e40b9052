package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestClassify: real failures, as the health checker meets them, get the kind an operator
// checks for: a certificate no CA watchsan trusts signed, a port nothing listens on, a name
// that does not resolve, a dial that times out, and the HTTP status of a /readyz answer.
func TestClassify(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewTLSServer(http.NotFoundHandler()) // its certificate: no CA watchsan was given
	defer srv.Close()
	_, tlsErr := (&tls.Dialer{Config: &tls.Config{MinVersion: tls.VersionTLS12}}).DialContext(ctx, "tcp", srv.Listener.Addr().String())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, refusedErr := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	_, dnsErr := (&net.Dialer{}).DialContext(ctx, "tcp", "no-such-host.invalid:443")
	tctx, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	<-tctx.Done()
	_, timeoutErr := (&net.Dialer{}).DialContext(tctx, "tcp", "127.0.0.1:1")

	for _, tc := range []struct {
		name string
		err  error
		code int
		want CauseKind
		text string
	}{
		{"unknown authority", tlsErr, 0, CauseTLS, "x509: certificate signed by unknown authority"},
		{"refused", refusedErr, 0, CauseRefused, "connection refused"},
		{"refused, wrapped", fmt.Errorf("ping: %w", refusedErr), 0, CauseRefused, addr},
		{"dns", dnsErr, 0, CauseDNS, "no-such-host.invalid"},
		{"timeout", timeoutErr, 0, CauseTimeout, ""},
		{"401", errors.New("/readyz answered 401"), 401, CauseUnauthorized, "expired or revoked"},
		{"403", errors.New("/readyz answered 403"), 403, CauseForbidden, "403"},
		{"503", errors.New("/readyz answered 503"), 503, CauseHTTP, "503"},
		{"goaway", errors.New("the upstream said GOAWAY (NO_ERROR)"), 0, CauseOther, "GOAWAY"},
	} {
		if tc.err == nil {
			t.Fatalf("%s: the failure did not happen", tc.name)
		}
		c := classify(tc.err, tc.code)
		if c.Kind != tc.want || !strings.HasPrefix(c.Error(), string(tc.want)+": ") || !strings.Contains(c.Error(), tc.text) {
			t.Errorf("%s: classify(%q, %d) = %s %q, want kind %s naming %q", tc.name, tc.err, tc.code, c.Kind, c.Error(), tc.want, tc.text)
		}
		if again := classify(c, 0); again != c {
			t.Errorf("%s: a Cause classified again is not kept", tc.name)
		}
	}
	if c := classify(tlsErr, 0); strings.Count(c.Error(), "tls: ") != 1 {
		t.Errorf("the kind is repeated: %q", c.Error())
	}
}

// oneBackendPool is a Pool of one https backend, nothing started: verdicts are given by hand.
func oneBackendPool(t *testing.T) (*Pool, *Backend) {
	t.Helper()
	p, err := NewPool(nil, PoolOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.newBackend(mustURL(t, "https://127.0.0.1:1"), false)
	if err != nil {
		t.Fatal(err)
	}
	bs := []*Backend{b}
	p.list.Store(&bs)
	return p, b
}

// TestVerdictRecordsCause: the health checker's verdicts keep the last error and since when:
// the error's time stays while its kind does, a new kind starts it again, a recovery keeps the
// error and changes the state's time.
func TestVerdictRecordsCause(t *testing.T) {
	p, b := oneBackendPool(t)
	if h := b.Health(); h.State != Unknown || h.LastError != nil || !h.StateSince.IsZero() {
		t.Fatalf("before any verdict: %+v", h)
	}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &net.AddrError{Err: "x"}}
	p.verdict(b, Unhealthy, fmt.Errorf("dial: %w", refused))
	h1 := b.Health()
	if h1.State != Unhealthy || h1.LastError == nil || h1.StateSince.IsZero() || h1.ErrorSince.IsZero() {
		t.Fatalf("after the first failure: %+v", h1)
	}
	p.verdict(b, Unhealthy, errors.New("the same kind again"))
	h2 := b.Health()
	if !h2.StateSince.Equal(h1.StateSince) || !h2.ErrorSince.Equal(h1.ErrorSince) || h2.LastError.Err != "the same kind again" {
		t.Errorf("the same state and kind: since changed or the error not kept: %+v then %+v", h1, h2)
	}
	p.verdict(b, Unhealthy, classify(errors.New("/readyz answered 503"), 503))
	h3 := b.Health()
	if h3.LastError.Kind != CauseHTTP || !h3.ErrorSince.After(h2.ErrorSince) && !h3.ErrorSince.Equal(h2.ErrorSince) {
		t.Errorf("a new kind: %+v", h3)
	}
	p.verdict(b, Healthy, nil)
	h4 := b.Health()
	if h4.State != Healthy || h4.LastError == nil || h4.LastError.Kind != CauseHTTP || h4.StateSince.Before(h3.StateSince) {
		t.Errorf("after the recovery: %+v", h4)
	}
	if d := h4.Describe(); !strings.HasPrefix(d, "healthy since ") || strings.Contains(d, "http:") {
		t.Errorf("a healthy backend is described %q; want its state and time, not its old error", d)
	}
	if d := h3.Describe(); !strings.Contains(d, "unhealthy since ") || !strings.Contains(d, "http: /readyz answered 503") {
		t.Errorf("an unhealthy backend is described %q", d)
	}
}

// A ping that passes while /readyz does not keeps the probe's cause: an apiserver that refuses
// watchsan's credentials stays "unauthorized", not "/readyz did not pass" at every other
// signal (which also logged a change of cause at every ping, ten times a second).
func TestPingKeepsTheProbesCause(t *testing.T) {
	p, b := oneBackendPool(t)
	if !b.pingable() {
		t.Fatal("an https backend is not pinged")
	}
	b.hc.liveness.Store(livenessAlive)
	refused := classify(errors.New("/readyz answered 401 to the lent identity: the apiserver does not authenticate it"), 401)
	b.hc.readyErr.Store(&readyError{refused}) // as probe records a 401
	b.hc.readiness.Store(readyNotReady)
	p.judge(b, nil) // a ping that passed, before the probe's own verdict
	if h := b.Health(); h.State != Degraded || h.LastError == nil || h.LastError.Kind != CauseUnauthorized {
		t.Fatalf("after a ping: %+v, want degraded for the probe's cause (unauthorized)", h)
	}
	p.judge(b, refused) // the probe's verdict
	p.judge(b, nil)     // and the next ping
	if h := b.Health(); h.State != Degraded || h.LastError.Kind != CauseUnauthorized {
		t.Fatalf("after the next ping: %+v, want the probe's cause kept", h)
	}
	b.hc.readyErr.Store(&readyError{nil}) // /readyz passes again
	b.hc.readiness.Store(readyOK)
	p.judge(b, nil)
	if h := b.Health(); h.State != Healthy {
		t.Fatalf("after /readyz passed: %+v, want healthy", h)
	}
}
