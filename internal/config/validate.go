package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/upstream"
)

// Validate checks c on its own (files named must exist and parse) and returns every problem
// found, joined, or nil.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	for _, l := range []struct{ flag, addr string }{{"listen", c.Listen}, {"admin-listen", c.AdminListen}} {
		if err := checkHostPort(l.addr); err != nil {
			add("--%s %q: %w", l.flag, l.addr, err)
		}
	}
	if c.Listen == c.AdminListen && c.Listen != "" && !strings.HasSuffix(c.Listen, ":0") {
		add("--listen and --admin-listen must differ (both %q)", c.Listen)
	}
	switch {
	case (c.TLSCertFile == "") != (c.TLSKeyFile == ""):
		add("--tls-cert-file and --tls-private-key-file go together")
	case c.TLSCertFile != "":
		if _, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile); err != nil {
			add("--tls-cert-file/--tls-private-key-file: %w", err)
		}
	}
	for _, u := range c.Upstreams {
		if _, err := parseUpstream(u); err != nil {
			add("--upstream %q: %w", u, err)
		}
	}
	if c.UpstreamCAFile != "" {
		if _, err := loadCA(c.UpstreamCAFile); err != nil {
			add("--upstream-ca-file: %w", err)
		}
		if c.InsecureSkipTLSVerify {
			add("--upstream-ca-file and --insecure-skip-tls-verify exclude each other")
		}
	}
	if c.Kubeconfig != "" {
		if _, err := os.Stat(c.Kubeconfig); err != nil {
			add("--kubeconfig: %w", err)
		}
	}
	if m, err := fix.ParseMode(c.FixMode); err != nil || m == fix.PassAll {
		add("--fix-mode %q: want repair or observe", c.FixMode)
	}
	for _, l := range []struct {
		flag   string
		values []string
	}{{"fix-exempt-resource", c.FixExemptResources}, {"share-exclude-resource", c.ShareExcludeResources}} {
		for _, r := range l.values {
			gr, err := reqinfo.ParseGroupResource(r)
			if err == nil {
				err = reqinfo.CheckBuiltin(gr)
				if err != nil {
					err = fmt.Errorf("%q: %w", r, err)
				}
			}
			if err != nil {
				add("--%s %w", l.flag, err)
			}
		}
	}
	if c.MaxFrameSize < 1024 || c.MaxFrameSize > 1<<30 {
		add("--max-frame-size %d: want 1024 to 1073741824 bytes", c.MaxFrameSize)
	}
	if c.DeleteMemoryEntries < 1 {
		add("--delete-memory-entries %d: must be positive", c.DeleteMemoryEntries)
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"dial-timeout", c.DialTimeout}, {"tls-handshake-timeout", c.TLSHandshakeTimeout},
		{"http2-read-idle-timeout", c.HTTP2ReadIdleTimeout}, {"http2-ping-timeout", c.HTTP2PingTimeout},
		{"response-header-timeout", c.ResponseHeaderTimeout}, {"health-interval", c.HealthInterval},
		{"delete-memory-ttl", c.DeleteMemoryTTL}, {"watch-resume-timeout", c.WatchResumeTimeout},
		{"watch-stall-timeout", c.WatchStallTimeout}, {"watch-write-timeout", c.WatchWriteTimeout},
		{"watch-max-lifetime", c.WatchMaxLifetime},
		{"shutdown-timeout", c.ShutdownTimeout},
	} {
		if d.v <= 0 {
			add("--%s %s: must be positive", d.flag, d.v)
		}
	}
	// Why: a stall resumes a watch without backoff (a quiet watch is silent for good reason,
	// docs/design.md section 2), so this is how often every quiet watch sends a request upstream.
	if c.WatchStallTimeout > 0 && c.WatchStallTimeout < time.Second {
		add("--watch-stall-timeout %s: use at least 1s: every quiet watch is resumed once per stall timeout", c.WatchStallTimeout)
	}
	// Why: every client without a timeoutSeconds re-watches once per lifetime; 0 would be a
	// watch kept for ever, which no apiserver keeps either (docs/design.md section 2).
	if c.WatchMaxLifetime > 0 && c.WatchMaxLifetime < 10*time.Second {
		add("--watch-max-lifetime %s: use at least 10s: every client watch without timeoutSeconds re-watches once per lifetime", c.WatchMaxLifetime)
	}
	if c.HTTP2StreamWindow < 16<<10 || c.HTTP2StreamWindow > 1<<30 {
		add("--upstream-http2-stream-window %d: want 16384 to 1073741824 bytes", c.HTTP2StreamWindow)
	}
	if c.HTTP2ConnectionWindow < max(c.HTTP2StreamWindow, 64<<10) || c.HTTP2ConnectionWindow > 1<<30 {
		add("--upstream-http2-connection-window %d: want at least --upstream-http2-stream-window (%d) and at most 1073741824 bytes", c.HTTP2ConnectionWindow, c.HTTP2StreamWindow)
	}
	for _, b := range []struct {
		flag string
		v    int
	}{{"share-ring-bytes", c.ShareRingBytes}, {"share-ring-events", c.ShareRingEvents}, {"share-subscriber-buffer-bytes", c.ShareSubscriberBufferBytes}, {"share-access-review-cache-entries", c.ShareReviewCacheEntries},
		{"watch-absorb-state-bytes", c.WatchAbsorbStateBytes}, {"watch-absorb-total-bytes", c.WatchAbsorbTotalBytes}} {
		if b.v < 1 || b.v > 1<<30 {
			add("--%s %d: want 1 to 1073741824", b.flag, b.v)
		}
	}
	if c.MemoryBudgetBytes != 0 && (c.MemoryBudgetBytes < 16<<20 || c.MemoryBudgetBytes > 1<<40) {
		add("--memory-budget-bytes %d: want 0 (from the memory limit) or 16777216 (16 MiB) to 1099511627776", c.MemoryBudgetBytes)
	}
	if c.ShareRingTotalBytes < 0 || c.ShareRingTotalBytes > 1<<40 {
		add("--share-ring-total-bytes %d: want 0 (from the memory limit) to 1099511627776", c.ShareRingTotalBytes)
	}
	// Why 0 is refused: --share-watches=false is how sharing is turned off, and a cap of 0
	// would leave it on while no watch shares.
	if c.ShareMaxFeeds < 1 || c.ShareMaxFeeds > 1000000 {
		add("--share-max-feeds %d: want 1 to 1000000", c.ShareMaxFeeds)
	}
	if c.CoalesceMaxMembers < 1 || c.CoalesceMaxMembers > 1000000 {
		add("--coalesce-max-members %d: want 1 to 1000000", c.CoalesceMaxMembers)
	}
	if c.CoalesceMaxGroups < 1 || c.CoalesceMaxGroups > 1000000 {
		add("--coalesce-max-groups %d: want 1 to 1000000", c.CoalesceMaxGroups)
	}
	// Why at least 64 KiB: the reader reads 32 KiB chunks; a bound below two of them would end
	// members that are merely one chunk behind.
	if c.CoalesceLagBytes < 64<<10 || c.CoalesceLagBytes > 1<<30 {
		add("--coalesce-lag-bytes %d: want 65536 to 1073741824", c.CoalesceLagBytes)
	}
	if c.CoalesceTotalBytes < int64(c.CoalesceLagBytes) || c.CoalesceTotalBytes > 64<<30 {
		add("--coalesce-total-bytes %d: want --coalesce-lag-bytes (%d) to 68719476736", c.CoalesceTotalBytes, c.CoalesceLagBytes)
	}
	// Why: a joiner takes the events after its resourceVersion in one go; a buffer smaller
	// than one event of the largest size would end every subscriber at its first big event.
	if c.ShareSubscriberBufferBytes > 0 && c.ShareSubscriberBufferBytes < c.MaxFrameSize {
		add("--share-subscriber-buffer-bytes %d: want at least --max-frame-size (%d): a subscriber must hold one event", c.ShareSubscriberBufferBytes, c.MaxFrameSize)
	}
	if c.KeepAlive < 0 {
		add("--tcp-keepalive %s: must not be negative", c.KeepAlive)
	}
	if c.RetryBudget < 0 {
		add("--retry-budget %s: must not be negative", c.RetryBudget)
	}
	c.validateGuard(add)
	c.validateIdentity(add)
	c.AdminAuthConfig.validate(add)
	if c.ShutdownDelay < 0 {
		add("--shutdown-delay %s: must not be negative", c.ShutdownDelay)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		add("--log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	switch c.LogFormat {
	case "", "json", "console":
	default:
		add("--log-format %q: want console or json (empty: console on a terminal, else json)", c.LogFormat)
	}
	c.HA.validate(add)
	c.Replicas.validate(add)
	return errors.Join(c.locate(errs)...)
}

