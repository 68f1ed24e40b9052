package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/watchsan/watchsan/internal/reqinfo"
)

// stringList is a repeatable flag; the first use on the command line replaces what the file
// gave, later uses append. typ is what help calls a value ("URL"; "" is "strings").
type stringList struct {
	v   *[]string
	set bool
	typ string
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

func (s *stringList) Type() string {
	if s.typ == "" {
		return "strings"
	}
	return s.typ
}

// verbosity is -v/--v, klog's convention (higher is more verbose) mapped onto --log-level:
// 0 is info (the default), 1 or more is debug. It sets LogLevel, so whichever of -v and
// --log-level comes last wins.
type verbosity struct{ level *string }

func (v verbosity) String() string {
	if v.level != nil && *v.level == "debug" {
		return "1"
	}
	return "0"
}

func (v verbosity) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return errors.New("want 0 (info) or more (debug)")
	}
	*v.level = "info"
	if n > 0 {
		*v.level = "debug"
	}
	return nil
}

func (v verbosity) Type() string { return "int" }

// FlagSet registers every flag on fs, bound to c's fields; a field's current value is the flag's
// default, so a file loaded into c first is overridden only by flags actually given.
//
// Flags are shown in help and in docs/flags.md in groups: group(title) puts the flags
// registered after it under that title (a title used again adds to its group).
func FlagSet(c *Config) *pflag.FlagSet {
	fs := pflag.NewFlagSet("watchsan", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.SortFlags = false
	group := grouper(fs)
	group("Configuration")
	fs.StringVar(&c.ConfigFile, "config", c.ConfigFile, "YAML file with the same keys as these flags (flags win)")
	group("Listeners")
	fs.StringVar(&c.Listen, "listen", c.Listen, "main listener address (plain HTTP unless --tls-cert-file is given)")
	fs.StringVar(&c.TLSCertFile, "tls-cert-file", c.TLSCertFile, "serve HTTPS (HTTP/2) on --listen with this certificate")
	fs.StringVar(&c.TLSKeyFile, "tls-private-key-file", c.TLSKeyFile, "private key for --tls-cert-file")
	fs.StringVar(&c.AdminListen, "admin-listen", c.AdminListen, "address for watchsan's own /metrics, /healthz, /readyz, /status (a page of what it is doing), /debug/feeds")
	fs.BoolVar(&c.EnablePprof, "enable-pprof", c.EnablePprof, "serve /debug/pprof on the admin listener")
	c.AdminAuthConfig.flags(fs)
	group("Upstreams")
	fs.Var(&stringList{v: &c.Upstreams, typ: "URL"}, "upstream", "apiserver URL, http:// or https:// (repeatable); default: the kubeconfig's server")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig for the upstream and the credentials to lend (default $KUBECONFIG, ~/.kube/config, or in-cluster)")
	fs.StringVar(&c.Context, "context", c.Context, "kubeconfig context to use")
	fs.StringVar(&c.UpstreamCAFile, "upstream-ca-file", c.UpstreamCAFile, "CA bundle that verifies the upstream's serving certificate")
	fs.BoolVar(&c.InsecureSkipTLSVerify, "insecure-skip-tls-verify", c.InsecureSkipTLSVerify, "do not verify the upstream's certificate (insecure)")
	group("Credentials and the lending guard")
	fs.BoolVar(&c.NoCredentials, "no-credentials", c.NoCredentials, "never lend the kubeconfig's credentials; forward only what the client sends")
	fs.BoolVar(&c.AllowNonLoopbackCredentials, "allow-non-loopback-credentials", c.AllowNonLoopbackCredentials, "allow lending credentials on a listener that is not on loopback (anyone who reaches it acts as you)")
	fs.Var(&stringList{v: &c.AllowCredentialsToUpstream, typ: "URL"}, "allow-credentials-to-upstream", "lend the kubeconfig's identity to this --upstream although it is plain http:// or not the kubeconfig's server (repeatable)")
	fs.StringVar(&c.AcceptHosts, "accept-hosts", c.AcceptHosts, "comma-separated regexps: the Host (and any Origin) a request that gets the lent identity must name; others get 403")
	fs.StringVar(&c.RejectPaths, "reject-paths", c.RejectPaths, "comma-separated regexps: paths refused (403) to requests that would get the lent identity; empty: none")
	fs.StringVar(&c.RejectMethods, "reject-methods", c.RejectMethods, "comma-separated regexps: methods refused (405) to requests that would get the lent identity; empty: none")
	fs.StringVar(&c.StripIdentityHeaders, "strip-identity-headers", c.StripIdentityHeaders, "comma-separated header names (a trailing * makes a prefix) removed from every request that gets the lent identity or asserts a client's (--identity-forwarding, which also removes Impersonate-* and X-Remote-*): the apiserver's --requestheader-* names")
	for _, name := range []string{"accept-hosts", "reject-paths", "reject-methods", "strip-identity-headers"} {
		_ = fs.SetAnnotation(name, CommaListAnnotation, []string{"true"})
	}
	group("Identity forwarding (frontend mode)")
	fs.StringVar(&c.ClientCAFile, "client-ca-file", c.ClientCAFile, "CA bundle that verifies client certificates on the TLS listener (reloaded when the file changes); needs --identity-forwarding")
	fs.StringVar(&c.IdentityForwarding, "identity-forwarding", c.IdentityForwarding, "how a verified client certificate's user (CN) and groups (O) go upstream: impersonate (Impersonate-User/-Group on the kubeconfig's identity, which needs the impersonate verb) or requestheader (--requestheader-client-cert-file plus X-Remote-User/-Group); empty: off")
	fs.StringVar(&c.RequestHeaderClientCertFile, "requestheader-client-cert-file", c.RequestHeaderClientCertFile, "front-proxy client certificate watchsan presents upstream with --identity-forwarding=requestheader (signed by the apiserver's --requestheader-client-ca-file)")
	fs.StringVar(&c.RequestHeaderClientKeyFile, "requestheader-client-key-file", c.RequestHeaderClientKeyFile, "private key for --requestheader-client-cert-file")
	group("Listeners")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", c.IdleTimeout, "close a main-listener connection idle this long between requests (an open watch is never idle); also bounds the wait for a request's headers, at most 30s")
	fs.IntVar(&c.MaxConnections, "max-connections", c.MaxConnections, "most connections the main listener serves at once; one more is answered 429 with Retry-After: 1 at once and closed (watchsan_connections_shed_total), which clients retry; lowered to fit the open-file limit")
	c.Replicas.flags(fs)
	fs.IntVar(&c.MaxConnectionsPerSource, "max-connections-per-source", c.MaxConnectionsPerSource, "most main-listener connections one client address (an IPv6 /64) holds at once; more are closed at once. 0: 100 when --listen is not on loopback, none on loopback (every client is this machine); -1: none (behind a load balancer that hides client addresses)")
	fs.IntVar(&c.MaxHeaderConnectionsPerSource, "max-header-connections-per-source", c.MaxHeaderConnectionsPerSource, "most of one client address's connections still sending a request's headers (slowloris); one more closes its oldest such. 0: 32 when --listen is not on loopback, none on loopback; -1: none")
	fs.IntVar(&c.HTTP2MaxStreams, "http2-max-streams-per-connection", c.HTTP2MaxStreams, "most concurrent requests (streams) on one HTTP/2 connection to the main listener")
	fs.DurationVar(&c.ClientHTTP2WriteByteTimeout, "client-http2-write-byte-timeout", c.ClientHTTP2WriteByteTimeout, "close a main-listener HTTP/2 connection that takes no byte for this long while watchsan has some to send it (a client that stopped reading its socket); 0: never")
	fs.DurationVar(&c.ClientHTTP2PingInterval, "client-http2-ping-interval", c.ClientHTTP2PingInterval, "ping a main-listener HTTP/2 connection that sent nothing for this long (client-go's own check of its connections, done on them); 0: never")
	fs.DurationVar(&c.ClientHTTP2PingTimeout, "client-http2-ping-timeout", c.ClientHTTP2PingTimeout, "close a main-listener HTTP/2 connection whose ping (--client-http2-ping-interval) is not answered within this")
	fs.IntVar(&c.MaxRequestHeaderBytes, "max-request-header-bytes", c.MaxRequestHeaderBytes, "largest header list of a main-listener request, bytes (HTTP/2 counts each field's name and value plus 32): a larger one gets 431 (HTTP/2: or its connection closed); kube-apiserver's own limit is 1 MiB")
	fs.IntVar(&c.MaxHeaderBytesPerConnection, "max-header-bytes-per-connection", c.MaxHeaderBytesPerConnection, "header bytes the requests in progress on one main-listener connection may carry together (an open watch is in progress); one more gets 429 with Retry-After, and one with no credentials once half is in use. 0: none")
	fs.IntVar(&c.MaxHeaderBytesPerSource, "max-header-bytes-per-source", c.MaxHeaderBytesPerSource, "as --max-header-bytes-per-connection, for all the connections of one client address (an IPv6 /64). 0: 16 MiB when --listen is not on loopback, none on loopback; -1: none")
	group("Upstream connections and health")
	fs.DurationVar(&c.DialTimeout, "dial-timeout", c.DialTimeout, "upstream TCP connect timeout")
	fs.DurationVar(&c.TLSHandshakeTimeout, "tls-handshake-timeout", c.TLSHandshakeTimeout, "upstream TLS handshake timeout")
	fs.DurationVar(&c.KeepAlive, "tcp-keepalive", c.KeepAlive, "upstream TCP keepalive period")
	fs.DurationVar(&c.HTTP2ReadIdleTimeout, "http2-read-idle-timeout", c.HTTP2ReadIdleTimeout, "ping an upstream HTTP/2 connection after this long without a frame")
	fs.DurationVar(&c.HTTP2PingTimeout, "http2-ping-timeout", c.HTTP2PingTimeout, "close an upstream HTTP/2 connection whose ping is not answered within this")
	fs.IntVar(&c.HTTP2StreamWindow, "upstream-http2-stream-window", c.HTTP2StreamWindow, "bytes an upstream may send on one HTTP/2 stream ahead of watchsan reading it: what a watch whose client stopped reading holds (kube-apiserver's own window; Go's default is 4 MiB)")
	fs.IntVar(&c.HTTP2ConnectionWindow, "upstream-http2-connection-window", c.HTTP2ConnectionWindow, "bytes an upstream may send on one HTTP/2 connection, all its streams together, ahead of watchsan reading them (at least 250 stream windows, kube-apiserver's streams per connection, or stalled streams can hold up the others)")
	fs.DurationVar(&c.ResponseHeaderTimeout, "response-header-timeout", c.ResponseHeaderTimeout, "how long a short request may wait for the upstream's response headers")
	fs.DurationVar(&c.HealthInterval, "health-interval", c.HealthInterval, "how often each upstream is pinged (HTTP/2 PING: does it answer at all) and its /readyz checked")
	group("Watch sanitizing")
	fs.StringVar(&c.FixMode, "fix-mode", c.FixMode, "repair: sanitize watch streams; observe: only log and count what repair would do")
	fs.Var(&stringList{v: &c.FixExemptResources, typ: "resource"}, "fix-exempt-resource", "resource whose watches pass unsanitized, as kubectl names it: pods, deployments.apps (or apps/deployments); repeatable")
	fs.IntVar(&c.MaxFrameSize, "max-frame-size", c.MaxFrameSize, "largest watch event accepted from upstream, bytes")
	fs.IntVar(&c.DeleteMemoryEntries, "delete-memory-entries", c.DeleteMemoryEntries, "rewritten deletes remembered across re-watches (at most)")
	fs.DurationVar(&c.DeleteMemoryTTL, "delete-memory-ttl", c.DeleteMemoryTTL, "how long a rewritten delete is remembered")
	group("Watch resilience")
	fs.DurationVar(&c.WatchResumeTimeout, "watch-resume-timeout", c.WatchResumeTimeout, "how long a broken upstream watch is retried before the client's stream is ended")
	fs.DurationVar(&c.WatchStallTimeout, "watch-stall-timeout", c.WatchStallTimeout, "an upstream watch that sends nothing, not even a bookmark (always asked for; apiservers send one a minute while its resource changes, none while it does not), for this long is resumed, whatever probes of its upstream say; at least 1s, as it is how often a quiet watch asks upstream")
	fs.DurationVar(&c.WatchWriteTimeout, "watch-write-timeout", c.WatchWriteTimeout, "a watch whose client does not take what watchsan writes to it at once (the events of one upstream read) within this long is ended, and its upstream watch closed (counted as a slow client: a client that stopped reading holds no more than the upstream's stream window, and never passes for a silent or lagging upstream)")
	fs.DurationVar(&c.WatchMaxLifetime, "watch-max-lifetime", c.WatchMaxLifetime, "every client watch without timeoutSeconds, or with a longer one, ends cleanly after this long times a random factor in [1, 2), as the apiserver ends a watch without timeoutSeconds after its --min-request-timeout (1800s by default) times such a factor; the client re-watches from its last resourceVersion and is authorized again (a shared feed's reviewed subscriber: reviewed again); at least 10s")
	fs.BoolVar(&c.DisableResume, "disable-watch-resume", c.DisableResume, "end the client's watch when the upstream's breaks, instead of resuming it")
	fs.BoolVar(&c.WatchAbsorbGone, "watch-absorb-gone", c.WatchAbsorbGone, "answer a 410 at a watch's resume point (\"too old resource version\", as after an apiserver restart) with a list of its scope and only the difference, so the client does not relist, where the watch holds the state it needs, within the state budgets: it began with the initial state (resourceVersion \"\" or 0, or a watch-list), or from the resourceVersion of the list its client had just made through watchsan (kept for it, Table rows too); false: every such 410 reaches the client")
	fs.IntVar(&c.WatchAbsorbStateBytes, "watch-absorb-state-bytes", c.WatchAbsorbStateBytes, "bytes of objects (and their overhead) one watch may keep to absorb a 410 at its resume point, and its absorb's list may hold; a watch over it drops its state and its client gets the 410")
	fs.IntVar(&c.WatchAbsorbTotalBytes, "watch-absorb-total-bytes", c.WatchAbsorbTotalBytes, "bytes all watches' states and absorbs' lists may hold together (--watch-absorb-state-bytes each); a watch whose state would pass it drops its state")
	fs.BoolVar(&c.WatchAbsorbCompleteByList, "watch-absorb-complete-by-list", c.WatchAbsorbCompleteByList, "a private watch from a client's resourceVersion that follows no ended watch of that client's lists its scope at exactly that resourceVersion (from etcd, if not compacted) before its first event, so that it too can absorb a 410 (--watch-absorb-gone): one more list per such watch, a client's first watch after its own list")
	fs.DurationVar(&c.RetryBudget, "retry-budget", c.RetryBudget, "how long a request that failed before its response started is retried, and how long after an upstream was last healthy requests wait for it; 0: no retries")
	group("Shared watch feeds")
	fs.BoolVar(&c.ShareWatches, "share-watches", c.ShareWatches, "serve identical watches (same path, selectors, options and Accept) from one upstream watch, a client joining at an explicit resourceVersion its feed's ring covers, a watch-list of the lent identity (sendInitialEvents, client-go's informers) once its initial events are delivered: those of the lent identity (sidecar, node-local) share one feed, and clients with a token or an asserted certificate of their own share another once a SelfSubjectAccessReview with their credentials allowed them that watch; anonymous clients, refused ones, and watches from \"\" or 0 keep an upstream watch each; --share-watches=false gives every watch its own")
	fs.IntVar(&c.ShareRingBytes, "share-ring-bytes", c.ShareRingBytes, "bytes of recent events a shared feed keeps, for clients joining (re-watching) from a recent resourceVersion")
	fs.Int64Var(&c.MemoryBudgetBytes, "memory-budget-bytes", c.MemoryBudgetBytes, "bytes everything that grows with load may hold together: subscribers' queues, frames being read, write buffers, rings, 410 states; past seven eighths of it, a watch holding more than its fair share is ended (its client re-watches) and rings give way; 0: half the container's memory limit (cgroup memory.max), or 67108864 (64 MiB) without one")
	fs.Int64Var(&c.ShareRingTotalBytes, "share-ring-total-bytes", c.ShareRingTotalBytes, "bytes all shared feeds' rings keep together (each at most --share-ring-bytes); when it is reached, the feed adding an event evicts its own oldest if its ring holds more than its fair share (the total over the feeds open), else the largest ring's oldest go; a ring that evicted serves joins from fewer resourceVersions back; 0: a quarter of the container's memory limit (cgroup memory.max), or 33554432 (32 MiB) without one")
	fs.IntVar(&c.ShareRingEvents, "share-ring-events", c.ShareRingEvents, "events a shared feed keeps at most, for clients joining from a recent resourceVersion")
	fs.IntVar(&c.ShareSubscriberBufferBytes, "share-subscriber-buffer-bytes", c.ShareSubscriberBufferBytes, "bytes a shared feed's subscriber may be behind it; one further behind is ended (its client re-watches from its last resourceVersion), as the apiserver ends a watcher that cannot keep up, and no other subscriber waits for it")
	fs.Var(&stringList{v: &c.ShareExcludeResources, typ: "resource"}, "share-exclude-resource", "resource whose watches never share a feed (each keeps an upstream watch of its own, counted as private feeds with reason excluded), named as --fix-exempt-resource names them: secrets, leases.coordination.k8s.io (or coordination.k8s.io/leases); repeatable")
	fs.IntVar(&c.ShareReviewCacheEntries, "share-access-review-cache-entries", c.ShareReviewCacheEntries, "access review denials kept (30 seconds: a denial only sends a watch to a private feed), oldest out; an allowance is never reused: every join of a shared feed by a client with its own credentials is reviewed, identical reviews coalescing onto one sent after the watch arrived")
	fs.BoolVar(&c.ShareReviewedWatchLists, "share-reviewed-watch-lists", c.ShareReviewedWatchLists, "let watch-lists (informers' syncs) of clients with credentials of their own move onto shared feeds at their initial-events-end bookmark, once an access review sent then allows them to watch (as every reviewed join); off: only the lent identity's do, and the others keep an upstream watch of their own")
	fs.IntVar(&c.ShareMaxFeeds, "share-max-feeds", c.ShareMaxFeeds, "shared feeds open at most; a watch that would open one more gets an upstream watch of its own (private feeds, reason feed-limit), as without sharing; 1 to 1000000")
	group("Coalesced reads")
	fs.BoolVar(&c.CoalesceReads, "coalesce-reads", c.CoalesceReads, "serve identical reads of one principal (same credentials and Impersonate-* headers, path, query, Accept, Accept-Encoding) from one upstream read, streamed to each client as it arrives: lists at resourceVersion \"\" or 0 and their continue pages, discovery (/api, /apis) and OpenAPI documents; lists of group-versions the apiserver serves itself also across identities with credentials of their own, each once a SelfSubjectAccessReview with its credentials allowed it; a read joins only an upstream read not yet sent when it arrived (at most one on the wire and one pending per key; a continue page, whose answer its token fixes, also one begun that still holds its whole answer), so its answer is one the apiserver could have given it; anonymous requests, writes, single-object GETs, watches and requests with any other parameter or header go alone; --coalesce-reads=false sends every read on its own")
	fs.IntVar(&c.CoalesceMaxMembers, "coalesce-max-members", c.CoalesceMaxMembers, "client reads one coalesced upstream read serves at most; more identical reads arriving meanwhile go upstream on their own; 1 to 1000000")
	fs.IntVar(&c.CoalesceMaxGroups, "coalesce-max-groups", c.CoalesceMaxGroups, "distinct reads (keys) with a coalesced upstream read on the wire or pending at most; a read of another key goes upstream on its own; 1 to 1000000")
	fs.IntVar(&c.CoalesceLagBytes, "coalesce-lag-bytes", c.CoalesceLagBytes, "bytes a client of a coalesced read may be behind the fastest client of the same upstream read; one further behind has its response cut (its client retries), no client waits for another, and the upstream answer is read no further ahead of the fastest client than this (what one read buffers); 65536 to 1073741824")
	fs.Int64Var(&c.CoalesceTotalBytes, "coalesce-total-bytes", c.CoalesceTotalBytes, "bytes all coalesced upstream reads buffer together; while they hold more, each read's --coalesce-lag-bytes becomes its fair share of this (over the reads being read, at least 64 KiB), so a read ends its lagging clients rather than growing; at least --coalesce-lag-bytes, at most 68719476736")
	group("Shutdown")
	fs.DurationVar(&c.ShutdownDelay, "shutdown-delay", c.ShutdownDelay, "on SIGTERM, how long /readyz fails while the listeners keep serving (so load balancers stop sending) before they close")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "after the shutdown delay, how long shutdown waits for requests to finish")
	group("Logging")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "console or json; default: console when stderr is a terminal, else json")
	fs.BoolVar(&c.AccessLog, "access-log", c.AccessLog, "log one line per request on the main listener (with its request id, which watch lines carry too); false: none")
	fs.VarP(verbosity{&c.LogLevel}, "v", "v", "log verbosity, klog's convention: 0 is --log-level=info, 1 or more is --log-level=debug; -v alone is 1 (the later of -v and --log-level wins)")
	c.HA.flags(fs, group)
	group("")
	annotateShortUsage(fs)
	return fs
}

