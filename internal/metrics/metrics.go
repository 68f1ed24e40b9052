// Package metrics defines watchsan's Prometheus metrics, all named watchsan_*, registered on a
// registry of the caller's (never the global one) so tests and the demo can read them.
package metrics

import (
	"runtime"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics holds every collector. A nil *Metrics is not allowed; use New.
type Metrics struct {
	Registry *prometheus.Registry

	Requests       *prometheus.CounterVec   // verb, resource, code
	RequestSeconds *prometheus.HistogramVec // verb, resource
	InFlight       prometheus.Gauge
	OpenWatches    *prometheus.GaugeVec   // resource
	Bytes          *prometheus.CounterVec // direction: upstream_to_client | client_to_upstream
	UpstreamUp     *prometheus.GaugeVec   // upstream
	UpstreamDials  *prometheus.CounterVec // upstream, connection: requests | health | unauthenticated, result: ok | error

	WatchEvents    *prometheus.CounterVec // resource, type, action (passed|rewritten|dropped)
	WatchRegressed *prometheus.CounterVec // resource: streams that saw at least one regression
	NonIntegerRVs  *prometheus.CounterVec // resource
	StreamEnds     *prometheus.CounterVec // reason
	DeleteMemory   prometheus.GaugeFunc

	Resumes       *prometheus.CounterVec // reason
	Stalls        prometheus.Counter
	StallsHung    prometheus.Counter
	SlowClients   *prometheus.CounterVec // reason: what the client did not take (watch.SlowClientReasons)
	ResumeSeconds prometheus.Histogram
	// ResumeBrake is the waits the resume brake imposed (internal/watch brake.go).
	ResumeBrake   prometheus.Histogram
	RelistsForced prometheus.Counter
	// Absorbing a 410 at a watch's resume point (internal/watch absorb.go).
	GoneAbsorbed        *prometheus.CounterVec // outcome
	AbsorbEvents        *prometheus.CounterVec // type
	AbsorbStateBytes    prometheus.Gauge
	AbsorbStatesDropped prometheus.Counter
	// result
	AbsorbCompletingLists *prometheus.CounterVec
	// result
	AbsorbClientLists *prometheus.CounterVec
	Retries           *prometheus.CounterVec // outcome

	WatchMovesFailed *prometheus.CounterVec // reason (upstream.MoveReason)
	WatchFreshPoints prometheus.Counter

	// Shared feeds (internal/watch/share.go).
	SharedFeeds           prometheus.Gauge
	SharedSubscribers     prometheus.Gauge
	SharedJoins           prometheus.Counter
	PrivateFeeds          *prometheus.CounterVec // reason (watch.PrivateFeedReasons)
	SharedAccessReviews   *prometheus.CounterVec // result (review.Results)
	APIServiceReads       *prometheus.CounterVec // result: ok | error
	SharedRingEvictions   *prometheus.CounterVec
	SharedRingBytes       prometheus.Gauge
	SharedSlowSubscribers prometheus.Counter
	SharedHandoffs        *prometheus.CounterVec // result (watch.HandoffResults)

	// Coalesced reads (--coalesce-reads, package coalesce).
	CoalescedReads        *prometheus.CounterVec   // kind
	CoalesceUpstreamReads *prometheus.CounterVec   // kind
	CoalesceMembers       *prometheus.HistogramVec // kind
	CoalesceLagging       *prometheus.CounterVec   // kind
	CoalesceBypassed      *prometheus.CounterVec   // reason

	Refused         *prometheus.CounterVec // reason: requests watchsan refused itself (RefusalReasons)
	Connections     *prometheus.GaugeVec   // listener: main | admin
	ConnectionLimit *prometheus.GaugeVec   // listener
	// ConnectionRebalanceLimit is the most main-listener connections this replica holds
	// before it sheds one (package shed); 0: it never sheds.
	ConnectionRebalanceLimit prometheus.Gauge
	ConnectionsShed          *prometheus.CounterVec // reason: main-listener connections refused or closed by a limit (ShedReasons)
	TLSReloads               *prometheus.CounterVec // result: ok | error (the main listener's TLS files)

	// BuildInfo is 1 for the running build's version, revision and Go version (SetVersion).
	BuildInfo *prometheus.GaugeVec // version, revision, goversion

	// Per upstream (upstream.go).
	Upstream UpstreamMetrics

	labels *boundedLabels
}

// New creates and registers every collector on a fresh registry. deleteMemoryLen, if not nil,
// reports the size of the remembered-deletes table.
func New(deleteMemoryLen func() float64) *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	m := &Metrics{Registry: reg, labels: newBoundedLabels()}
	m.Requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_requests_total", Help: "Requests proxied, by verb, resource and HTTP status code."}, []string{"verb", "resource", "code"})
	m.RequestSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "watchsan_request_duration_seconds", Help: "Duration of proxied requests other than watches and upgrades.", Buckets: RequestBuckets}, []string{"verb", "resource"})
	m.InFlight = prometheus.NewGauge(prometheus.GaugeOpts{Name: "watchsan_requests_in_flight", Help: "Requests being served now, watches included."})
	m.OpenWatches = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "watchsan_open_watches", Help: "Client watches open now, by resource."}, []string{"resource"})
	m.Bytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_bytes_total", Help: "Body bytes proxied, by direction."}, []string{"direction"})
	m.UpstreamUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "watchsan_upstream_up", Help: "1 while the upstream's health check passes; 0 while it fails or before its first answer."}, []string{"upstream"})
	m.UpstreamDials = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_upstream_dials_total", Help: "TCP connections watchsan opened (or failed to open) to each upstream, by what they are for (requests: shared by client requests and watches; health: the health checker's pings and /readyz probes; unauthenticated: connections of their own for requests the apiserver will not authenticate) and result."}, []string{"upstream", "connection", "result"})
	m.WatchEvents = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_watch_events_total", Help: "Watch events by resource, type and action (passed, rewritten, dropped)."}, []string{"resource", "type", "action"})
	m.WatchRegressed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_watch_streams_regressed_total", Help: "Watch streams in which the upstream sent at least one regressing or replayed event."}, []string{"resource"})
	m.NonIntegerRVs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_watch_non_integer_rv_total", Help: "Watch events whose resourceVersion is not an integer (passed untouched)."}, []string{"resource"})
	m.StreamEnds = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_watch_stream_ends_total", Help: "Client watch streams ended, by reason."}, []string{"reason"})
	m.Resumes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_watch_resumes_total", Help: "Upstream watches resumed without ending the client's stream, by the reason the upstream broke."}, []string{"reason"})
	m.Stalls = prometheus.NewCounter(prometheus.CounterOpts{Name: "watchsan_watch_stalls_total", Help: "Upstream watches silent (not even a bookmark) for the stall timeout, and resumed: hung, or caught up on a resource nothing changes (an apiserver sends such a watch nothing)."})
	m.StallsHung = prometheus.NewCounter(prometheus.CounterOpts{Name: "watchsan_watch_stalls_hung_total", Help: "Stalls whose resume delivered at once (within 1s) object events the silent stream had held back: the path had hung (an apiserver, an L7 hop)."})
	m.SlowClients = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_watch_slow_clients_total", Help: "Client watches ended because a write to the client did not complete within --watch-write-timeout (it stopped reading, or reads slower than its watch delivers; its upstream watch is closed), by what it was sent: events (a stream watchsan parses), relayed (a response relayed unparsed)."}, []string{"reason"})
	m.ResumeSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "watchsan_watch_resume_duration_seconds", Help: "Time from an upstream watch breaking to its resumption.", Buckets: ResumeBuckets})
	m.ResumeBrake = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "watchsan_watch_resume_brake_seconds", Help: "Waits the resume brake imposed before resuming an upstream watch whose streams keep ending young though they deliver events (after 2 such streams in a row, at most one resume request per 250 ms doubling to 5 s, +-25%, until a stream lives 5 s; docs/design.md section 5). Resumes that deliver nothing are paced by the backoff instead, and not counted here.", Buckets: BrakeBuckets})
	m.SharedFeeds = prometheus.NewGauge(prometheus.GaugeOpts{Name: "watchsan_shared_feeds", Help: "Shared watch feeds open now (--share-watches): each is one upstream watch serving every identical client watch of the lent identity."})
	m.SharedSubscribers = prometheus.NewGauge(prometheus.GaugeOpts{Name: "watchsan_shared_feed_subscribers", Help: "Client watches served by a shared feed now."})
	m.SharedJoins = prometheus.NewCounter(prometheus.CounterOpts{Name: "watchsan_shared_feed_joins_total", Help: "Client watches that joined a shared feed already open (the ones that opened a feed are not counted)."})
	m.PrivateFeeds = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_watch_private_feeds_total", Help: "Client watches given an upstream watch of their own while --share-watches is on, by why: identity (anonymous: no review can say what its watch would get), access-denied (its own credentials refused by the access review), access-review-failed (the review got no answer in time), initial-state (resourceVersion \"\" or 0), watch-list (sendInitialEvents or resourceVersionMatch, and no handoff: watchsan_shared_feed_handoffs_total), resource-version (no integer, or timeoutSeconds over), not-covered (the feed's ring does not cover it), backlog (more behind than --share-subscriber-buffer-bytes), not-joinable (the feed delivered resourceVersions out of order), feed-failed (the feed's first answer was no stream), excluded (--share-exclude-resource), feed-limit (--share-max-feeds feeds open)."}, []string{"reason"})
	m.SharedAccessReviews = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_shared_feed_access_reviews_total", Help: "Access reviews deciding whether a client watch with credentials of its own may share a feed (or an absorb's list reach it), or a client list a coalesced read across identities (--coalesce-reads), by result: allowed, denied (status.allowed false), unauthorized (the review answered 401), forbidden (403), error (no answer in time, or one watchsan does not read), cached-denied (a denial, 401, 403 or error within 30 s; no request: it only sends the watch to a private feed), coalesced (took the answer of a review sent after the watch arrived, with others; no request of its own). No allowance is ever reused. Only allowed lets a watch share; the first five are SelfSubjectAccessReviews sent; a review whose watches all left is cancelled and counted nowhere."}, []string{"result"})
	m.APIServiceReads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_apiservice_reads_total", Help: "Reads of the cluster's APIServices, which say which API group-versions the apiserver serves itself (where clients of different identities may share a feed), by result: ok, error (then only Kubernetes' built-in group-versions count as served locally, once the last good read is 5 minutes old). At most one per 30 s, and only while clients with credentials of their own watch."}, []string{"result"})
	m.SharedRingEvictions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_shared_feed_ring_evictions_total", Help: "Events evicted from shared feeds' rings, by cause: ring-bytes and ring-events (a ring's own --share-ring-bytes, --share-ring-events), total-own and total-largest (--share-ring-total-bytes reached: the ring that added evicted its own, being over its fair share, or the largest ring's went). A client re-watching from before them gets a private feed."}, []string{"cause"})
	m.SharedRingBytes = prometheus.NewGauge(prometheus.GaugeOpts{Name: "watchsan_shared_feed_ring_bytes", Help: "Bytes of events all shared feeds' rings hold together (--share-ring-total-bytes bounds them)."})
	m.SharedHandoffs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_shared_feed_handoffs_total", Help: "Watch-lists (sendInitialEvents=true) with --share-watches, of the lent identity or of clients with credentials of their own once reviewed, by what became of them at their initial-events-end bookmark: joined (moved onto the open shared feed of the same plain watch) or opened (onto a new one from the bookmark's resourceVersion), and their private upstream watch closed; or stayed private: behind (the feed did not reach the initial events' newest resourceVersion in time), not-covered (the feed's ring starts after the bookmark, or it ended), not-joinable (the feed or the private stream delivered resourceVersions out of order, or the feed rewrote one), backlog (more behind than --share-subscriber-buffer-bytes), feed-failed (the feed's first answer was no stream, or not in time), feed-limit (no feed of the plain watch open and --share-max-feeds are), denied (a client with credentials of its own whose access review at its bookmark did not allow it to watch); or ended-before (the stream ended before its bookmark)."}, []string{"result"})
	m.CoalescedReads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_coalesced_reads_total", Help: "Client reads (--coalesce-reads) answered by an upstream read that another client's identical request (same principal, path, query and answer-shaping headers) began, with no upstream request of their own, by kind: list (a list at resourceVersion \"\" or 0, or a continue page), discovery (/api, /apis and their documents), openapi (/openapi/v2, /openapi/v3). Every one joined a read not yet sent when it arrived (docs/design.md section 18)."}, []string{"kind"})
	m.CoalesceUpstreamReads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_coalesce_upstream_reads_total", Help: "Upstream reads sent by --coalesce-reads, each serving one or more identical client reads, by kind (list, discovery, openapi)."}, []string{"kind"})
	m.CoalesceMembers = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "watchsan_coalesce_members", Help: "Client reads one coalesced upstream read served, by kind (list, discovery, openapi).", Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000}}, []string{"kind"})
	m.CoalesceLagging = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_coalesce_lagging_members_total", Help: "Client reads ended (their response cut, so the client retries) because they fell more than --coalesce-lag-bytes behind the fastest client of their coalesced upstream read, by kind (list, discovery, openapi). No client waits for another."}, []string{"kind"})
	m.CoalesceBypassed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_coalesce_bypassed_total", Help: "Client reads that could have coalesced but were sent upstream on their own, by reason: group-limit (--coalesce-max-groups keys had a read on the wire or pending), member-limit (the pending read of their key had --coalesce-max-members)."}, []string{"reason"})
	m.SharedSlowSubscribers = prometheus.NewCounter(prometheus.CounterOpts{Name: "watchsan_shared_feed_slow_subscribers_total", Help: "Subscribers of shared feeds ended because they fell --share-subscriber-buffer-bytes behind their feed, or a write to them did not complete within --watch-write-timeout (their clients re-watch; no other subscriber waits for them)."})
	m.RelistsForced = prometheus.NewCounter(prometheus.CounterOpts{Name: "watchsan_watch_relists_forced_total", Help: "410 Expired ERROR events sent to clients (each makes the client relist)."})
	m.GoneAbsorbed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_watch_gone_absorbed_total", Help: "410s at a watch's resume point (too old resource version) and what became of them: absorbed (the watch listed its scope and sent its client the difference; no relist), or sent to the client (it relists) because: not-complete (the watch did not begin with the initial state: resourceVersion \"\" or 0, or a watch-list, nor adopted a state: a shared feed opened at a client's resourceVersion), over-budget (its state or the list passed --watch-absorb-state-bytes or --watch-absorb-total-bytes), format (no whole objects: a Table, metadata only; or a format absorbing does not read), list-failed (the list failed within the resume timeout, or did not agree with the state), list-denied (a shared feed's subscriber with its own credentials may watch but not list the scope)."}, []string{"outcome"})
	m.AbsorbEvents = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_watch_absorb_events_total", Help: "Events synthesized by absorbed 410s, by type (DELETED, ADDED, MODIFIED; each absorb's BOOKMARK not counted)."}, []string{"type"})
	m.AbsorbStateBytes = prometheus.NewGauge(prometheus.GaugeOpts{Name: "watchsan_watch_absorb_state_bytes", Help: "Bytes held by watches' states (objects and overhead), kept to absorb a 410 at their resume point, and by absorbs' lists while they are diffed (--watch-absorb-total-bytes bounds them)."})
	m.AbsorbStatesDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "watchsan_watch_absorb_states_dropped_total", Help: "Watches whose state was dropped because it passed --watch-absorb-state-bytes or --watch-absorb-total-bytes: a 410 at their resume point reaches their client."})
	m.AbsorbCompletingLists = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_watch_absorb_completing_lists_total", Help: "Lists at exactly a client's resourceVersion, made when a private watch from it starts (and adopted no state of its ended watch), to know what the client holds so that a 410 at its resume point can be absorbed, by result: complete (the watch holds a complete state), gone (the resourceVersion was compacted), over-budget, failed."}, []string{"result"})
	m.AbsorbClientLists = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_watch_absorb_client_lists_total", Help: "Clients' own lists (resourceVersion unset or 0, answered whole) read as they were sent, to be the state a watch from the list's resourceVersion by the same client absorbs a 410 with, by result: parked (kept for the park time), over-budget, unread (not a list absorbing reads: another format, a page at another resourceVersion than its first, malformed or cut short). A list in pages is counted once, at its last."}, []string{"result"})
	m.WatchMovesFailed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_watch_moves_failed_total", Help: "Watch moves not made because no target accepted the watch's resume point (make-before-break: the watch stayed where it was), by the move's reason."}, []string{"reason"})
	m.WatchFreshPoints = prometheus.NewCounter(prometheus.CounterOpts{Name: "watchsan_watch_fresh_resume_points_total", Help: "Quiet watches given a newer resume point (a bookmark of a same-scope probe watch on their backend) so that they could move."})
	m.Retries = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_request_retries_total", Help: "Retries of requests that failed before their response started, by outcome."}, []string{"outcome"})
	m.Refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_requests_refused_total", Help: "Requests watchsan refused itself before anything went upstream, by reason (host, origin, cors_preflight, path, method, dot_segment, connect, absolute_target, connection_header, impersonation; header_bytes_connection, header_bytes_source: 429, the requests in progress on its connection, or of its source, carried --max-header-bytes-per-connection or --max-header-bytes-per-source of headers, half of it for a request without credentials; rebalance: 429, a watch on a connection this replica shed, which its client retries on a new one)."}, []string{"reason"})
	m.Connections = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "watchsan_connections", Help: "Client connections open now, by listener (upgraded ones included)."}, []string{"listener"})
	m.ConnectionsShed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_connections_shed_total", Help: "Main-listener connections refused or closed by a limit: max_connections (--max-connections were open; the new one is answered 429 with Retry-After: 1 and closed), max_connections_unanswered (the same, while 64 such answers were under way; closed at once), source_connections (the source had --max-connections-per-source open; the new one is closed), source_headers (the source had --max-header-connections-per-source still sending their request's headers; its oldest such one is closed), write_timeout (a write to the client took no byte within --client-http2-write-byte-timeout, or an HTTP/1 watch's write did not complete within --watch-write-timeout; the connection is closed), ping_timeout (an HTTP/2 client did not answer a ping within --client-http2-ping-timeout; the connection is closed), rebalance (the replica held more than watchsan_connection_rebalance_limit; the connection's watches were ended cleanly and its next request answered with Connection: close, a GOAWAY on HTTP/2, so that its client reconnects through the load balancer)."}, []string{"reason"})
	for _, r := range ShedReasons {
		m.ConnectionsShed.WithLabelValues(r)
	}
	m.ConnectionLimit = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "watchsan_connection_limit", Help: "Most client connections a listener serves at once; more are answered 429 (main: watchsan_connections_shed_total) or wait in the kernel's backlog (admin)."}, []string{"listener"})
	m.ConnectionRebalanceLimit = prometheus.NewGauge(prometheus.GaugeOpts{Name: "watchsan_connection_rebalance_limit", Help: "Most main-listener connections this frontend replica holds before it sheds one, to even out the replicas behind a load balancer: its share (--frontend-expected-connections / --frontend-replicas) a tenth over and at least 10; compare with watchsan_connections{listener=\"main\"}. 0: it never sheds."})
	m.TLSReloads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watchsan_tls_reloads_total", Help: "Changes of the main listener's TLS files (serving certificate, key, client CA) seen, by result: ok (in use from the next handshake) or error (they do not load; the previous ones stay)."}, []string{"result"})
	for _, result := range []string{"ok", "error"} { // at 0 from the start: alerts see 0, not no data
		m.TLSReloads.WithLabelValues(result)
	}
	m.BuildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "watchsan_build_info", Help: "Always 1; its labels say which build runs: version, VCS revision and Go version."}, []string{"version", "revision", "goversion"})
	for _, c := range []prometheus.Collector{m.BuildInfo, m.TLSReloads, m.Requests, m.RequestSeconds, m.InFlight, m.OpenWatches, m.Bytes, m.UpstreamUp, m.UpstreamDials, m.WatchEvents, m.WatchRegressed, m.NonIntegerRVs, m.StreamEnds, m.Resumes, m.Stalls, m.StallsHung, m.SlowClients, m.ResumeSeconds, m.ResumeBrake, m.RelistsForced, m.GoneAbsorbed, m.AbsorbEvents, m.AbsorbStateBytes, m.AbsorbStatesDropped, m.AbsorbCompletingLists, m.AbsorbClientLists, m.SharedFeeds, m.SharedSubscribers, m.SharedJoins, m.PrivateFeeds, m.SharedAccessReviews, m.APIServiceReads, m.SharedRingEvictions, m.SharedRingBytes, m.SharedSlowSubscribers, m.SharedHandoffs, m.CoalescedReads, m.CoalesceUpstreamReads, m.CoalesceMembers, m.CoalesceLagging, m.CoalesceBypassed, m.WatchMovesFailed, m.WatchFreshPoints, m.Retries, m.Refused, m.Connections, m.ConnectionLimit, m.ConnectionsShed, m.ConnectionRebalanceLimit} {
		f(c)
	}
	m.Upstream.register(reg)
	m.SetVersion("", "")
	for _, d := range Directions { // every closed-set series from the start: alerts see 0, not "no data"
		m.Bytes.WithLabelValues(d)
	}
	if deleteMemoryLen != nil {
		m.DeleteMemory = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "watchsan_delete_memory_entries", Help: "Rewritten deletes remembered to suppress their replay after a re-watch."}, deleteMemoryLen)
		f(m.DeleteMemory)
	}
	return m
}