// flagNamed is the flag a problem begins with ("--max-frame-size 5: ...").
var flagNamed = regexp.MustCompile(`^--([a-z0-9-]+)`)

// locate puts where the --config file set a flag before each problem that begins with that
// flag, so a problem in a file names the file and line, not only a flag the user never typed.
func (c *Config) locate(errs []error) []error {
	if len(c.FileLines) == 0 {
		return errs
	}
	out := make([]error, len(errs))
	for i, err := range errs {
		out[i] = err
		if m := flagNamed.FindStringSubmatch(err.Error()); m != nil {
			if where, ok := c.FileLines[m[1]]; ok {
				out[i] = fmt.Errorf("--config %s: %w", where, err)
			}
		}
	}
	return out
}

func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("bad port %q", port)
	}
	return nil
}

func parseUpstream(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("scheme must be http or https")
	}
	if u.Host == "" {
		return nil, fmt.Errorf("no host")
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("no query, fragment or user info allowed")
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return u, nil
}

func loadCA(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s: no PEM certificate found", path)
	}
	return pool, nil
}

// IsLoopback reports whether a listen address accepts connections only from this host.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Completed is a validated Config with everything resolved that Run needs.
type Completed struct {
	Config
	// Upstreams are the apiserver base URLs, at least one.
	Upstreams []*url.URL
	// Credentials is the kubeconfig's (or in-cluster) config whose TLS settings and identity are
	// used upstream; nil when none was loaded.
	Credentials *rest.Config
	// ProbeCredentials is --probe-kubeconfig's config, the identity /readyz probes go as; nil
	// when not given.
	ProbeCredentials *rest.Config
	// Lend says whether requests without an Authorization header get Credentials' identity.
	Lend bool
	// UpstreamCA verifies upstream serving certificates; nil means Credentials' CA or the
	// system roots.
	UpstreamCA *x509.CertPool
	// Fix is Config.FixMode parsed.
	Fix fix.Mode
	// Guard is the lending guard, compiled; Guard.On when Lend.
	Guard Guard
	// Identity is Config.IdentityForwarding parsed: how a verified client certificate's
	// identity goes upstream (upstream.IdentityOff: it does not, and Lend may be on).
	Identity upstream.IdentityMode
	// FrontProxyCert is watchsan's front-proxy client certificate with
	// upstream.IdentityRequestHeader; nil otherwise.
	FrontProxyCert *tls.Certificate
	// MaxConnections is the main listener's connection limit in effect: Config.MaxConnections,
	// lowered to fit the open-file limit (FitConnections).
	MaxConnections int
	// SourceConnections and SourceHeaderConnections are the per-source limits in effect (0:
	// none): of one source's connections, and of those still sending a request's headers.
	SourceConnections, SourceHeaderConnections int
	// AdminAuth is the admin listener's authentication in effect (adminauth.go); the zero
	// value checks nothing.
	AdminAuth AdminAuth
	// SourceHeaderBytes is the per-source header budget in effect (0: none):
	// Config.MaxHeaderBytesPerSource resolved as the per-source limits are.
	SourceHeaderBytes int
	// MemoryBudget is the memory budget's total in effect (FitMemoryBudget); MemoryLimit the
	// container's memory limit found (0: none), which Run makes Go's soft memory limit.
	MemoryBudget, MemoryLimit int64
	// Warnings are what is allowed but unsafe, or was adjusted; logged at start.
	Warnings []string
}