// GroupAnnotation is the pflag annotation that holds a flag's help group (one title).
const GroupAnnotation = "watchsan.io/group"

// grouper returns group(title): the flags registered on fs since the previous call, and not
// yet in a group, go into the previous call's group.
func grouper(fs *pflag.FlagSet) func(title string) {
	current := ""
	return func(title string) {
		if current != "" {
			fs.VisitAll(func(f *pflag.Flag) {
				if _, ok := f.Annotations[GroupAnnotation]; !ok {
					_ = fs.SetAnnotation(f.Name, GroupAnnotation, []string{current})
				}
			})
		}
		current = title
	}
}

// FlagGroup is a titled group of flags, as help shows them.
type FlagGroup struct {
	// Title is the group's title ("Listeners"); "Other" for flags registered outside a group.
	Title string
	// Flags are the group's flags in registration order; never empty.
	Flags []*pflag.Flag
}

// Groups returns fs's flags by group, groups in the order they were first used and flags in
// the order they were registered; flags without a group come last, under "Other".
func Groups(fs *pflag.FlagSet) []FlagGroup {
	var out []FlagGroup
	index := map[string]int{}
	fs.VisitAll(func(f *pflag.Flag) {
		title := "Other"
		if t := f.Annotations[GroupAnnotation]; len(t) == 1 {
			title = t[0]
		}
		i, ok := index[title]
		if !ok {
			i = len(out)
			index[title] = i
			out = append(out, FlagGroup{Title: title})
		}
		out[i].Flags = append(out[i].Flags, f)
	})
	for i, g := range out { // "Other" last
		if g.Title == "Other" && i != len(out)-1 {
			out = append(append(out[:i:i], out[i+1:]...), g)
			break
		}
	}
	return out
}

