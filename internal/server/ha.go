package server

// watchsan as the HA frontend of several apiservers: the pool's HA settings and
// per-upstream metrics, the time-travel guard for lists, live reloads of the upstream set,
// and upstream discovery from the default/kubernetes Service's EndpointSlices.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/watchsan/watchsan/internal/config"
	"github.com/watchsan/watchsan/internal/metrics"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/upstream"
	"github.com/watchsan/watchsan/internal/watch"
)

// haState is the server's HA frontend state.
type haState struct {
	attempts *upstream.Attempter

	reloadMu sync.Mutex
	applied  *config.Completed // the last configuration applied (at start, or by Reload)
	// discovered is the set the EndpointSlices named last; nil: discovery has not succeeded
	// (the configured upstreams are used).
	discovered []*url.URL
}

// haPoolOptions completes the pool's options with the HA settings and the per-upstream
// metric hooks.
func (s *Server) haPoolOptions(o *upstream.PoolOptions) {
	cfg := s.cfg
	o.ProbeTimeout = cfg.HealthProbeTimeout
	o.ProbeInterval = cfg.HealthProbeInterval
	o.PingTimeout = cfg.HealthPingTimeout
	o.LagTimeout = cfg.PoolLagTimeout()
	o.RebalanceRate, o.DrainRate = cfg.PoolRates()
	o.OnMove = func(b *upstream.Backend, r upstream.MoveReason) {
		s.metrics.Upstream.Moves.WithLabelValues(b.String(), r.String()).Inc()
		s.recent.add("move", b.String(), "", r.String())
	}
	o.OnDetect = func(b *upstream.Backend, what string, d time.Duration) {
		s.metrics.Upstream.Detection.WithLabelValues(b.String(), what).Observe(d.Seconds())
	}
	o.OnAdd = s.initUpstreamSeries
	o.OnForget = func(b *upstream.Backend) {
		name := b.String()
		s.metrics.UpstreamUp.DeleteLabelValues(name)
		s.metrics.UpstreamDials.DeletePartialMatch(map[string]string{"upstream": name})
		s.metrics.Upstream.Forget(name)
	}
}

// haMetrics sets up the per-upstream series of the pool's first backends and the gauges read
// at each scrape.
func (s *Server) haMetrics() {
	s.applied = s.cfg
	for _, b := range s.pool.Backends() {
		s.initUpstreamSeries(b)
	}
	var states []string
	for _, st := range upstream.States() {
		states = append(states, st.String())
	}
	s.metrics.Upstream.Source(func() []metrics.UpstreamSample {
		bs := s.pool.Backends()
		out := make([]metrics.UpstreamSample, len(bs))
		for i, b := range bs {
			out[i] = metrics.UpstreamSample{Name: b.String(), State: b.State().String(), States: states,
				InFlight: b.InFlight(), OpenWatches: b.OpenWatches(), Lagging: b.Lagging(),
				Unverified: b.ReadinessUnverified()}
		}
		return out
	})
	for _, o := range []string{"sent", "too-large"} {
		s.metrics.Upstream.ListsRaised.WithLabelValues(o)
	}
}

// initUpstreamSeries creates an upstream's series at 0: alerts see 0, not "no data".
func (s *Server) initUpstreamSeries(b *upstream.Backend) {
	name := b.String()
	s.metrics.UpstreamUp.WithLabelValues(name).Set(0)
	for _, conn := range []string{upstream.ConnRequests, upstream.ConnHealth} {
		s.metrics.UpstreamDials.WithLabelValues(name, conn, "ok")
		s.metrics.UpstreamDials.WithLabelValues(name, conn, "error")
	}
	for _, r := range upstream.MoveReasons() {
		s.metrics.Upstream.Moves.WithLabelValues(name, r.String())
	}
	for _, r := range watch.ResumeReasons() {
		s.metrics.Upstream.Resumes.WithLabelValues(name, r.String())
	}
	for _, what := range []string{"unhealthy", "lagging"} { // upstream.PoolOptions.OnDetect
		s.metrics.Upstream.Detection.WithLabelValues(name, what)
	}
}

