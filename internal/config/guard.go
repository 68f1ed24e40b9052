package config

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
	"k8s.io/client-go/rest"

	"github.com/watchsan/watchsan/internal/budget"
	"github.com/watchsan/watchsan/internal/watch"
)

// Defaults of the lending guard and the listener limits.
const (
	// DefaultAcceptHosts is kubectl proxy's --accept-hosts: only a Host (and an Origin) that
	// names this machine by its loopback name or address, so that a web page whose name was
	// rebound to 127.0.0.1 cannot use the lent identity.
	DefaultAcceptHosts = `^localhost$,^127\.0\.0\.1$,^\[::1\]$`
	// DefaultRejectPaths is kubectl proxy's --reject-paths (exec and attach run commands in a
	// container), plus the kubelet's own exec, attach and run endpoints reached through the
	// apiserver's nodes/proxy, which do the same. A controller rarely needs them; one that does
	// sets --reject-paths without them.
	DefaultRejectPaths = `^/api/.*/pods/.*/exec,^/api/.*/pods/.*/attach,^/api/v1/nodes/[^/]+/proxy/(exec|attach|run)(/|$)`
	// DefaultStripIdentityHeaders are the header names kube-apiserver's --requestheader-*
	// flags are set to in practice (kubeadm, the documentation): X-Remote-User, -Uid, -Group
	// and X-Remote-Extra-*.
	DefaultStripIdentityHeaders = "X-Remote-*"
	// DefaultIdleTimeout is kube-apiserver's own (and Go's http.DefaultTransport's, which
	// client-go uses): a client sees the same keep-alive behaviour as talking to the apiserver.
	DefaultIdleTimeout = 90 * time.Second
	// DefaultMaxConnections bounds the main listener's connections; lowered at start when the
	// open-file limit cannot hold them (FitConnections).
	DefaultMaxConnections = 1000
	// DefaultMaxConnectionsPerSource is the main listener's per-source connection limit in
	// frontend mode (--listen not on loopback): a tenth of the default --max-connections, so that
	// no one client holds them all.
	DefaultMaxConnectionsPerSource = 100
	// DefaultMaxHeaderConnectionsPerSource bounds one source's connections still sending a
	// request's headers in frontend mode: a client sends its headers at once, whatever it does
	// next; only a slow (slowloris) one keeps this many waiting.
	DefaultMaxHeaderConnectionsPerSource = 32
	// DefaultHTTP2MaxStreams is kube-apiserver's default streams per HTTP/2 connection.
	DefaultHTTP2MaxStreams = 100
	// DefaultClientHTTP2WriteByteTimeout closes an HTTP/2 client connection that took no byte
	// for this long while watchsan had some to send: the default --watch-write-timeout, so
	// that a client that stopped reading loses its connection when its watches would be cut,
	// not when it closes it (the cut's RST_STREAM cannot be written on a full socket).
	DefaultClientHTTP2WriteByteTimeout = 30 * time.Second
	// DefaultClientHTTP2PingInterval and DefaultClientHTTP2PingTimeout are client-go's own
	// health check of its HTTP/2 connections (ReadIdleTimeout 30 s, PingTimeout 15 s), done by
	// watchsan on its clients' connections: a client whose stream windows are spent and that
	// reads nothing more is found by its unanswered ping, since no byte waits to be written.
	DefaultClientHTTP2PingInterval = 30 * time.Second
	DefaultClientHTTP2PingTimeout  = 15 * time.Second
	// DefaultMaxRequestHeaderBytes bounds one request's header list: real clients send a few
	// KiB, an OIDC bearer token with its groups up to about 10 KiB; 64 KiB is Envoy's and an
	// AWS load balancer's limit (60 and 64 KiB), six such tokens, a sixteenth of
	// kube-apiserver's 1 MiB (Go's default), which let 400 anonymous requests just under it
	// grow watchsan by 565 MB.
	DefaultMaxRequestHeaderBytes = 64 << 10
	// DefaultMaxHeaderBytesPerConnection bounds the header bytes of one connection's requests
	// in progress: 100 watches (the streams of one HTTP/2 connection) with a 10 KiB token each,
	// or 16 requests at the limit.
	DefaultMaxHeaderBytesPerConnection = 1 << 20
	// DefaultMaxHeaderBytesPerSource bounds one source's in frontend mode: 16 connections'
	// worth, 1,600 watches with a 10 KiB token, 8,000 with a 2 KiB one.
	DefaultMaxHeaderBytesPerSource = 16 << 20
	// AdminMaxConnections bounds the admin listener on its own, so that /healthz and /metrics
	// answer while the main listener is saturated.
	AdminMaxConnections = 64
	// maxHeaderTimeout bounds the wait for a request's headers (kube-apiserver: 32 s).
	maxHeaderTimeout = 30 * time.Second
	// fdReserve is kept free of client connections: the admin listener's, log files, health
	// probes, the listeners themselves.
	fdReserve = AdminMaxConnections + 64
)