// ErrHelp is returned by Load when -h or --help was given.
var ErrHelp = pflag.ErrHelp

// Load builds a Config from defaults, the --config file (if any) and args, in that order of
// precedence from lowest. It returns every problem it found, joined, each once: a flag whose
// value is refused keeps its previous value, so Validate does not report it again.
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
	fs.VisitAll(func(f *pflag.Flag) { // the command line wins, so a problem is its own
		if f.Changed {
			delete(c.FileLines, f.Name)
			if _, ok := f.Value.(verbosity); ok {
				delete(c.FileLines, "log-level")
			}
		}
	})
	for _, e := range errs {
		if errors.Is(e, ErrHelp) {
			return c, ErrHelp
		}
	}
	return c, errors.Join(errs...)
}

// loadFile applies a YAML file whose keys are flag names, through the flags themselves. The
// file must be a YAML mapping (or empty: nothing set), each key once. A key's value is a
// scalar; or a list, which sets a repeatable flag once per element, and is joined with commas
// for a flag that takes a comma-separated list (CommaListAnnotation); any other list, or a
// mapping, is refused, naming the key: a value the file meant can never be dropped or half
// used (a two-item reject-paths list kept only its last item).
func loadFile(path string, c *Config) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("--config %s: not YAML: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return nil // empty, or comments only
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil // "~", "null", "---": nothing set
	}
	if root.Kind != yaml.MappingNode {
		return fmt.Errorf("--config %s: line %d: not a mapping of flag names to values (%s)", path, root.Line, kindName(root))
	}
	fs := FlagSet(c)
	var errs []error
	seen := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		kn, vn := root.Content[i], root.Content[i+1]
		k := kn.Value
		if kn.Kind != yaml.ScalarNode {
			errs = append(errs, fmt.Errorf("--config %s: line %d: a key must be a flag's name, not %s", path, kn.Line, kindName(kn)))
			continue
		}
		if line, dup := seen[k]; dup {
			errs = append(errs, fmt.Errorf("--config %s: key %q given twice (lines %d and %d): say once what you mean", path, k, line, kn.Line))
			continue
		}
		seen[k] = kn.Line
		f := fs.Lookup(k)
		if k == "config" || f == nil {
			msg := fmt.Sprintf("--config %s: unknown key %q", path, k)
			if s := suggest(fs, k); s != nil && s.Name != "config" {
				msg += fmt.Sprintf("; did you mean %q?", s.Name)
			}
			errs = append(errs, errors.New(msg))
			continue
		}
		vals, err := fileValues(f, vn)
		if err != nil {
			errs = append(errs, fmt.Errorf("--config %s: key %q: line %d: %w", path, k, vn.Line, err))
			continue
		}
		set := false
		for _, v := range vals {
			if err := setFlag(f, v); err != nil {
				var ve *ValueError
				if errors.As(err, &ve) {
					ve.File, ve.Line = path, vn.Line
				}
				errs = append(errs, err)
				continue
			}
			set = true
		}
		if set {
			if c.FileLines == nil {
				c.FileLines = map[string]string{}
			}
			name := f.Name
			if _, ok := f.Value.(verbosity); ok {
				name = "log-level" // what -v sets, and what a problem names
			}
			c.FileLines[name] = fmt.Sprintf("%s: line %d", path, kn.Line)
		}
	}
	return errors.Join(errs...)
}

