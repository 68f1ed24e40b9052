package config

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/watchsan/watchsan/internal/upstream"
)

// HA is the configuration of watchsan as the HA frontend of several apiservers:
// how fast a failing upstream is found, how watches are balanced and moved, the time-travel
// guard, and where the set of upstreams comes from. Its flags are registered with the rest
// (FlagSet), and it is validated with the rest (Validate).
type HA struct {
	// HealthPingTimeout bounds the HTTP/2 PING that tells a live apiserver from a frozen or
	// dead one.
	HealthPingTimeout time.Duration
	// HealthProbeTimeout bounds one /readyz probe.
	HealthProbeTimeout time.Duration
	// HealthProbeInterval is the least time between /readyz probes of a healthy upstream.
	HealthProbeInterval time.Duration
	// ProbeKubeconfig is a kubeconfig whose user the /readyz probes go as; empty: the lent
	// identity, else none (docs/design.md section 10.6).
	ProbeKubeconfig string
	// WatchLagTimeout: a watch that has not delivered an event a watch of the same scope on
	// another upstream delivered this long ago is moved; 0: never.
	WatchLagTimeout time.Duration
	// WatchRebalanceRate is how many watches a second move onto healthy upstreams with fewer
	// watches; 0: never.
	WatchRebalanceRate float64
	// WatchDrainRate is how many watches a second move off a degraded or removed upstream;
	// 0: all at once.
	WatchDrainRate float64
	// TimeTravelGuard sends a list at resourceVersion=0 with watchsan's high-water mark and
	// resourceVersionMatch=NotOlderThan.
	TimeTravelGuard bool
	// UpstreamDiscovery is "" (the --upstream flags) or "endpoints" (follow the EndpointSlices
	// of the default/kubernetes Service, starting from --upstream).
	UpstreamDiscovery string
	// UpstreamDiscoveryInterval is how often the EndpointSlices are read.
	UpstreamDiscoveryInterval time.Duration
	// ConfigCheckInterval is how often the --config file is checked for a change (a change is
	// applied as SIGHUP is); 0: only on SIGHUP.
	ConfigCheckInterval time.Duration
}

// DiscoveryEndpoints is the --upstream-discovery value that follows the default/kubernetes
// Service's EndpointSlices.
const DiscoveryEndpoints = "endpoints"

func defaultHA() HA {
	return HA{
		HealthPingTimeout:         upstream.DefaultPingTimeout,
		HealthProbeTimeout:        upstream.DefaultProbeTimeout,
		HealthProbeInterval:       upstream.DefaultProbeInterval,
		WatchLagTimeout:           upstream.DefaultLagTimeout,
		WatchRebalanceRate:        upstream.DefaultRebalanceRate,
		WatchDrainRate:            upstream.DefaultDrainRate,
		TimeTravelGuard:           true,
		UpstreamDiscoveryInterval: 10 * time.Second,
		ConfigCheckInterval:       2 * time.Second,
	}
}

func (h *HA) flags(fs *pflag.FlagSet, group func(title string)) {
	group("Upstream connections and health")
	fs.DurationVar(&h.HealthPingTimeout, "health-ping-timeout", h.HealthPingTimeout, "how long an upstream may take to answer the HTTP/2 PING that shows it is alive (from half of it, on a fresh connection too; found down 1.5 timeouts after the first PING)")
	fs.DurationVar(&h.HealthProbeInterval, "health-probe-interval", h.HealthProbeInterval, "the least time between /readyz probes of a healthy upstream (one that is not healthy is probed every --health-interval); pings go every --health-interval")
	fs.DurationVar(&h.HealthProbeTimeout, "health-probe-timeout", h.HealthProbeTimeout, "how long an upstream's /readyz may take (an upstream alive but slower than this is degraded, not down)")
	fs.StringVar(&h.ProbeKubeconfig, "probe-kubeconfig", h.ProbeKubeconfig, "kubeconfig whose user (its current context's) the /readyz probes go as, on connections of their own; any authenticated user may read /readyz, so give one without other permissions. With an identity a 401 or 403 means not ready (a restarting apiserver answers so until its authorizer has synced). Default: the kubeconfig's identity when it is lent or impersonates (--identity-forwarding=impersonate), else none, and then a 401 or 403 proves only that the upstream is alive")
	group("Watch resilience")
	fs.DurationVar(&h.WatchLagTimeout, "watch-lag-timeout", h.WatchLagTimeout, "a watch that has not delivered an event another upstream delivered this long ago on a watch of the same scope is moved, and its upstream counted lagging; 0: never")
	fs.Float64Var(&h.WatchRebalanceRate, "watch-rebalance-rate", h.WatchRebalanceRate, "watches moved per second onto healthy upstreams with fewer watches (after a recovery or an addition); 0: never")
	fs.Float64Var(&h.WatchDrainRate, "watch-drain-rate", h.WatchDrainRate, "watches moved per second off a degraded or removed upstream; 0: all at once (an unresponsive upstream's always move at once)")
	group("Watch sanitizing")
	fs.BoolVar(&h.TimeTravelGuard, "time-travel-guard", h.TimeTravelGuard, "send a list at resourceVersion=0 with the highest resourceVersion watchsan has seen for the resource and resourceVersionMatch=NotOlderThan, so a lagging apiserver cannot answer with older data (kubernetes#59848)")
	group("Upstreams")
	fs.StringVar(&h.UpstreamDiscovery, "upstream-discovery", h.UpstreamDiscovery, "endpoints: follow the EndpointSlices of the default/kubernetes Service (read through the upstreams, with the kubeconfig's identity), starting from --upstream; empty: the --upstream flags only")
	fs.DurationVar(&h.UpstreamDiscoveryInterval, "upstream-discovery-interval", h.UpstreamDiscoveryInterval, "how often --upstream-discovery reads the EndpointSlices")
	group("Configuration")
	fs.DurationVar(&h.ConfigCheckInterval, "config-check-interval", h.ConfigCheckInterval, "how often the --config file is checked for a change, applied live like SIGHUP; 0: only on SIGHUP")
}

