package upstream

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Why a backend is not healthy, said where an operator looks (docs/design.md section 10.10):
// its /readyz, the 503 a client gets when no backend is usable, the status page and the log
// line of each change. Only the health checker (health.go) writes it, through record; every
// reader takes a Health snapshot.

// CauseKind classifies the last error of a backend.
type CauseKind string

// The kinds of cause, each named for what an operator checks.
const (
	// CauseTLS: the TLS handshake failed, usually the upstream's certificate is not signed by
	// the CA watchsan trusts (--upstream-ca-file, the kubeconfig's) or does not name the host.
	CauseTLS CauseKind = "tls"
	// CauseRefused: nothing listens at the address (connection refused).
	CauseRefused CauseKind = "refused"
	// CauseDNS: the upstream's host name does not resolve.
	CauseDNS CauseKind = "dns"
	// CauseTimeout: no answer in time (a dial, a ping, a /readyz probe).
	CauseTimeout CauseKind = "timeout"
	// CauseUnauthorized: /readyz answered 401 to watchsan's own credentials (the probe or
	// lent identity): its token expired, was revoked, or its certificate is not trusted.
	CauseUnauthorized CauseKind = "unauthorized"
	// CauseForbidden: /readyz answered 403 to watchsan's own credentials (also what a
	// restarting apiserver answers until its authorizer has synced, section 10.6).
	CauseForbidden CauseKind = "forbidden"
	// CauseHTTP: /readyz answered another error status (a 5xx: not ready).
	CauseHTTP CauseKind = "http"
	// CauseOther: anything else (a reset, a GOAWAY, no answer to an HTTP/2 PING).
	CauseOther CauseKind = "other"
)

// Cause is a backend's last error, classified. It is an error whose text says the kind first.
type Cause struct {
	Kind CauseKind
	// Code is the HTTP status /readyz answered; 0: no answer.
	Code int
	// Err is the error as it came, without credentials (Go's net and TLS errors name
	// addresses and certificates' subjects, never their contents).
	Err string
}

func (c *Cause) Error() string {
	return string(c.Kind) + ": " + strings.TrimPrefix(c.Err, string(c.Kind)+": ") + c.hint()
}

// hint says what to check, for the kinds whose error text does not.
func (c *Cause) hint() string {
	switch c.Kind {
	case CauseTLS:
		return " (check the CA that verifies the upstream: --upstream-ca-file, else the kubeconfig's)"
	case CauseUnauthorized:
		return " (watchsan's own credentials were refused: is its token expired or revoked?)"
	case CauseRefused:
		return " (nothing listens there)"
	}
	return ""
}

// classify turns a health check's error, and the HTTP status that came with it (0: none),
// into a Cause; a Cause stays as it is.
func classify(err error, code int) *Cause {
	var c *Cause
	if errors.As(err, &c) {
		return c
	}
	c = &Cause{Code: code, Err: err.Error()}
	var (
		dnsErr   *net.DNSError
		unknown  x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		invalid  x509.CertificateInvalidError
		verify   *tls.CertificateVerificationError
		alert    tls.AlertError
		header   tls.RecordHeaderError
		netErr   net.Error
		errorsIs = func(t error) bool { return errors.Is(err, t) }
	)
	switch {
	case code == 401:
		c.Kind = CauseUnauthorized
	case code == 403:
		c.Kind = CauseForbidden
	case code != 0:
		c.Kind = CauseHTTP
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &hostErr), errors.As(err, &invalid),
		errors.As(err, &alert), errors.As(err, &header), strings.Contains(c.Err, "tls: "):
		c.Kind = CauseTLS
	case errorsIs(syscall.ECONNREFUSED):
		c.Kind = CauseRefused
	case errors.As(err, &dnsErr):
		c.Kind = CauseDNS
	case errorsIs(context.DeadlineExceeded), errorsIs(os.ErrDeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		c.Kind = CauseTimeout
	default:
		c.Kind = CauseOther
	}
	return c
}

// Health is a snapshot of what the health checker last found of a backend.
type Health struct {
	// State is the backend's state, StateSince when it took it (zero: it never changed
	// since the backend was made).
	State      State
	StateSince time.Time
	// LastError is the health checker's last error, nil when there was none; it is kept
	// after a recovery. ErrorSince is when an error of its kind began, ErrorAt the last
	// time it was seen.
	LastError  *Cause
	ErrorSince time.Time
	ErrorAt    time.Time
}

// healthRecord is a backend's Health, written by the health checker (record) alone.
type healthRecord struct {
	mu   sync.Mutex // serializes record: the ping loop, a probe and a refused request may judge at once
	snap atomic.Pointer[Health]
}

// Health reports what the health checker last found of b.
func (b *Backend) Health() Health {
	h := Health{State: b.State()}
	if s := b.hc.record.snap.Load(); s != nil {
		h = *s
		h.State = b.State() // the state may have changed by a reload (added, removed) since
	}
	return h
}

// describe names b's state, since when, and its last error when it is not healthy.
func (h Health) describe(now time.Time) string {
	s := h.State.String()
	if !h.StateSince.IsZero() {
		s += fmt.Sprintf(" since %s (%v)", h.StateSince.UTC().Format(time.RFC3339), now.Sub(h.StateSince).Round(time.Second))
	}
	if h.LastError != nil && h.State != Healthy {
		s += ": " + h.LastError.Error()
	}
	return s
}

// Describe is describe at the present time, for readiness and the status page.
func (h Health) Describe() string { return h.describe(time.Now()) }