// fileValues is what a file's value node v sets flag f to: each value is one Set.
func fileValues(f *pflag.Flag, v *yaml.Node) ([]string, error) {
	switch v.Kind {
	case yaml.ScalarNode:
		if v.Tag == "!!null" {
			return []string{""}, nil
		}
		return []string{v.Value}, nil
	case yaml.SequenceNode:
		items := make([]string, 0, len(v.Content))
		for _, e := range v.Content {
			if e.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("a list item is %s; want a value", kindName(e))
			}
			items = append(items, e.Value)
		}
		if _, repeatable := f.Value.(*stringList); repeatable {
			return items, nil
		}
		if _, ok := f.Annotations[CommaListAnnotation]; ok {
			for _, e := range items {
				if strings.Contains(e, ",") {
					return nil, fmt.Errorf("list item %q has a comma, which --%s takes as a separator between items", e, f.Name)
				}
			}
			return []string{strings.Join(items, ",")}, nil
		}
		return nil, fmt.Errorf("a list, but --%s takes one value", f.Name)
	}
	return nil, fmt.Errorf("%s, but --%s takes a value", kindName(v), f.Name)
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	case yaml.AliasNode:
		return "an alias"
	}
	return fmt.Sprintf("the value %q", n.Value)
}

// CommaListAnnotation marks a flag whose value is a comma-separated list: a --config file may
// give it as a YAML list.
const CommaListAnnotation = "watchsan.io/comma-list"