// Guard is the lending guard, compiled: what a request that would get the lent identity must
// satisfy. The zero value accepts everything.
type Guard struct {
	// On says whether watchsan lends at all; the guard applies only then.
	On            bool
	AcceptHosts   []*regexp.Regexp
	RejectPaths   []*regexp.Regexp
	RejectMethods []*regexp.Regexp
	// StripHeaders are canonical header names; StripPrefixes canonical prefixes.
	StripHeaders  []string
	StripPrefixes []string
}

// regexList compiles a comma-separated list of regular expressions, as kubectl proxy does;
// empty entries are skipped, so "" is the empty list.
func regexList(s string) ([]*regexp.Regexp, error) { return compileList(s, "") }

// denyList is regexList for a list of what is refused: "." matches a newline too (flag s), so
// that a path with an encoded newline (%0A) in it cannot slip past a ".*" (an
// apiserver rejects such names today, which is no reason for the guard to depend on it).
func denyList(s string) ([]*regexp.Regexp, error) { return compileList(s, "(?s)") }

func compileList(s, flags string) ([]*regexp.Regexp, error) {
	var out []*regexp.Regexp
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		re, err := regexp.Compile(flags + e)
		if err != nil {
			return nil, err
		}
		out = append(out, re)
	}
	return out, nil
}

// headerList parses a comma-separated list of header names, each possibly ending in "*".
func headerList(s string) (names, prefixes []string, err error) {
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		name, prefix := strings.CutSuffix(e, "*")
		if name == "" || !httpguts.ValidHeaderFieldName(name) {
			return nil, nil, fmt.Errorf("%q is not a header name (or a prefix ending in *)", e)
		}
		if prefix {
			prefixes = append(prefixes, http.CanonicalHeaderKey(name))
		} else {
			names = append(names, http.CanonicalHeaderKey(name))
		}
	}
	return names, prefixes, nil
}

// validateGuard adds the problems of the guard and listener-limit flags.
func (c *Config) validateGuard(add func(format string, a ...any)) {
	for _, f := range []struct{ flag, v string }{
		{"accept-hosts", c.AcceptHosts}, {"reject-paths", c.RejectPaths}, {"reject-methods", c.RejectMethods},
	} {
		if _, err := denyList(f.v); err != nil {
			add("--%s %q: %w", f.flag, f.v, err)
		}
	}
	if _, _, err := headerList(c.StripIdentityHeaders); err != nil {
		add("--strip-identity-headers: %w", err)
	}
	for _, u := range c.AllowCredentialsToUpstream {
		if _, err := parseUpstream(u); err != nil {
			add("--allow-credentials-to-upstream %q: %w", u, err)
		}
	}
	if c.IdleTimeout <= 0 {
		add("--idle-timeout %s: must be positive", c.IdleTimeout)
	}
	if c.MaxConnections < 1 {
		add("--max-connections %d: must be positive", c.MaxConnections)
	}
	for _, f := range []struct {
		flag string
		v    int
	}{{"max-connections-per-source", c.MaxConnectionsPerSource}, {"max-header-connections-per-source", c.MaxHeaderConnectionsPerSource}} {
		if f.v < -1 {
			add("--%s %d: want a limit, 0 (the frontend-mode default) or -1 (none)", f.flag, f.v)
		}
	}
	if c.HTTP2MaxStreams < 1 || c.HTTP2MaxStreams > 1<<20 {
		add("--http2-max-streams-per-connection %d: want 1 to 1048576", c.HTTP2MaxStreams)
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"client-http2-write-byte-timeout", c.ClientHTTP2WriteByteTimeout}, {"client-http2-ping-interval", c.ClientHTTP2PingInterval}} {
		if d.v < 0 {
			add("--%s %s: want a duration, or 0 for none", d.flag, d.v)
		}
	}
	if c.ClientHTTP2PingTimeout <= 0 {
		add("--client-http2-ping-timeout %s: must be positive", c.ClientHTTP2PingTimeout)
	}
	// kube-apiserver refuses more than 1 MiB; less than 4 KiB refuses real clients.
	if c.MaxRequestHeaderBytes < 4<<10 || c.MaxRequestHeaderBytes > 1<<20 {
		add("--max-request-header-bytes %d: want 4096 to 1048576", c.MaxRequestHeaderBytes)
	}
	// An anonymous request gets half a budget: it must hold one request at the limit.
	if v := c.MaxHeaderBytesPerConnection; v != 0 && (v < 2*c.MaxRequestHeaderBytes || v > 1<<30) {
		add("--max-header-bytes-per-connection %d: want 0 (none) or twice --max-request-header-bytes (%d) to 1073741824", v, 2*c.MaxRequestHeaderBytes)
	}
	if v := c.MaxHeaderBytesPerSource; v < -1 || v > 0 && (v < 2*c.MaxRequestHeaderBytes || v > 1<<30) {
		add("--max-header-bytes-per-source %d: want 0 (the frontend-mode default), -1 (none) or twice --max-request-header-bytes (%d) to 1073741824", v, 2*c.MaxRequestHeaderBytes)
	}
}