func (h *HA) validate(add func(format string, a ...any)) {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"health-ping-timeout", h.HealthPingTimeout}, {"health-probe-timeout", h.HealthProbeTimeout},
		{"health-probe-interval", h.HealthProbeInterval},
		{"upstream-discovery-interval", h.UpstreamDiscoveryInterval},
	} {
		if d.v <= 0 {
			add("--%s %s: must be positive", d.flag, d.v)
		}
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"watch-lag-timeout", h.WatchLagTimeout}, {"config-check-interval", h.ConfigCheckInterval}} {
		if d.v < 0 {
			add("--%s %s: must not be negative", d.flag, d.v)
		}
	}
	for _, r := range []struct {
		flag string
		v    float64
	}{{"watch-rebalance-rate", h.WatchRebalanceRate}, {"watch-drain-rate", h.WatchDrainRate}} {
		if r.v < 0 || r.v > 1e6 || r.v != r.v {
			add("--%s %v: want 0 to 1000000 per second", r.flag, r.v)
		}
	}
	if h.ProbeKubeconfig != "" {
		if _, err := os.Stat(h.ProbeKubeconfig); err != nil {
			add("--probe-kubeconfig: %w", err)
		}
	}
	switch h.UpstreamDiscovery {
	case "", DiscoveryEndpoints:
	default:
		add("--upstream-discovery %q: want %q or empty", h.UpstreamDiscovery, DiscoveryEndpoints)
	}
}

// PoolRates maps the rate flags to upstream.PoolOptions' (whose zero means the default).
func (h HA) PoolRates() (rebalance, drain float64) {
	rebalance, drain = h.WatchRebalanceRate, h.WatchDrainRate
	if rebalance == 0 {
		rebalance = -1 // never
	}
	if drain == 0 {
		drain = -1 // all at once
	}
	return rebalance, drain
}

// PoolLagTimeout maps --watch-lag-timeout to upstream.PoolOptions' (whose zero is the default).
func (h HA) PoolLagTimeout() time.Duration {
	if h.WatchLagTimeout == 0 {
		return -1
	}
	return h.WatchLagTimeout
}

// LiveChanges lists the settings that differ between two configurations and can only take
// effect at a restart (a reload applies the upstream set and ignores these, saying so).
func LiveChanges(old, new Config) (restartOnly []string) {
	o, n := old, new
	// What a reload applies.
	o.Upstreams, n.Upstreams = nil, nil
	o.ConfigFile, n.ConfigFile = "", ""
	o.FileLines, n.FileLines = nil, nil
	if fmt.Sprintf("%+v", o) != fmt.Sprintf("%+v", n) {
		of, nf := FlagSet(&o), FlagSet(&n)
		of.VisitAll(func(f *pflag.Flag) {
			if _, alias := f.Value.(verbosity); alias {
				return // -v is --log-level, reported as such
			}
			if g := nf.Lookup(f.Name); g != nil && g.Value.String() != f.Value.String() {
				restartOnly = append(restartOnly, "--"+f.Name)
			}
		})
	}
	return restartOnly
}
