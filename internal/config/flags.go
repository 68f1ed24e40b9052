package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// stringList is a repeatable flag; the first use on the command line replaces what the file
// gave, later uses append.
type stringList struct {
	v   *[]string
	set bool
}

func (s *stringList) String() string {
	if s.v == nil {
		return ""
	}
	return strings.Join(*s.v, ",")
}

func (s *stringList) Set(v string) error {
	if !s.set {
		*s.v = nil
		s.set = true
	}
	*s.v = append(*s.v, v)
	return nil
}

// FlagSet registers every flag on fs, bound to c's fields; a field's current value is the flag's
// default, so a file loaded into c first is overridden only by flags actually given.
func FlagSet(c *Config) *flag.FlagSet {
	fs := flag.NewFlagSet("watchsan", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.ConfigFile, "config", c.ConfigFile, "YAML file with the same keys as these flags (flags win)")
	fs.StringVar(&c.Listen, "listen", c.Listen, "main listener address (plain HTTP unless --tls-cert-file is given)")
	fs.StringVar(&c.TLSCertFile, "tls-cert-file", c.TLSCertFile, "serve HTTPS (HTTP/2) on --listen with this certificate")
	fs.StringVar(&c.TLSKeyFile, "tls-private-key-file", c.TLSKeyFile, "private key for --tls-cert-file")
	fs.StringVar(&c.AdminListen, "admin-listen", c.AdminListen, "address for watchsan's own /metrics, /healthz, /readyz")
	fs.BoolVar(&c.EnablePprof, "enable-pprof", c.EnablePprof, "serve /debug/pprof on the admin listener")
	fs.Var(&stringList{v: &c.Upstreams}, "upstream", "apiserver URL, http:// or https:// (repeatable); default: the kubeconfig's server")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig for the upstream and the credentials to lend (default $KUBECONFIG, ~/.kube/config, or in-cluster)")
	fs.StringVar(&c.Context, "context", c.Context, "kubeconfig context to use")
	fs.StringVar(&c.UpstreamCAFile, "upstream-ca-file", c.UpstreamCAFile, "CA bundle that verifies the upstream's serving certificate")
	fs.BoolVar(&c.InsecureSkipTLSVerify, "insecure-skip-tls-verify", c.InsecureSkipTLSVerify, "do not verify the upstream's certificate (insecure)")
	fs.BoolVar(&c.NoCredentials, "no-credentials", c.NoCredentials, "never lend the kubeconfig's credentials; forward only what the client sends")
	fs.BoolVar(&c.AllowNonLoopbackCredentials, "allow-non-loopback-credentials", c.AllowNonLoopbackCredentials, "allow lending credentials on a listener that is not on loopback (anyone who reaches it acts as you)")
	fs.Var(&stringList{v: &c.AllowCredentialsToUpstream}, "allow-credentials-to-upstream", "lend the kubeconfig's identity to this --upstream although it is plain http:// or not the kubeconfig's server (repeatable)")
	fs.StringVar(&c.AcceptHosts, "accept-hosts", c.AcceptHosts, "comma-separated regexps: the Host (and any Origin) a request that gets the lent identity must name; others get 403")
	fs.StringVar(&c.RejectPaths, "reject-paths", c.RejectPaths, "comma-separated regexps: paths refused (403) to requests that would get the lent identity; empty: none")
	fs.StringVar(&c.RejectMethods, "reject-methods", c.RejectMethods, "comma-separated regexps: methods refused (405) to requests that would get the lent identity; empty: none")
	fs.StringVar(&c.StripIdentityHeaders, "strip-identity-headers", c.StripIdentityHeaders, "comma-separated header names (a trailing * makes a prefix) removed from every request that gets the lent identity: the apiserver's --requestheader-* names")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", c.IdleTimeout, "close a main-listener connection idle this long between requests (an open watch is never idle); also bounds the wait for a request's headers, at most 30s")
	fs.IntVar(&c.MaxConnections, "max-connections", c.MaxConnections, "most connections the main listener serves at once (more wait in the kernel's backlog); lowered to fit the open-file limit")
	fs.IntVar(&c.HTTP2MaxStreams, "http2-max-streams-per-connection", c.HTTP2MaxStreams, "most concurrent requests (streams) on one HTTP/2 connection to the main listener")
	fs.DurationVar(&c.DialTimeout, "dial-timeout", c.DialTimeout, "upstream TCP connect timeout")
	fs.DurationVar(&c.TLSHandshakeTimeout, "tls-handshake-timeout", c.TLSHandshakeTimeout, "upstream TLS handshake timeout")
	fs.DurationVar(&c.KeepAlive, "tcp-keepalive", c.KeepAlive, "upstream TCP keepalive period")
	fs.DurationVar(&c.HTTP2ReadIdleTimeout, "http2-read-idle-timeout", c.HTTP2ReadIdleTimeout, "ping an upstream HTTP/2 connection after this long without a frame")
	fs.DurationVar(&c.HTTP2PingTimeout, "http2-ping-timeout", c.HTTP2PingTimeout, "close an upstream HTTP/2 connection whose ping is not answered within this")
	fs.DurationVar(&c.ResponseHeaderTimeout, "response-header-timeout", c.ResponseHeaderTimeout, "how long a short request may wait for the upstream's response headers")
	fs.DurationVar(&c.HealthInterval, "health-interval", c.HealthInterval, "how often each upstream is pinged (HTTP/2 PING: does it answer at all) and its /readyz checked")
	fs.StringVar(&c.FixMode, "fix-mode", c.FixMode, "repair: sanitize watch streams; observe: only log and count what repair would do")
	fs.Var(&stringList{v: &c.FixExemptResources}, "fix-exempt-resource", "resource (e.g. pods, or apps/deployments) whose watches pass unsanitized (repeatable)")
	fs.IntVar(&c.MaxFrameSize, "max-frame-size", c.MaxFrameSize, "largest watch event accepted from upstream, bytes")
	fs.IntVar(&c.DeleteMemoryEntries, "delete-memory-entries", c.DeleteMemoryEntries, "rewritten deletes remembered across re-watches (at most)")
	fs.DurationVar(&c.DeleteMemoryTTL, "delete-memory-ttl", c.DeleteMemoryTTL, "how long a rewritten delete is remembered")
	fs.DurationVar(&c.WatchResumeTimeout, "watch-resume-timeout", c.WatchResumeTimeout, "how long a broken upstream watch is retried before the client's stream is ended")
	fs.DurationVar(&c.WatchStallTimeout, "watch-stall-timeout", c.WatchStallTimeout, "an upstream watch that sends nothing, not even a bookmark (always asked for; apiservers send one a minute), for this long is resumed, whatever probes of its upstream say")
	fs.BoolVar(&c.DisableResume, "disable-watch-resume", c.DisableResume, "end the client's watch when the upstream's breaks, instead of resuming it")
	fs.DurationVar(&c.RetryBudget, "retry-budget", c.RetryBudget, "how long a request that failed before its response started is retried, and how long after an upstream was last healthy requests wait for it; 0: no retries")
	fs.DurationVar(&c.ShutdownDelay, "shutdown-delay", c.ShutdownDelay, "on SIGTERM, how long /readyz fails while the listeners keep serving (so load balancers stop sending) before they close")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "after the shutdown delay, how long shutdown waits for requests to finish")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "json or console")
	fs.BoolVar(&c.AccessLog, "access-log", c.AccessLog, "log one line per request on the main listener (with its request id, which watch lines carry too); false: none")
	c.HA.flags(fs)
	return fs
}