// completeGuard compiles the guard (validated before).
func (c *Config) completeGuard(lend bool) Guard {
	// (The per-source limits go with the listener limits: see Complete.)
	g := Guard{On: lend}
	g.AcceptHosts, _ = regexList(c.AcceptHosts)
	g.RejectPaths, _ = denyList(c.RejectPaths)
	g.RejectMethods, _ = denyList(c.RejectMethods)
	g.StripHeaders, g.StripPrefixes, _ = headerList(c.StripIdentityHeaders)
	return g
}

// sourceLimit resolves a per-source limit flag: 0 is def in frontend mode (listen not on
// loopback) and none on loopback, where every client is this machine (a sidecar's or a
// node's); -1 is none; 0 in the result is none.
func sourceLimit(v, def int, listen string) int {
	switch {
	case v > 0:
		return v
	case v == 0 && !IsLoopback(listen):
		return def
	}
	return 0
}

// HeaderTimeout is how long the main listener waits for a request's headers: the idle timeout
// when it is shorter than 30 s (a connection that says nothing is as idle as one between
// requests), else 30 s.
func (c *Completed) HeaderTimeout() time.Duration { return min(c.IdleTimeout, maxHeaderTimeout) }

// FitConnections returns the main listener's connection limit for an open-file limit of nofile
// (0: unknown), and a warning when the configured one had to be lowered. Each client
// connection may hold one upstream connection too (an upgrade, or any request to a plain-HTTP
// upstream), and fdReserve descriptors stay free for the admin listener and everything else,
// so that a client that holds every connection it may cannot take the admin listener down.
func FitConnections(configured int, nofile uint64) (int, string) {
	if nofile == 0 || nofile > 1<<30 {
		return configured, ""
	}
	fit := 16
	if nofile > fdReserve+2*16 {
		fit = int(nofile-fdReserve) / 2
	}
	if configured <= fit {
		return configured, ""
	}
	return fit, fmt.Sprintf("--max-connections %d lowered to %d: the open-file limit is %d, and each client connection may need an upstream one too, with %d kept for the admin listener and the rest; raise the limit (ulimit -n) to allow more",
		configured, fit, nofile, fdReserve)
}

// FitRingTotal returns the bound of all shared feeds' rings together for --share-ring-total-bytes
// configured (0: derive it) and the container's memory limit memLimit (0: none known), and a
// warning when a configured one is above half the limit. Derived: a quarter of the limit, since
// the rings are one of several holders (subscribers' queues, watches' states, connections) and
// a heap at the limit's half leaves Go's collector room to double it (GOGC=100) before the
// container is killed; without a limit watchsan cannot know what it may hold, and takes
// watch.DefaultShareRingTotalBytes (docs/design.md section 11, "Bounds").
func FitRingTotal(configured, memLimit int64) (int64, string) {
	switch {
	case configured > 0 && memLimit > 0 && configured > memLimit/2:
		return configured, fmt.Sprintf("--share-ring-total-bytes %d is more than half the memory limit (%d): rings that full leave the collector no room, and the container may be killed", configured, memLimit)
	case configured > 0:
		return configured, ""
	case memLimit > 0:
		return max(memLimit/4, 1<<20), ""
	}
	return watch.DefaultShareRingTotalBytes, ""
}

// FitMemoryBudget returns the memory budget's total for --memory-budget-bytes configured (0:
// derive it) and the container's memory limit memLimit (0: none known), and a warning when a
// configured one is above three quarters of the limit. Derived: half the limit, which leaves
// the rest to what is not budgeted (the program, connections, the collector's headroom: Go's
// soft limit is set just under the container's, so the heap does not double past it); without
// a limit, budget.DefaultBytes (docs/design.md section 15).
func FitMemoryBudget(configured, memLimit int64) (int64, string) {
	switch {
	case configured > 0 && memLimit > 0 && configured > memLimit/4*3:
		return configured, fmt.Sprintf("--memory-budget-bytes %d is more than three quarters of the memory limit (%d): the container may be killed before the budget ends anything", configured, memLimit)
	case configured > 0:
		return configured, ""
	case memLimit > 0:
		return max(memLimit/2, 16<<20), ""
	}
	return budget.DefaultBytes, ""
}

