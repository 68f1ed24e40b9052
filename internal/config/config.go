// Package config turns watchsan's command line and optional YAML file into a validated
// configuration: flags and file -> Config -> Validate (every problem at once) -> Complete.
package config

import (
	"github.com/watchsan/watchsan/internal/coalesce"
	"time"

	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
	"github.com/watchsan/watchsan/internal/watch"
)

// Config is what the operator asked for, as given. Flags and the --config file share their
// keys: a file key is a flag's name, and its value is applied through that flag (FlagSet), so
// the two can never disagree. Flags win over the file.
type Config struct {
	// ConfigFile is --config: a YAML file with the same keys as the flags.
	ConfigFile string
	// FileLines says where in the --config file each flag it set is ("FILE: line N"), for the
	// flags the command line did not set again: Validate puts it before a problem with that
	// flag's value. nil (the zero value): problems name the flag alone.
	FileLines map[string]string

	// Listen is the main listener's address (plain HTTP unless TLS files are given).
	Listen      string
	TLSCertFile string
	TLSKeyFile  string
	// AdminListen serves watchsan's own /metrics, /healthz, /readyz, /debug/feeds (and pprof).
	AdminListen string
	EnablePprof bool
	// The admin listener's authentication off loopback (adminauth.go).
	AdminAuthConfig

	// Upstreams are the apiserver URLs; empty means: take the server from the kubeconfig.
	Upstreams             []string
	Kubeconfig            string
	Context               string
	UpstreamCAFile        string
	InsecureSkipTLSVerify bool
	// NoCredentials never lends the kubeconfig's identity: requests are forwarded only with the
	// Authorization header they carry.
	NoCredentials bool
	// AllowNonLoopbackCredentials lets a listener on a non-loopback address lend the
	// kubeconfig's credentials to every caller that can reach it (off: refused at start).
	AllowNonLoopbackCredentials bool
	// AllowCredentialsToUpstream lists upstreams that may receive the lent identity although
	// they are plain http:// or not the kubeconfig's server (off: refused at start).
	AllowCredentialsToUpstream []string

	// The lending guard: what a request that would get the lent identity must
	// satisfy. Each is a comma-separated list of regular expressions, as kubectl proxy's.
	AcceptHosts   string
	RejectPaths   string
	RejectMethods string
	// StripIdentityHeaders are removed from every lent request (and every request that asserts
	// a client's identity, IdentityForwarding): the headers an apiserver reads
	// an identity from when the client certificate watchsan presents is a front proxy's
	// (--requestheader-*). A name ending in "*" is a prefix.
	StripIdentityHeaders string

	// Verified client identity in frontend mode (identity.go). ClientCAFile verifies
	// client certificates on the TLS listener ("": none are asked for). IdentityForwarding is
	// how a verified certificate's user and groups go upstream: "" (off: nothing is asserted,
	// and --client-ca-file is refused), "impersonate" (Impersonate-User/-Group on the
	// kubeconfig's identity) or "requestheader" (the front-proxy certificate
	// RequestHeaderClientCertFile/KeyFile plus X-Remote-User/-Group).
	ClientCAFile                string
	IdentityForwarding          string
	RequestHeaderClientCertFile string
	RequestHeaderClientKeyFile  string

	// Main listener limits. The per-source ones: 0 is the frontend-mode default (none when
	// Listen is on loopback), -1 none (Completed.SourceConnections resolves them).
	IdleTimeout                   time.Duration
	MaxConnections                int
	MaxConnectionsPerSource       int
	MaxHeaderConnectionsPerSource int
	HTTP2MaxStreams               int
	// HTTP/2 health of the main listener's connections (docs/design.md section 14):
	// ClientHTTP2WriteByteTimeout closes a connection that takes no byte for this long while
	// watchsan has some to send it; ClientHTTP2PingInterval pings a connection that sent no
	// frame for this long, and ClientHTTP2PingTimeout closes it when the ping is not answered
	// within this. Zero for the first two: never (Go's default); the third must be positive.
	ClientHTTP2WriteByteTimeout time.Duration
	ClientHTTP2PingInterval     time.Duration
	ClientHTTP2PingTimeout      time.Duration
	// Header bytes the main listener takes (docs/design.md section 14): MaxRequestHeaderBytes
	// of one request's header list (HTTP/1 and HTTP/2); MaxHeaderBytesPerConnection of the
	// requests in progress on one connection (0: none); MaxHeaderBytesPerSource of one
	// source's (0: the frontend-mode default, none on loopback; -1: none;
	// Completed.SourceHeaderBytes resolves it). Anonymous requests get half of each budget.
	MaxRequestHeaderBytes       int
	MaxHeaderBytesPerConnection int
	MaxHeaderBytesPerSource     int

	// Upstream transport.
	DialTimeout           time.Duration
	TLSHandshakeTimeout   time.Duration
	KeepAlive             time.Duration
	HTTP2ReadIdleTimeout  time.Duration
	HTTP2PingTimeout      time.Duration
	ResponseHeaderTimeout time.Duration
	HealthInterval        time.Duration
	// HTTP/2 receive windows of the upstream connections, bytes: what an upstream may send
	// ahead of watchsan reading it, per stream and per connection.
	HTTP2StreamWindow     int
	HTTP2ConnectionWindow int

	// Watch sanitizing.
	FixMode             string
	FixExemptResources  []string
	MaxFrameSize        int
	DeleteMemoryEntries int
	DeleteMemoryTTL     time.Duration

	// Resilient watches.
	WatchResumeTimeout time.Duration
	WatchStallTimeout  time.Duration
	WatchWriteTimeout  time.Duration
	// WatchMaxLifetime bounds every client watch stream, randomized x[1,2) as the apiserver's
	// watch timeout (watch.Config.MaxLifetime); Validate refuses 0 and less than 10s.
	WatchMaxLifetime time.Duration
	DisableResume    bool
	RetryBudget      time.Duration
	// Absorbing a 410 at a watch's resume point: on by default; the budgets bound
	// the states watches keep for it, per watch and in all, in bytes.
	WatchAbsorbGone       bool
	WatchAbsorbStateBytes int
	WatchAbsorbTotalBytes int
	// WatchAbsorbCompleteByList: a watch from a client's resourceVersion lists it exactly
	// first, to hold a complete state (off by default: one more list per such watch).
	WatchAbsorbCompleteByList bool

	// Shared watch feeds.
	ShareWatches               bool
	ShareRingBytes             int
	ShareRingEvents            int
	ShareSubscriberBufferBytes int
	ShareReviewCacheEntries    int
	// ShareRingTotalBytes bounds all feeds' rings together; 0 (the default): derived at
	// Complete from the container's memory limit (FitRingTotal).
	ShareRingTotalBytes int64
	// MemoryBudgetBytes bounds what grows with load, together (package budget); 0 (the
	// default): derived at Complete from the container's memory limit (FitMemoryBudget).
	MemoryBudgetBytes int64
	// ShareExcludeResources are resources (as --fix-exempt-resource names them) whose watches
	// never share; ShareMaxFeeds bounds the shared feeds open at once.
	ShareExcludeResources []string
	ShareMaxFeeds         int
	// ShareReviewedWatchLists lets watch-lists with credentials of their own hand off onto
	// shared feeds once reviewed (watch.Config.ShareReviewedWatchLists); off by default.
	ShareReviewedWatchLists bool

	// Coalesced reads (package coalesce): CoalesceReads switches them on; the rest bound them
	// (members per upstream read, keys with a read, bytes a member may lag).
	CoalesceReads      bool
	CoalesceMaxMembers int
	CoalesceMaxGroups  int
	CoalesceLagBytes   int
	CoalesceTotalBytes int64

	// ShutdownDelay is how long readiness fails before the listeners close at shutdown.
	ShutdownDelay   time.Duration
	ShutdownTimeout time.Duration
	LogLevel        string
	// LogFormat is json (one object per line) or console (for people); "" (the zero value and
	// the default): console when stderr is a terminal, json otherwise (logging.ResolveFormat).
	LogFormat string
	// AccessLog writes one "request" line per main-listener request (logger watchsan.access);
	// false (the zero value): none. Default writes them.
	AccessLog bool

	// HA frontend: failure detection, balancing, moving watches, membership (ha.go).
	HA
	// Frontend replicas that shed connections above their share (replicas.go).
	Replicas
}