// Usage writes the flag list.
func Usage(w io.Writer) {
	c := Default()
	fs := FlagSet(&c)
	fs.SetOutput(w)
	fmt.Fprintln(w, "Usage: watchsan [flags] | watchsan version | watchsan demo [--real]")
	fs.PrintDefaults()
}

// ErrHelp is returned by Load when -h or --help was given.
var ErrHelp = flag.ErrHelp

// Load builds a Config from defaults, the --config file (if any) and args, in that order of
// precedence from lowest. It returns every problem it found, joined; Validate finds the rest.
func Load(args []string) (Config, error) {
	c := Default()
	var errs []error
	if path := findConfigFlag(args); path != "" {
		if err := loadFile(path, &c); err != nil {
			errs = append(errs, err)
		}
	}
	fs := FlagSet(&c)
	errs = append(errs, parseAll(fs, args)...)
	for _, e := range errs {
		if errors.Is(e, flag.ErrHelp) {
			return c, ErrHelp
		}
	}
	return c, errors.Join(errs...)
}

// loadFile applies a YAML file whose keys are flag names, through the flags themselves. A list
// value sets a repeatable flag once per element.
func loadFile(path string, c *Config) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	fs := FlagSet(c)
	var errs []error
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "config" || fs.Lookup(k) == nil {
			errs = append(errs, fmt.Errorf("--config %s: unknown key %q", path, k))
			continue
		}
		vals, isList := m[k].([]any)
		if !isList {
			vals = []any{m[k]}
		}
		for _, v := range vals {
			if err := fs.Set(k, scalar(v)); err != nil {
				errs = append(errs, fmt.Errorf("--config %s: key %q: invalid value %q: %w", path, k, scalar(v), err))
			}
		}
	}
	return errors.Join(errs...)
}

func scalar(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case string:
		return v
	}
	return fmt.Sprint(v)
}

func findConfigFlag(args []string) string {
	for i := 0; i < len(args); i++ {
		name, val, hasVal := splitFlag(args[i])
		if name != "config" {
			continue
		}
		if hasVal {
			return val
		}
		if i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// splitFlag parses "-name", "--name" or "--name=value".
func splitFlag(arg string) (name, value string, hasValue bool) {
	if len(arg) < 2 || arg[0] != '-' {
		return "", "", false
	}
	name = strings.TrimPrefix(strings.TrimPrefix(arg, "-"), "-")
	name, value, hasValue = strings.Cut(name, "=")
	return name, value, hasValue
}

// parseAll applies every flag in args and, unlike flag.FlagSet.Parse, keeps going after a bad one
// so that every problem is reported at once.
func parseAll(fs *flag.FlagSet, args []string) []error {
	var errs []error
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			if rest := args[i+1:]; len(rest) > 0 {
				errs = append(errs, fmt.Errorf("unexpected arguments: %q", rest))
			}
			break
		}
		name, val, hasVal := splitFlag(arg)
		if name == "" {
			errs = append(errs, fmt.Errorf("unexpected argument %q", arg))
			continue
		}
		if name == "h" || name == "help" {
			return []error{flag.ErrHelp}
		}
		f := fs.Lookup(name)
		if f == nil {
			errs = append(errs, fmt.Errorf("unknown flag --%s", name))
			continue
		}
		if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() && !hasVal {
			val, hasVal = "true", true
		}
		if !hasVal {
			if i+1 >= len(args) {
				errs = append(errs, fmt.Errorf("flag --%s needs a value", name))
				continue
			}
			i++
			val = args[i]
		}
		if err := fs.Set(name, val); err != nil {
			errs = append(errs, fmt.Errorf("invalid value %q for --%s: %w", val, name, err))
		}
	}
	return errs
}