// checkLending refuses, at start, to lend the identity to an upstream it does not belong to:
// one reached over plain HTTP (the token would cross the network in cleartext) or one the
// kubeconfig does not name (credentials issued for one server sent to another), unless
// --allow-credentials-to-upstream names it.
func checkLending(upstreams []*url.URL, rc *rest.Config, allowed []string) []error {
	allow := map[string]bool{}
	for _, a := range allowed {
		if u, err := parseUpstream(a); err == nil {
			allow[sameServerKey(u)] = true
		}
	}
	var own string
	if u, err := parseUpstream(strings.TrimSuffix(rc.Host, "/")); err == nil {
		own = sameServerKey(u)
	}
	var errs []error
	for _, u := range upstreams {
		key := sameServerKey(u)
		if allow[key] {
			continue
		}
		switch {
		case u.Scheme == "http":
			errs = append(errs, fmt.Errorf("upstream %s is plain HTTP: the kubeconfig's credentials would cross the network in cleartext; use https, pass --no-credentials, or accept this with --allow-credentials-to-upstream=%s", u, u))
		case key != own:
			errs = append(errs, fmt.Errorf("upstream %s is not the kubeconfig's server %s: its credentials would be lent to a server they were not issued for; use the kubeconfig's server, pass --no-credentials, or accept this with --allow-credentials-to-upstream=%s", u, rc.Host, u))
		}
	}
	for _, a := range allowed {
		u, err := parseUpstream(a)
		if err != nil {
			continue // reported by Validate
		}
		found := false
		for _, up := range upstreams {
			found = found || sameServerKey(up) == sameServerKey(u)
		}
		if !found {
			errs = append(errs, fmt.Errorf("--allow-credentials-to-upstream %s names no upstream", a))
		}
	}
	return errs
}

// sameServerKey is a URL as a server identity: scheme, lower-case host, explicit port, path.
func sameServerKey(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return u.Scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port) + strings.TrimSuffix(u.Path, "/")
}

// warnings lists what is allowed but unsafe, for the log at start.
func (out *Completed) warnings(nofile uint64, memLimit int64) {
	c := out.Config
	if c.InsecureSkipTLSVerify {
		out.Warnings = append(out.Warnings, "--insecure-skip-tls-verify: the upstream's certificate is not verified; anyone on the path can read and change traffic, credentials included")
	} else if out.Credentials != nil && out.Credentials.Insecure && out.UpstreamCA == nil {
		out.Warnings = append(out.Warnings, "the kubeconfig sets insecure-skip-tls-verify: the upstream's certificate is not verified; anyone on the path can read and change traffic, credentials included (pass --upstream-ca-file to verify it)")
	}
	out.adminAuthWarnings()
	var w string
	if out.MaxConnections, w = FitConnections(c.MaxConnections, nofile); w != "" {
		out.Warnings = append(out.Warnings, w)
	}
	if out.ShareRingTotalBytes, w = FitRingTotal(c.ShareRingTotalBytes, memLimit); w != "" {
		out.Warnings = append(out.Warnings, w)
	}
	out.MemoryLimit = memLimit
	if out.MemoryBudget, w = FitMemoryBudget(c.MemoryBudgetBytes, memLimit); w != "" {
		out.Warnings = append(out.Warnings, w)
	}
	if out.Guard.On {
		host, _, _ := net.SplitHostPort(c.Listen)
		if h := HostForMatch(host); host != "" && !isUnspecified(host) && !MatchAny(out.Guard.AcceptHosts, h) {
			out.Warnings = append(out.Warnings, fmt.Sprintf("--listen %s: requests that name it (Host: %s) will be refused unless they carry their own credentials; add it to --accept-hosts", c.Listen, h))
		}
	}
}

func isUnspecified(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// HostForMatch is a host name as --accept-hosts matches it (at start and in the server's guard): lower case, without a port, an
// IPv6 address in brackets ("[::1]", as kubectl proxy's default expects; kubectl itself strips
// the brackets along with the port, so its own default never matches "[::1]:8001").
func HostForMatch(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	h = strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"))
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	return h
}

// MatchAny reports whether any of res matches s.
func MatchAny(res []*regexp.Regexp, s string) bool {
	for _, re := range res {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}