// Histogram bounds, chosen round so that they print as le="0.25", not le="3.6450000000000005".
var (
	// RequestBuckets bound short requests: 5 ms (a cached get) to a minute (the apiserver's
	// default request timeout).
	RequestBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	// ResumeBuckets bound the time from a broken upstream watch to its resumption: an
	// immediate resume (milliseconds) to the resume timeout (60 s by default).
	ResumeBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	// BrakeBuckets bound the resume brake's waits: at most its 5 s interval, +25%.
	BrakeBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 7.5}
)

// SetVersion sets watchsan_build_info: version and revision as given (the command line's
// reading of -ldflags and the build info), "unknown" where empty; the Go version is the
// running one's.
func (m *Metrics) SetVersion(version, revision string) {
	if version == "" {
		version = "unknown"
	}
	if revision == "" {
		revision = "unknown"
	}
	m.BuildInfo.Reset()
	m.BuildInfo.WithLabelValues(version, revision, runtime.Version()).Set(1)
}

// Directions are every value of Bytes's direction label.
var Directions = []string{"upstream_to_client", "client_to_upstream"}

// ShedReasons are every value of ConnectionsShed's reason label.
var ShedReasons = []string{"max_connections", "max_connections_unanswered", "source_connections", "source_headers", "write_timeout", "ping_timeout", "rebalance"}