// onBreak counts a watch that broke on b and is resumed.
func (s *Server) onBreak(b *upstream.Backend, r watch.ResumeReason) {
	s.metrics.Upstream.Resumes.WithLabelValues(b.String(), r.String()).Inc()
	s.recent.add("resume", b.String(), "", r.String())
}

// listGuard is the time-travel guard (kubernetes#59848): a list at resourceVersion=0 may be
// answered from any apiserver's watch cache, one behind what the client has already seen
// included. When watchsan has seen a higher resourceVersion of the resource (on any watch,
// from any upstream), the list is sent at that RV with resourceVersionMatch=NotOlderThan: a
// lagging apiserver then waits for its cache, or answers 504 after 3 s, which the Attempter
// tries on another upstream (docs/design.md section 2). The answer is at least as new as
// anything watchsan delivered, and as RV=0 allows, it may be newer; like a list at RV=0 it is
// not paged (the client's limit is dropped). When every upstream
// answers 504 (an etcd restored from a backup starts below the mark), the mark is dropped.
func (s *Server) listGuard(w http.ResponseWriter, r *http.Request, c *classified) {
	r, plan, settle := s.raiseList(r, &c.info, upstream.Plan{Credentials: c.cred})
	if settle == nil {
		s.proxy.serve(w, r, c, plan)
		return
	}
	s.proxy.serve(&onStatus{ResponseWriter: w, f: settle}, r, c, plan)
}

// raiseList is what listGuard sends for the list r (classified as info) with plan: r at the
// high-water mark, its plan raised, and settle, to be called with the answer's status before
// the client can read it (a client that retries at once after the 504 must find the mark
// gone); or r and plan as they are, and a nil settle, when the guard does not apply.
func (s *Server) raiseList(r *http.Request, info *reqinfo.Info, plan upstream.Plan) (*http.Request, upstream.Plan, func(code int)) {
	q := r.URL.Query()
	high, ok := uint64(0), false
	if m := q.Get("resourceVersionMatch"); q.Get("resourceVersion") == "0" && (m == "" || m == "NotOlderThan") {
		high, ok = s.pool.HighWater(info.GroupResource())
	}
	if !s.cfg.TimeTravelGuard || info.Verb != "list" || r.Method != http.MethodGet || !ok {
		return r, plan, nil
	}
	resource := info.GroupResource()
	q.Set("resourceVersion", strconv.FormatUint(high, 10))
	q.Set("resourceVersionMatch", "NotOlderThan")
	// A list at RV 0 is served whole from the watch cache, its limit ignored; at an RV
	// above 0 the limit would page it, and a client that knows RV 0 is never paged may
	// not follow a continue token.
	q.Del("limit")
	u := *r.URL
	u.RawQuery = q.Encode()
	r = r.WithContext(r.Context()) // a shallow copy: the client's request stays as it came
	r.URL = &u
	plan.RetryTooLarge = true
	return r, plan, func(code int) {
		outcome := "sent"
		if code == http.StatusGatewayTimeout {
			outcome = "too-large"
			s.pool.ForgetHighWater(resource)
			s.log.Warn("no upstream could serve a list at watchsan's high-water resourceVersion; the mark is dropped",
				zap.String("resource", resource), zap.Uint64("resourceVersion", high))
		}
		s.metrics.Upstream.ListsRaised.WithLabelValues(outcome).Inc()
	}
}

// onStatus calls f once with the response's final status code, before that status is passed
// on to the client (informational 1xx codes are passed on without calling f).
type onStatus struct {
	http.ResponseWriter
	f    func(code int)
	done bool
}

func (o *onStatus) WriteHeader(code int) {
	if !o.done && code >= 200 {
		o.done = true
		o.f(code)
	}
	o.ResponseWriter.WriteHeader(code)
}

func (o *onStatus) Write(p []byte) (int, error) {
	if !o.done {
		o.WriteHeader(http.StatusOK)
	}
	return o.ResponseWriter.Write(p)
}

