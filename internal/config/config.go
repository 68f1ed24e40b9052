// Package config turns watchsan's command line and optional YAML file into a validated
// configuration: flags and file -> Config -> Validate (every problem at once) -> Complete.
package config

import (
	"time"
)

// Config is what the operator asked for, as given. Flags and the --config file share their
// keys: a file key is a flag's name, and its value is applied through that flag (FlagSet), so
// the two can never disagree. Flags win over the file.
type Config struct {
	// ConfigFile is --config: a YAML file with the same keys as the flags.
	ConfigFile string

	// Listen is the main listener's address (plain HTTP unless TLS files are given).
	Listen      string
	TLSCertFile string
	TLSKeyFile  string
	// AdminListen serves watchsan's own /metrics, /healthz, /readyz (and pprof).
	AdminListen string
	EnablePprof bool

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

	// Upstream transport.
	DialTimeout           time.Duration
	TLSHandshakeTimeout   time.Duration
	KeepAlive             time.Duration
	HTTP2ReadIdleTimeout  time.Duration
	HTTP2PingTimeout      time.Duration
	ResponseHeaderTimeout time.Duration
	HealthInterval        time.Duration

	// Watch sanitizing (issue #3).
	FixMode             string
	FixExemptResources  []string
	MaxFrameSize        int
	DeleteMemoryEntries int
	DeleteMemoryTTL     time.Duration

	// Resilient watches (issue #4).
	WatchResumeTimeout time.Duration
	WatchStallTimeout  time.Duration
	DisableResume      bool
	RetryBudget        time.Duration

	ShutdownTimeout time.Duration
	LogLevel        string
	LogFormat       string
}

// Default returns the configuration with every default filled in.
func Default() Config {
	return Config{
		Listen:                "127.0.0.1:8001",
		AdminListen:           "127.0.0.1:9091",
		DialTimeout:           10 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		KeepAlive:             30 * time.Second,
		HTTP2ReadIdleTimeout:  30 * time.Second,
		HTTP2PingTimeout:      15 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
		HealthInterval:        5 * time.Second,
		FixMode:               "repair",
		MaxFrameSize:          16 << 20,
		DeleteMemoryEntries:   100000,
		DeleteMemoryTTL:       30 * time.Minute,
		WatchResumeTimeout:    60 * time.Second,
		WatchStallTimeout:     90 * time.Second,
		RetryBudget:           30 * time.Second,
		ShutdownTimeout:       30 * time.Second,
		LogLevel:              "info",
		LogFormat:             "json",
	}
}