// RefusalReasons are every value of Refused's reason label.
var RefusalReasons = []string{"host", "origin", "cors_preflight", "path", "method", "dot_segment", "connect", "absolute_target", "connection_header", "impersonation", "header_bytes_connection", "header_bytes_source", "rebalance"}

// verbs are the verb label's values besides "other": the apiserver's verbs for resource
// requests (RequestInfoFactory) and the lower-case methods it serves on other paths.
var verbs = map[string]bool{
	"get": true, "list": true, "watch": true, "create": true, "update": true, "patch": true,
	"delete": true, "deletecollection": true, "proxy": true,
	"head": true, "post": true, "put": true, "options": true,
}

// Verb bounds the verb label to a closed set: a verb the apiserver knows, else "other". A
// client chooses the method, and a label taken from it as it came let 20000 random methods
// grow /metrics to 71 MB.
func Verb(v string) string {
	if verbs[v] {
		return v
	}
	return "other"
}

// Resource is r as a resource label, bounded (request paths come from clients): r if the
// upstream has served it (Seen), or if it is one of the first MaxUnservedResources others
// asked for; else "other". Junk, however much of it and however early (after a restart), can
// only take the unserved places, never a served resource's (with one first-come set,
// junk pushed real resources into "other").
func (m *Metrics) Resource(r string) string { return m.labels.get(r) }