func (o *onStatus) Unwrap() http.ResponseWriter { return o.ResponseWriter }

// Reload applies a new configuration: its upstream set (with discovery, the configured set is
// only the seed, used until the EndpointSlices have been read). Every other change needs a
// restart: it is logged and ignored.
func (s *Server) Reload(c *config.Completed) error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	if ignored := config.LiveChanges(s.applied.Config, c.Config); len(ignored) > 0 {
		s.log.Warn("configuration reloaded: these settings change only at a restart and are ignored until then",
			zap.Strings("flags", ignored))
	}
	s.applied = c
	if s.cfg.UpstreamDiscovery != "" && s.discovered != nil {
		s.log.Info("configuration reloaded; the upstreams follow discovery", zap.Int("discovered", len(s.discovered)))
		return nil
	}
	return s.setUpstreams(c.Upstreams, "configuration reloaded")
}

// setUpstreams applies a set of upstreams and logs what changed; reloadMu is held.
func (s *Server) setUpstreams(urls []*url.URL, why string) error {
	added, removed, err := s.pool.SetUpstreams(urls)
	if err != nil {
		s.log.Error(why+"; the upstreams are unchanged", zap.Error(err))
		return err
	}
	names := make([]string, len(urls))
	for i, u := range urls {
		names[i] = u.String()
	}
	lvl := s.log.Debug
	if len(added)+len(removed) > 0 {
		lvl = s.log.Info
	}
	lvl(why, zap.Strings("upstreams", names), zap.Strings("added", added), zap.Strings("removed", removed))
	return nil
}

// discover follows the apiservers' own EndpointSlice, default/kubernetes (kept by their
// endpoint reconciler: readEndpoints), until ctx ends, reading it every discovery interval
// through the pool, with backoff after a failure. An unreadable or empty answer, or one that
// is not the apiservers' slice, changes nothing.
func (s *Server) discover(ctx context.Context) {
	if s.cfg.UpstreamDiscovery != config.DiscoveryEndpoints {
		return
	}
	interval := s.cfg.UpstreamDiscoveryInterval
	bo := upstream.Backoff{Initial: min(time.Second, interval), Max: interval, Jitter: 0.2}
	failing := false
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next := interval
		urls, err := s.readEndpoints(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if !failing {
				s.log.Warn("upstream discovery failed; the upstreams are unchanged", zap.Error(err))
			}
			failing = true
			next = bo.Next()
		default:
			if failing {
				s.log.Info("upstream discovery works again")
			}
			failing = false
			bo.Reset()
			s.reloadMu.Lock()
			if !sameURLs(s.discovered, urls) {
				if s.setUpstreams(urls, "upstreams discovered") == nil {
					s.discovered = urls
				}
			}
			s.reloadMu.Unlock()
		}
		t.Reset(next)
	}
}

func sameURLs(a, b []*url.URL) bool {
	if a == nil || len(a) != len(b) {
		return false
	}
	as, bs := make([]string, len(a)), make([]string, len(b))
	for i := range a {
		as[i], bs[i] = a[i].String(), b[i].String()
	}
	slices.Sort(as)
	slices.Sort(bs)
	return slices.Equal(as, bs)
}

// endpointSlice is the part of a discovery.k8s.io/v1 EndpointSlice discovery reads.
type endpointSlice struct {
	Metadata struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	AddressType string `json:"addressType"`
	Endpoints   []struct {
		Addresses  []string `json:"addresses"`
		Conditions struct {
			Ready *bool `json:"ready"`
		} `json:"conditions"`
	} `json:"endpoints"`
	Ports []struct {
		Name *string `json:"name"`
		Port *int32  `json:"port"`
	} `json:"ports"`
}

