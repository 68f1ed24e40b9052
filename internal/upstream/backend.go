package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// State is a backend's health verdict.
type State int32

const (
	// Unknown: no probe has answered yet. An unknown backend is tried (it is not known to be
	// bad), but it does not make watchsan ready. One added by a reload is not tried until its
	// first probe answers.
	Unknown State = iota
	// Healthy: it answers (pings, when it speaks HTTP/2) and its /readyz passes.
	Healthy
	// Degraded: it is alive but not ready: /readyz answered a 5xx (an apiserver shutting down,
	// or one whose etcd check fails while its watch cache still serves), or it answers pings
	// while /readyz takes longer than the probe timeout. Requests go to it only when no backend
	// is healthy or unknown (a proxy must not refuse what the apiserver would serve); its
	// watches move to healthy backends at the drain rate.
	Degraded
	// Unhealthy: it does not answer at all (pings and probes time out, or connections are
	// refused). Requests do not go to it; only the health checker dials it, with backoff, until
	// it answers again. Its watches move at once.
	Unhealthy
	// Removed: no longer in the configured or discovered set. It gets no new request; its
	// watches move at the drain rate, and it is forgotten once they have.
	Removed
)

var stateNames = [...]string{Unknown: "unknown", Healthy: "healthy", Degraded: "degraded", Unhealthy: "unhealthy", Removed: "removed"}