func findConfigFlag(args []string) string {
	for i := 0; i < len(args); i++ {
		if args[i] == "--" {
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimPrefix(args[i], "--"), "=")
		if name != "config" || !strings.HasPrefix(args[i], "--") {
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

// ValueError is a flag value that was refused: its message names the flag and the value once
// and says what to give instead.
type ValueError struct {
	// Flag is the flag's name, without dashes.
	Flag string
	// Value is the value given.
	Value string
	// Hint says what a valid value looks like; "" shows Err instead.
	Hint string
	// Err is what the flag's parser said.
	Err error
	// File is the --config file the value came from; "": the command line.
	File string
	// Line is the line of File the value is on; 0 with no File.
	Line int
}

func (e *ValueError) Error() string {
	problem := e.Hint
	if problem == "" {
		problem = e.Err.Error()
	}
	if e.File != "" {
		return fmt.Sprintf("--config %s: line %d: key %q: %q: %s", e.File, e.Line, e.Flag, e.Value, problem)
	}
	return fmt.Sprintf("--%s %q: %s", e.Flag, e.Value, problem)
}

func (e *ValueError) Unwrap() error { return e.Err }

// hints says, by a flag's value type, what a valid value looks like.
var hints = map[string]string{
	"duration": "not a duration: use one such as 5s, 500ms or 1m30s",
	"int":      "not a whole number: use one such as 100",
	"float64":  "not a number: use one such as 10 or 0.5",
	"bool":     "not a boolean: use true or false",
}

// setFlag sets f to val; a refused value leaves f's previous value (some parsers zero it
// first), so the problem is reported once, here, with a hint.
func setFlag(f *pflag.Flag, val string) error {
	old := f.Value.String()
	if err := f.Value.Set(val); err != nil {
		_ = f.Value.Set(old)
		hint := hints[f.Value.Type()]
		if _, ok := f.Value.(verbosity); ok {
			hint = ""
		}
		return &ValueError{Flag: f.Name, Value: val, Hint: hint, Err: err}
	}
	f.Changed = true
	return nil
}

// ParseFlags parses args into fs as Load parses watchsan's own flags, for a subcommand's flag
// set (`watchsan check`): every problem at once, each naming its flag, with a hint for a bad
// value and a suggestion for a mistyped name. -h or --help returns just ErrHelp.
func ParseFlags(fs *pflag.FlagSet, args []string) []error {
	return parseAll(fs, args)
}

// parseAll applies every flag in args with pflag's conventions (--name value, --name=value,
// a bool's --name alone, -v 2, -v2) and, unlike pflag.FlagSet.Parse, keeps going after a bad
// one so that every problem is reported at once.
func parseAll(fs *pflag.FlagSet, args []string) []error {
	var errs []error
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			if rest := args[i+1:]; len(rest) > 0 {
				errs = append(errs, fmt.Errorf("unexpected arguments: %q", rest))
			}
			break
		}
		if len(arg) < 2 || arg[0] != '-' {
			errs = append(errs, fmt.Errorf("unexpected argument %q", arg))
			continue
		}
		var (
			f      *pflag.Flag
			name   string
			val    string
			hasVal bool
		)
		if strings.HasPrefix(arg, "--") {
			name, val, hasVal = strings.Cut(arg[2:], "=")
			f = fs.Lookup(name)
		} else if sf := fs.ShorthandLookup(arg[1:2]); sf != nil && (len(arg) == 2 || sf.NoOptDefVal == "") {
			f, name = sf, sf.Name // -v, -v 2, -v2, -v=2
			if len(arg) > 2 {
				val, hasVal = strings.TrimPrefix(arg[2:], "="), true
			}
		} else {
			name, _, hasVal = strings.Cut(arg[1:], "=")
		}
		if name == "help" || arg == "-h" {
			return []error{ErrHelp}
		}
		if f == nil {
			msg := fmt.Sprintf("unknown flag %s", strings.SplitN(arg, "=", 2)[0])
			s := suggest(fs, name)
			if s != nil {
				msg += fmt.Sprintf("; did you mean --%s?", s.Name)
			}
			errs = append(errs, errors.New(msg))
			// Its value, if it has one, is not another problem to report.
			if !hasVal && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") && (s == nil || s.NoOptDefVal == "") {
				i++
			}
			continue
		}
		if !hasVal && f.NoOptDefVal != "" {
			val, hasVal = f.NoOptDefVal, true
		}
		if _, ok := f.Value.(verbosity); ok && !hasVal {
			// -v alone is -v 1, as in most tools; "-v 2" keeps klog's form.
			val, hasVal = "1", true
			if i+1 < len(args) {
				if _, err := strconv.Atoi(args[i+1]); err == nil {
					i++
					val = args[i]
				}
			}
		}
		if !hasVal {
			if i+1 >= len(args) {
				errs = append(errs, fmt.Errorf("flag --%s needs a value", name))
				continue
			}
			i++
			val = args[i]
		}
		if err := setFlag(f, val); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// suggest returns the flag whose name is closest to name (a mistyped flag): within an edit
// distance of 2 (3 for long names), or the only flag name starts with; nil if none.
func suggest(fs *pflag.FlagSet, name string) *pflag.Flag {
	name = strings.ToLower(name)
	var best, prefixed *pflag.Flag
	bestDist, prefixes := len(name)+1, 0
	fs.VisitAll(func(f *pflag.Flag) {
		if d := reqinfo.EditDistance(name, f.Name); d < bestDist {
			best, bestDist = f, d
		}
		if len(name) >= 3 && strings.HasPrefix(f.Name, name) {
			prefixed = f
			prefixes++
		}
	})
	limit := 2
	if len(name) >= 12 {
		limit = 3
	}
	switch {
	case best != nil && bestDist <= limit:
		return best
	case prefixes == 1:
		return prefixed
	}
	return nil
}