// The apiservers' own EndpointSlice: kube-apiserver's endpoint reconciler
// (pkg/controlplane/reconcilers/endpointsadapter.go, k8s.io/kubernetes v1.37.2) writes one
// slice named after the Service, "kubernetes", labelled kubernetes.io/service-name=kubernetes
// and nothing else: no endpointslice.kubernetes.io/managed-by, which every EndpointSlice
// controller sets on the slices it manages (and the mirroring controller skips the
// apiservers' Endpoints, which the reconciler marks skip-mirror).
const (
	apiserverSlice      = "kubernetes"
	labelServiceName    = "kubernetes.io/service-name"
	labelSliceManagedBy = "endpointslice.kubernetes.io/managed-by"
)

// readEndpoints reads the apiservers' addresses from their own EndpointSlice: every ready
// endpoint, at its https port. Only that slice counts: any other slice labelled for the
// kubernetes Service (anyone who may create EndpointSlices in default can write one, naming
// an address of their choice) is never read, and the slice itself is refused when it says
// another manager wrote it.
func (s *Server) readEndpoints(ctx context.Context) ([]*url.URL, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var sl endpointSlice
	from, err := s.getSelf(ctx, "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/"+apiserverSlice, &sl, upstream.Self)
	if err != nil {
		return nil, err
	}
	switch by, managed := sl.Metadata.Labels[labelSliceManagedBy]; {
	case sl.Metadata.Name != apiserverSlice || sl.Metadata.Labels[labelServiceName] != "kubernetes":
		return nil, fmt.Errorf("%s: the EndpointSlice default/%s is not the kubernetes Service's", from, apiserverSlice)
	case managed:
		return nil, fmt.Errorf("%s: the EndpointSlice default/%s is managed by %q, not by the apiservers' endpoint reconciler (which sets no %s); it is not followed", from, apiserverSlice, by, labelSliceManagedBy)
	}
	port := int32(0)
	for _, p := range sl.Ports {
		if p.Port != nil && (port == 0 || (p.Name != nil && *p.Name == "https")) {
			port = *p.Port
		}
	}
	if port == 0 || (sl.AddressType != "IPv4" && sl.AddressType != "IPv6") {
		return nil, fmt.Errorf("%s: the apiservers' EndpointSlice has no port or an address type %q", from, sl.AddressType)
	}
	seen := map[string]bool{}
	var urls []*url.URL
	for _, ep := range sl.Endpoints {
		if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
			continue
		}
		for _, a := range ep.Addresses {
			if net.ParseIP(a) == nil {
				continue
			}
			u := &url.URL{Scheme: "https", Host: net.JoinHostPort(a, strconv.Itoa(int(port)))}
			if !seen[u.String()] {
				seen[u.String()] = true
				urls = append(urls, u)
			}
		}
	}
	if len(urls) == 0 {
		return nil, fmt.Errorf("%s: the apiservers' EndpointSlice names no ready apiserver", from)
	}
	return urls, nil
}

// getSelf reads the JSON object at path from an apiserver with one of watchsan's own
// identities (upstream.Self, or ownIdentity's; the token it set on header, if any, goes
// along) into into, at most 8 MiB of it: which apiserver answered, or an error that names it,
// its status and the start of its answer for anything but a 200.
func (s *Server) getSelf(ctx context.Context, path string, into any, cred upstream.Credentials, header ...http.Header) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, path, nil)
	if err != nil {
		return "", err
	}
	for _, h := range header {
		req.Header = h.Clone()
	}
	req.Header.Set("Accept", "application/json")
	at, err := s.attempts.Do(ctx, req, upstream.Plan{Credentials: cred})
	if err != nil {
		return "", err
	}
	defer at.Cancel(nil)
	defer at.Resp.Body.Close()
	from := at.Backend.String()
	if at.Resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(at.Resp.Body, 512))
		return from, fmt.Errorf("%s answered %d to GET %s: %s", from, at.Resp.StatusCode, path, body)
	}
	if err := json.NewDecoder(io.LimitReader(at.Resp.Body, 8<<20)).Decode(into); err != nil {
		return from, fmt.Errorf("%s: GET %s: %w", from, path, err)
	}
	return from, nil
}
