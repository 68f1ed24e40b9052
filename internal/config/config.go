// Package config turns watchsan's command line and optional YAML file into a validated
// configuration: flags and file -> Config -> Validate (every problem at once) -> Complete.
package config

import (
	"time"
)

// Config is what the operator asked for, as given: flags and the --config file share these keys
// (the YAML key is the flag's name). Flags win over the file.
type Config struct {
	// ConfigFile is --config: a YAML file with the same keys as the flags.
	ConfigFile string `json:"-"`

	// Listen is the main listener's address (plain HTTP unless TLS files are given).
	Listen      string `json:"listen"`
	TLSCertFile string `json:"tls-cert-file"`
	TLSKeyFile  string `json:"tls-private-key-file"`
	// AdminListen serves watchsan's own /metrics, /healthz, /readyz (and pprof).
	AdminListen string `json:"admin-listen"`
	EnablePprof bool   `json:"enable-pprof"`

	// Upstreams are the apiserver URLs; empty means: take the server from the kubeconfig.
	Upstreams             []string `json:"upstream"`
	Kubeconfig            string   `json:"kubeconfig"`
	Context               string   `json:"context"`
	UpstreamCAFile        string   `json:"upstream-ca-file"`
	InsecureSkipTLSVerify bool     `json:"insecure-skip-tls-verify"`
	// NoCredentials never lends the kubeconfig's identity: requests are forwarded only with the
	// Authorization header they carry.
	NoCredentials bool `json:"no-credentials"`
	// AllowNonLoopbackCredentials lets a listener on a non-loopback address lend the
	// kubeconfig's credentials to every caller that can reach it (off: refused at start).
	AllowNonLoopbackCredentials bool `json:"allow-non-loopback-credentials"`

	// Upstream transport.
	DialTimeout           time.Duration `json:"dial-timeout"`
	TLSHandshakeTimeout   time.Duration `json:"tls-handshake-timeout"`
	KeepAlive             time.Duration `json:"tcp-keepalive"`
	HTTP2ReadIdleTimeout  time.Duration `json:"http2-read-idle-timeout"`
	HTTP2PingTimeout      time.Duration `json:"http2-ping-timeout"`
	ResponseHeaderTimeout time.Duration `json:"response-header-timeout"`
	HealthInterval        time.Duration `json:"health-interval"`

	// Watch sanitizing (issue #3).
	FixMode             string        `json:"fix-mode"`
	FixExemptResources  []string      `json:"fix-exempt-resource"`
	MaxFrameSize        int           `json:"max-frame-size"`
	DeleteMemoryEntries int           `json:"delete-memory-entries"`
	DeleteMemoryTTL     time.Duration `json:"delete-memory-ttl"`

	// Resilient watches (issue #4).
	WatchResumeTimeout time.Duration `json:"watch-resume-timeout"`
	WatchStallTimeout  time.Duration `json:"watch-stall-timeout"`
	DisableResume      bool          `json:"disable-watch-resume"`
	RetryBudget        time.Duration `json:"retry-budget"`

	ShutdownTimeout time.Duration `json:"shutdown-timeout"`
	LogLevel        string        `json:"log-level"`
	LogFormat       string        `json:"log-format"`
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