// Seen records that a request for resource r was answered by the upstream with a 2xx (or
// 101): r is a real resource and gets a label of its own, one of MaxResources.
func (m *Metrics) Seen(r string) { m.labels.add(r) }

// The resource label's bounds: served resources, and others (junk, or a real resource nobody
// was allowed to use yet: a 403 does not tell them apart).
const (
	MaxResources         = 500
	MaxUnservedResources = 100
)

type boundedLabels struct {
	mu       sync.RWMutex
	served   map[string]struct{}
	unserved map[string]struct{}
}

func newBoundedLabels() *boundedLabels {
	return &boundedLabels{served: map[string]struct{}{}, unserved: map[string]struct{}{}}
}

func (b *boundedLabels) known(v string) bool {
	_, s := b.served[v]
	_, u := b.unserved[v]
	return s || u
}

func (b *boundedLabels) get(v string) string {
	if v == "" {
		return v // not a resource request
	}
	b.mu.RLock()
	ok := b.known(v)
	b.mu.RUnlock()
	if ok {
		return v
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.known(v) {
		return v
	}
	if len(b.unserved) < MaxUnservedResources {
		b.unserved[v] = struct{}{}
		return v
	}
	return "other"
}

func (b *boundedLabels) add(v string) {
	b.mu.RLock()
	_, ok := b.served[v]
	b.mu.RUnlock()
	if ok || v == "" {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.served) < MaxResources {
		b.served[v] = struct{}{}
		delete(b.unserved, v)
	}
}