// Default returns the configuration with every default filled in. Where a package owns a
// setting, its default is that package's constant: one home per default.
func Default() Config {
	return Config{
		Listen:                "127.0.0.1:8001",
		AdminListen:           "127.0.0.1:9091",
		AdminAuthConfig:       defaultAdminAuth(),
		AcceptHosts:           DefaultAcceptHosts,
		RejectPaths:           DefaultRejectPaths,
		StripIdentityHeaders:  DefaultStripIdentityHeaders,
		IdleTimeout:           DefaultIdleTimeout,
		MaxConnections:        DefaultMaxConnections,
		HTTP2MaxStreams:       DefaultHTTP2MaxStreams,
		DialTimeout:           10 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		KeepAlive:             30 * time.Second,
		HTTP2ReadIdleTimeout:  30 * time.Second,
		HTTP2PingTimeout:      15 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
		HealthInterval:        upstream.DefaultHealthInterval,
		HTTP2StreamWindow:     upstream.DefaultHTTP2StreamWindow,
		HTTP2ConnectionWindow: upstream.DefaultHTTP2ConnectionWindow,
		FixMode:               fix.Repair.String(),
		MaxFrameSize:          stream.DefaultMaxFrameSize,
		DeleteMemoryEntries:   fix.DefaultMemoryEntries,
		DeleteMemoryTTL:       fix.DefaultMemoryAge,
		WatchResumeTimeout:    watch.DefaultResumeTimeout,
		WatchStallTimeout:     watch.DefaultStallTimeout,
		WatchWriteTimeout:     watch.DefaultWriteTimeout,
		WatchMaxLifetime:      watch.DefaultMaxLifetime,
		RetryBudget:           upstream.DefaultRetryBudget,
		WatchAbsorbGone:       true,
		WatchAbsorbStateBytes: watch.DefaultAbsorbStateBytes,
		WatchAbsorbTotalBytes: watch.DefaultAbsorbTotalBytes,
		ShutdownTimeout:       30 * time.Second,
		LogLevel:              "info",
		LogFormat:             "",
		AccessLog:             true,
		HA:                    defaultHA(),
		Replicas:              defaultReplicas(),

		ShareWatches:               true,
		ShareRingBytes:             watch.DefaultShareRingBytes,
		ShareRingEvents:            watch.DefaultShareRingEvents,
		ShareSubscriberBufferBytes: watch.DefaultShareSubscriberBytes,
		ShareReviewCacheEntries:    watch.DefaultShareReviewEntries,
		ShareMaxFeeds:              watch.DefaultShareMaxFeeds,
		CoalesceReads:              true,
		CoalesceMaxMembers:         coalesce.DefaultMaxMembers,
		CoalesceMaxGroups:          coalesce.DefaultMaxGroups,
		CoalesceLagBytes:           coalesce.DefaultLagBytes,
		CoalesceTotalBytes:         coalesce.DefaultTotalBytes,

		ClientHTTP2WriteByteTimeout: DefaultClientHTTP2WriteByteTimeout,
		ClientHTTP2PingInterval:     DefaultClientHTTP2PingInterval,
		ClientHTTP2PingTimeout:      DefaultClientHTTP2PingTimeout,
		MaxRequestHeaderBytes:       DefaultMaxRequestHeaderBytes,
		MaxHeaderBytesPerConnection: DefaultMaxHeaderBytesPerConnection,
	}
}