// openFileLimit reads the process's open-file limit (0: unknown), memoryLimit its
// container's memory limit (0: none or unknown; limits_linux.go); tests may replace them.
var (
	openFileLimit = nofileLimit
	memoryLimit   = cgroupMemoryLimit
)

// Complete validates c and resolves the kubeconfig, returning every problem at once.
func (c Config) Complete() (*Completed, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	out := &Completed{Config: c}
	out.Fix, _ = fix.ParseMode(c.FixMode) // validated above
	// In GroupResource's form, so that they match requests.
	out.FixExemptResources = completeResources("fix-exempt-resource", "exempt", c.FixExemptResources, &out.Warnings)
	out.ShareExcludeResources = completeResources("share-exclude-resource", "exclude", c.ShareExcludeResources, &out.Warnings)
	var errs []error
	for _, s := range c.Upstreams {
		u, _ := parseUpstream(s) // validated above
		out.Upstreams = append(out.Upstreams, u)
	}
	if c.UpstreamCAFile != "" {
		out.UpstreamCA, _ = loadCA(c.UpstreamCAFile)
	}
	if c.Kubeconfig != "" || len(c.Upstreams) == 0 {
		rc, err := loadKubeconfig(c.Kubeconfig, c.Context)
		if err != nil {
			errs = append(errs, err)
		} else {
			out.Credentials = rc
			if len(out.Upstreams) == 0 {
				u, err := parseUpstream(strings.TrimSuffix(rc.Host, "/"))
				if err != nil {
					errs = append(errs, fmt.Errorf("kubeconfig server %q: %w", rc.Host, err))
				} else {
					out.Upstreams = append(out.Upstreams, u)
				}
			}
		}
	}
	// With identity forwarding, watchsan's own identity is never lent as it is: a client with
	// neither a token nor a verified certificate goes upstream anonymous (section 8).
	out.Lend = !c.NoCredentials && out.Credentials != nil && hasIdentity(out.Credentials) && c.IdentityForwarding == ""
	errs = append(errs, out.completeIdentity()...)
	if out.Lend && !IsLoopback(c.Listen) && !c.AllowNonLoopbackCredentials {
		errs = append(errs, fmt.Errorf("--listen %q is not a loopback address and the kubeconfig's credentials would be lent to anyone who reaches it: listen on 127.0.0.1, pass --no-credentials, or accept this with --allow-non-loopback-credentials", c.Listen))
	}
	if out.Lend {
		errs = append(errs, checkLending(out.Upstreams, out.Credentials, c.AllowCredentialsToUpstream)...)
	}
	errs = append(errs, out.completeProbe()...)
	errs = append(errs, out.completeAdminAuth()...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	out.Guard = c.completeGuard(out.Lend)
	out.SourceConnections = sourceLimit(c.MaxConnectionsPerSource, DefaultMaxConnectionsPerSource, c.Listen)
	out.SourceHeaderConnections = sourceLimit(c.MaxHeaderConnectionsPerSource, DefaultMaxHeaderConnectionsPerSource, c.Listen)
	out.SourceHeaderBytes = sourceLimit(c.MaxHeaderBytesPerSource, DefaultMaxHeaderBytesPerSource, c.Listen)
	out.warnings(openFileLimit(), memoryLimit())
	return out, nil
}

func hasIdentity(rc *rest.Config) bool {
	return rc.BearerToken != "" || rc.BearerTokenFile != "" || rc.Username != "" ||
		len(rc.CertData) > 0 || rc.CertFile != "" || rc.ExecProvider != nil || rc.AuthProvider != nil
}

func loadKubeconfig(path, context string) (*rest.Config, error) {
	rc, err := LoadKubeconfig(path, context, "")
	var none *NoKubeconfigError
	switch {
	case errors.As(err, &none):
		return nil, fmt.Errorf("no upstream: pass --upstream https://HOST:6443 or --kubeconfig FILE; %w", err)
	case err != nil && path == "":
		return nil, fmt.Errorf("no upstream: no --upstream given and %w", err)
	}
	return rc, err
}

// NoKubeconfigError is LoadKubeconfig's failure when no path was given and client-go's default
// loading rules found nothing; it says where they looked.
type NoKubeconfigError struct{ Searched string }

func (e *NoKubeconfigError) Error() string {
	return "watchsan looked for a kubeconfig in " + e.Searched
}

// LoadKubeconfig loads a kubeconfig as kubectl does (path, else $KUBECONFIG or
// ~/.kube/config, else the pod's service account), with context and server (each "": the
// kubeconfig's) in place of its own, for watchsan and `watchsan check` alike. Its failures say
// what to do in watchsan's words: client-go's own for "nothing found" is about
// KUBERNETES_MASTER, long obsolete.
func LoadKubeconfig(path, context, server string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	overrides := &clientcmd.ConfigOverrides{CurrentContext: context}
	overrides.ClusterInfo.Server = server
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	switch {
	case err == nil:
		return rc, nil
	case path == "" && clientcmd.IsEmptyConfig(err):
		return nil, &NoKubeconfigError{Searched: kubeconfigSearch(rules.Precedence, os.Getenv)}
	case path == "":
		return nil, fmt.Errorf("the kubeconfig (%s) could not be loaded: %w", strings.Join(rules.Precedence, ", "), err)
	case clientcmd.IsEmptyConfig(err):
		return nil, fmt.Errorf("--kubeconfig %s: no cluster, user or context in it (an empty file, or not a kubeconfig)", path)
	}
	return nil, fmt.Errorf("--kubeconfig %s: %w", path, err)
}

// kubeconfigSearch says where client-go's default loading rules looked for a kubeconfig
// (files: $KUBECONFIG, else ~/.kube/config; then the pod's service account) and what it found.
func kubeconfigSearch(files []string, getenv func(string) string) string {
	var parts []string
	if v := getenv(clientcmd.RecommendedConfigPathEnvVar); v != "" {
		parts = append(parts, "$KUBECONFIG")
	} else {
		parts = append(parts, "$KUBECONFIG (unset)")
	}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			parts = append(parts, f+" (not found)")
		} else {
			parts = append(parts, f+" (no context or cluster in it)")
		}
	}
	const token = "/var/run/secrets/kubernetes.io/serviceaccount/token" // rest.InClusterConfig's
	switch {
	case getenv("KUBERNETES_SERVICE_HOST") == "" || getenv("KUBERNETES_SERVICE_PORT") == "":
		parts = append(parts, "the in-cluster service account (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT unset: not in a pod)")
	default:
		parts = append(parts, "the in-cluster service account (no token at "+token+")")
	}
	return strings.Join(parts, ", ")
}