func (s State) String() string {
	if int(s) < len(stateNames) && s >= 0 {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// States lists every state (to initialise metric series).
func States() []State { return []State{Unknown, Healthy, Degraded, Unhealthy, Removed} }

// Backend is one apiserver. It is read-only to everyone but the owners of its parts, each
// the one file that writes them (docs/design.md section 10.11): the membership (pool.go), the
// health checker (health.go), the outlier detector (outlier.go), the attempts (attempt.go,
// frozen.go), the leases (lease.go) and the known floors (servable.go). Everyone else asks
// through their methods; selection (select.go) and the mover (mover.go) only read.
type Backend struct {
	// URL is the apiserver's base URL (scheme, host, optional path prefix). Set by newBackend
	// (pool.go), never written after; nor are the fields down to kick.
	URL  *url.URL
	name string
	t    *transports
	pool *Pool
	ping *pinger // nil: not https; its probes alone tell whether it answers
	// spare pings on a fresh connection when ping's has no answer soon (Pool.ping); set with
	// ping.
	spare *pinger
	// late: added by a reload; not tried before its first probe answers.
	late bool
	// kick wakes the health loop for an early re-check (health.go sends, at most one waits).
	kick chan struct{}

	// hc is its health: state, liveness, readiness, signs of life, the recorded cause.
	// Written by health.go alone; zero: Unknown, nothing heard.
	hc healthState
	// lag is the outlier detector's verdict (lagging until when). Written by outlier.go
	// alone; zero: not lagging.
	lag outlierState
	// inflight counts short requests sent and not yet finished. Written by attempt.go alone
	// (Attempter.send and its Cancel); zero: none.
	inflight atomic.Int64
	// waiting are short requests' attempts waiting for response headers. Written by frozen.go
	// alone (wait, cutAll); zero: none.
	waiting waiters
	// leases are its open watch attempts. Written by lease.go alone; zero: none.
	leases leaseSet
	// servable is from which resourceVersions it serves watches. Written by servable.go
	// alone (NoteTooOld); zero: any.
	servable servable
	// member is its place in the pool (removal, health loop). Written by pool.go alone; zero:
	// not removed, no loop started.
	member membership
}

// String names the backend in logs and metrics (scheme://host[/prefix], no credentials).
func (b *Backend) String() string { return b.name }

// State reports the backend's health verdict.
func (b *Backend) State() State { return State(b.hc.state.Load()) }

// InFlight reports the short requests sent to it and not finished (metrics).
func (b *Backend) InFlight() int64 { return b.inflight.Load() }

// OpenWatches reports the watch attempts open on it (metrics).
func (b *Backend) OpenWatches() int64 { return b.leases.count.Load() }

// usable says whether requests may go to it.
func (b *Backend) usable() bool { return usableAs(b.State(), b.late) }

// preferredAs says whether requests go to a backend in state s, late or not (added by a
// reload), lagging or not, when there is a choice; usableAs, whether they may.
func preferredAs(s State, late, lagging bool) bool {
	switch s {
	case Healthy:
		return !lagging
	case Unknown:
		return !late && !lagging
	}
	return false
}

func usableAs(s State, late bool) bool {
	switch s {
	case Unhealthy, Removed:
		return false
	case Unknown:
		return !late
	}
	return true
}

// Send sends req (whose URL must already point at this backend) with the credentials cred,
// decided on the client's request (Decide): its own Authorization, the identity of its
// verified certificate, watchsan's lent identity, or none. A failed dial marks the backend
// unhealthy at once.
func (b *Backend) Send(req *http.Request, cred Credentials) (*http.Response, error) {
	return b.send(req, cred, true)
}

// send is Send; passive says whether a failed dial is a health verdict (not for the health
// checker's own probes: it judges those itself).
func (b *Backend) send(req *http.Request, cred Credentials, passive bool) (*http.Response, error) {
	resp, err := b.t.roundTrip(req, cred, IsUpgrade(req.Header))
	if err == nil {
		b.alive()
	} else if passive && IsDialError(err) && req.Context().Err() == nil {
		b.refused(err)
	}
	return resp, err
}

// IsUpgrade reports whether a request asks for a protocol upgrade (Connection: Upgrade): exec,
// attach and port-forward over SPDY or WebSocket. Such requests go over HTTP/1.1.
func IsUpgrade(h http.Header) bool {
	return httpguts.HeaderValuesContainsToken(h["Connection"], "upgrade") && h.Get("Upgrade") != ""
}

// Target rewrites u (a request URL of the client's) to this backend, keeping path and query.
func (b *Backend) Target(u *url.URL) *url.URL {
	out := *b.URL
	out.Path = b.URL.Path + u.Path
	if u.RawPath != "" {
		out.RawPath = b.URL.EscapedPath() + u.RawPath
	} else {
		out.RawPath = ""
	}
	out.RawQuery = u.RawQuery
	return &out
}

// Probe asks the backend's /readyz whether it serves, within timeout, over the health
// checker's own connections, with the probe identity, else the kubeconfig's when it is lent
// or impersonates, else none. An answer below 500 passes here; the status code is returned
// with the verdict, and the caller weighs a 401 or 403 (health.go, docs/design.md section
// 10.6).
func (b *Backend) Probe(ctx context.Context, timeout time.Duration) (int, error) {
	ctx, cancel := withTimeout(ctx, b.pool.clk, timeout) // on the pool's clock (clockctx.go)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.Target(&url.URL{Path: "/readyz"}).String(), nil)
	if err != nil {
		return 0, err
	}
	resp, err := b.t.probe.RoundTrip(req) // never on the client requests' connections (section 10.5)
	if err != nil {
		return 0, err
	}
	b.alive()
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode >= 500 {
		return resp.StatusCode, fmt.Errorf("%s/readyz answered %d", b, resp.StatusCode)
	}
	return resp.StatusCode, nil
}

// IsDialError reports a failure to connect: nothing of the request reached the upstream.
func IsDialError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// SetForwarded sets the X-Forwarded-* headers of out, a request to an upstream, from in, the
// client's request: the one way every path (pass-through and watch) builds them. The client's
// X-Forwarded-For chain is kept and its address appended; X-Forwarded-Host and -Proto are what
// watchsan saw, never what the client sent; a client's Forwarded (RFC 7239) is dropped, as
// httputil.ReverseProxy drops it on the pass-through path.
func SetForwarded(out, in *http.Request) {
	prior := in.Header.Values("X-Forwarded-For")
	for _, k := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
		out.Header.Del(k)
	}
	if len(prior) > 0 {
		out.Header["X-Forwarded-For"] = append([]string(nil), prior...)
	}
	(&httputil.ProxyRequest{In: in, Out: out}).SetXForwarded()
}
