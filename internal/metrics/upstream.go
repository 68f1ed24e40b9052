package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// UpstreamMetrics are the per-upstream series. Their upstream label takes only the names of
// the configured or discovered upstreams: gauges are read from the current set at each scrape
// (Source), and the counters of an upstream are deleted when it is forgotten (Forget).
type UpstreamMetrics struct {
	// Moves counts watches moved off an upstream, by reason (unhealthy, degraded, removed,
	// rebalance, lagging).
	Moves *prometheus.CounterVec // upstream, reason
	// Resumes counts watches that broke on an upstream and were resumed (there or elsewhere),
	// by why they broke.
	Resumes *prometheus.CounterVec // upstream, reason
	// Detection observes how long finding an upstream unhealthy or lagging took: from its last
	// sign of life (or the first sign of lag) to the verdict.
	Detection *prometheus.HistogramVec // upstream, what
	// ListsRaised counts lists at resourceVersion=0 sent with the high-water mark instead
	// (the time-travel guard), by outcome: sent, too-large (every upstream was behind).
	ListsRaised *prometheus.CounterVec // outcome

	mu     sync.Mutex
	source func() []UpstreamSample
}

// UpstreamSample is one upstream's state at a scrape.
type UpstreamSample struct {
	Name        string
	State       string
	States      []string // every state name, to report 0 for the others
	InFlight    int64
	OpenWatches int64
	Lagging     bool
	// Unverified: counted as ready without proof (its /readyz answered 401 or 403 to an
	// anonymous probe).
	Unverified bool
}

var (
	descState      = prometheus.NewDesc("watchsan_upstream_state", "1 for the upstream's current health state (unknown, healthy, degraded, unhealthy, removed), 0 for the others.", []string{"upstream", "state"}, nil)
	descInFlight   = prometheus.NewDesc("watchsan_upstream_in_flight_requests", "Short requests sent to the upstream and not finished (what request balancing compares).", []string{"upstream"}, nil)
	descWatches    = prometheus.NewDesc("watchsan_upstream_open_watches", "Watch attempts open on the upstream (what watch balancing compares).", []string{"upstream"}, nil)
	descLagging    = prometheus.NewDesc("watchsan_upstream_lagging", "1 while the upstream is held back for serving older data than the others.", []string{"upstream"}, nil)
	descUnverified = prometheus.NewDesc("watchsan_upstream_readiness_unverified", "1 while the upstream counts as ready without proof: its /readyz answered 401 or 403 to watchsan's anonymous probe, so it is alive, its readiness unknown (give watchsan --probe-kubeconfig).", []string{"upstream"}, nil)
)

func (u *UpstreamMetrics) register(reg *prometheus.Registry) {
	u.Moves = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_upstream_watch_moves_total", Help: "Watches watchsan moved off the upstream to another one (resumed there losslessly), by reason."}, []string{"upstream", "reason"})
	u.Resumes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_upstream_watch_resumes_total", Help: "Upstream watches that broke on the upstream and were resumed, by why they broke."}, []string{"upstream", "reason"})
	u.Detection = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "watchsan_upstream_detection_seconds", Help: "Time from the upstream's last sign of life (or its first sign of lag) to watchsan's verdict, by verdict (unhealthy, lagging).", Buckets: []float64{0.25, 0.5, 1, 1.5, 2, 2.5, 3, 4, 5, 7.5, 10, 20, 60}}, []string{"upstream", "what"})
	u.ListsRaised = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_list_rv_raised_total", Help: "Lists at resourceVersion=0 sent with the highest resourceVersion watchsan has seen for the resource and resourceVersionMatch=NotOlderThan (the time-travel guard), by outcome."}, []string{"outcome"})
	reg.MustRegister(u.Moves, u.Resumes, u.Detection, u.ListsRaised, u)
}

// Source sets the function read at each scrape for the per-upstream gauges.
func (u *UpstreamMetrics) Source(f func() []UpstreamSample) {
	u.mu.Lock()
	u.source = f
	u.mu.Unlock()
}

// Forget deletes every counter series of a forgotten upstream.
func (u *UpstreamMetrics) Forget(upstream string) {
	l := prometheus.Labels{"upstream": upstream}
	u.Moves.DeletePartialMatch(l)
	u.Resumes.DeletePartialMatch(l)
	u.Detection.DeletePartialMatch(l)
}

// Describe implements prometheus.Collector for the gauges.
func (u *UpstreamMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- descState
	ch <- descInFlight
	ch <- descWatches
	ch <- descLagging
	ch <- descUnverified
}

// Collect implements prometheus.Collector for the gauges.
func (u *UpstreamMetrics) Collect(ch chan<- prometheus.Metric) {
	u.mu.Lock()
	f := u.source
	u.mu.Unlock()
	if f == nil {
		return
	}
	for _, s := range f() {
		for _, st := range s.States {
			v := 0.0
			if st == s.State {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, v, s.Name, st)
		}
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(s.InFlight), s.Name)
		ch <- prometheus.MustNewConstMetric(descWatches, prometheus.GaugeValue, float64(s.OpenWatches), s.Name)
		lag := 0.0
		if s.Lagging {
			lag = 1
		}
		ch <- prometheus.MustNewConstMetric(descLagging, prometheus.GaugeValue, lag, s.Name)
		unverified := 0.0
		if s.Unverified {
			unverified = 1
		}
		ch <- prometheus.MustNewConstMetric(descUnverified, prometheus.GaugeValue, unverified, s.Name)
	}
}