// completeProbe loads --probe-kubeconfig: it must name a user with credentials, and they may
// not cross the network in cleartext (a plain http:// upstream needs
// --allow-credentials-to-upstream). Only its user is used: the probes go to every upstream,
// verified as every upstream connection is.
func (out *Completed) completeProbe() []error {
	if out.ProbeKubeconfig == "" {
		return nil
	}
	rc, err := LoadKubeconfig(out.ProbeKubeconfig, "", "")
	if err != nil {
		return []error{fmt.Errorf("--probe-kubeconfig: %w", err)}
	}
	if !hasIdentity(rc) {
		return []error{fmt.Errorf("--probe-kubeconfig %s: its user has no credentials (token, client certificate or exec plugin); without one the probes go anonymous anyway", out.ProbeKubeconfig)}
	}
	allow := map[string]bool{}
	for _, a := range out.AllowCredentialsToUpstream {
		if u, err := parseUpstream(a); err == nil {
			allow[sameServerKey(u)] = true
		}
	}
	var errs []error
	for _, u := range out.Upstreams {
		if u.Scheme == "http" && !allow[sameServerKey(u)] {
			errs = append(errs, fmt.Errorf("--probe-kubeconfig: upstream %s is plain HTTP: the probe identity would cross the network in cleartext; use https, or accept this with --allow-credentials-to-upstream=%s", u, u))
		}
	}
	out.ProbeCredentials = rc
	return errs
}

// completeResources returns the validated values of --flag in GroupResource's form (nil for
// none), and warns about a value that is probably a subresource (verb says what the flag does
// to a resource, for the hint).
func completeResources(flag, verb string, values []string, warnings *[]string) []string {
	var out []string
	for _, r := range values {
		gr, _ := reqinfo.ParseGroupResource(r) // validated
		out = append(out, gr)
		if g, res, ok := strings.Cut(gr, "/"); ok && !strings.Contains(g, ".") && !reqinfo.BuiltinGroupWithoutDot(g) {
			*warnings = append(*warnings, fmt.Sprintf("--%s %q: %q is not a built-in API group and has no dot, as other groups have: if %s/%s is a subresource, %s its resource instead (watches are of whole resources)", flag, r, g, g, res, verb))
		}
	}
	return out
}
