package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"k8s.io/utils/clock"
)

// Defaults of PoolOptions.
const (
	// DefaultHealthInterval is the period of a backend's liveness ping and /readyz probe. A
	// frozen or dead apiserver is found within about an interval and one and a half ping
	// timeouts, or a quarter and one and a half ping timeouts after a request began to wait
	// on it (docs/design.md section 10.9).
	DefaultHealthInterval = time.Second
	// DefaultProbeTimeout bounds one /readyz probe. It is longer than a ping's: /readyz waits on
	// etcd (up to its own 2 s check timeout), and a slow /readyz of a live apiserver makes it
	// degraded, never unhealthy.
	DefaultProbeTimeout = 3 * time.Second
	// DefaultProbeInterval is the least time between /readyz probes of a healthy backend that
	// answers pings. Pings are HTTP/2 frames the apiserver's connection reader answers; /readyz
	// goes through its handler chain, and a sidecar in every controller pod probing every
	// second would add hundreds of requests a second to a large cluster.
	DefaultProbeInterval = 5 * time.Second
	// DefaultPingTimeout bounds one HTTP/2 PING. A live apiserver answers it from its
	// connection reader in microseconds, whatever its etcd does.
	DefaultPingTimeout = time.Second
	// DefaultLagTimeout is how long a watch may stay behind an event another watch of the same
	// scope delivered before it counts as lagging.
	DefaultLagTimeout = 2 * time.Second
	// DefaultRebalanceRate is how many watches a second move onto a backend with fewer.
	DefaultRebalanceRate = 10
	// DefaultDrainRate is how many watches a second move off a backend that still answers
	// but is being left (degraded, removed).
	DefaultDrainRate = 100
	// RemoveGrace is how long a removed backend keeps watches that cannot move unnoticed
	// (still in their initial phase) before they are ended too. A removed backend is
	// forgotten (its metric series deleted) once drained and removed this long, so its last
	// counts are scraped; after twice this long it is forgotten anyway.
	RemoveGrace = 30 * time.Second
	// lagHold is how long a backend found lagging is not preferred (unless it recovers from
	// being degraded or unhealthy first).
	lagHold = 10 * time.Second
	// moveTick is the mover's period.
	moveTick = 100 * time.Millisecond
)

// PoolOptions configure a Pool. Every field's zero value is usable.
type PoolOptions struct {
	// Transport tunes every upstream connection.
	Transport TransportOptions
	// HealthInterval is the period between checks of a backend (a ping and a /readyz probe),
	// and the longest wait between checks of an unhealthy one; 0: DefaultHealthInterval.
	HealthInterval time.Duration
	// ProbeTimeout bounds one /readyz probe; 0: DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// ProbeInterval is the least time between /readyz probes of a healthy backend (one that is
	// not healthy is probed every HealthInterval, to see it recover); 0: DefaultProbeInterval.
	ProbeInterval time.Duration
	// PingTimeout bounds one HTTP/2 PING; 0: DefaultPingTimeout.
	PingTimeout time.Duration
	// LagTimeout: a watch that has not delivered an event another watch of its scope delivered
	// this long ago is moved and its backend counted lagging; 0: DefaultLagTimeout, negative:
	// never.
	LagTimeout time.Duration
	// RebalanceRate: watches moved per second onto healthy backends with fewer watches (after a
	// recovery or an addition); 0: DefaultRebalanceRate, negative: never.
	RebalanceRate float64
	// DrainRate: watches moved per second off a degraded or removed backend; 0:
	// DefaultDrainRate, negative: all at once. An unhealthy backend's watches always move at once.
	DrainRate float64
	// Logger gets one line per health transition; nil: no logging.
	Logger *zap.Logger
	// OnState, if set, is told every health transition (metrics).
	OnState func(b *Backend, s State)
	// OnDial, if set, is told the outcome of every TCP dial to a backend and what the
	// connection is for, ConnRequests or ConnHealth (metrics).
	OnDial func(b *Backend, conn string, err error)
	// OnMove, if set, is told every watch the Pool moves off b (metrics).
	OnMove func(b *Backend, r MoveReason)
	// OnDetect, if set, is told how long it took to find b unhealthy or lagging: from the last
	// sign of life (or the first sign of lag) to the verdict (metrics).
	OnDetect func(b *Backend, what string, d time.Duration)
	// OnAdd and OnForget, if set, are told when a backend joins the pool after NewPool and
	// when a removed one is forgotten (metric series are created and deleted with them).
	OnAdd, OnForget func(b *Backend)
	// Clock times the hold of a watch whose move failed (Lease.MoveFailed); nil: the real
	// clock.
	Clock clock.PassiveClock
}

// Pool is the set of backends, their health and their load. Short requests go to the
// preferred backend (healthy, or not yet probed) with the fewest outstanding requests, watches
// to the one with the fewest open watches; degraded or lagging backends serve only when no
// preferred one is left; an unhealthy backend gets no request, only checks, until it answers.
// The Pool moves watches (through their Lease) off backends that fail, lag or leave, and onto
// backends that recover or join, at a bounded rate.
type Pool struct {
	opts     PoolOptions
	log      *zap.Logger
	next     atomic.Uint64
	list     atomic.Pointer[[]*Backend] // replaced under mu, never modified
	progress progress
	wake     chan struct{} // the mover looks now
	// anonPassed: an anonymous /readyz probe of a backend passed, so the cluster lets
	// anonymous probes read /readyz and a 401 or 403 to one means not ready (section 10.6).
	anonPassed atomic.Bool

	mu      sync.Mutex
	changed chan struct{}   // closed and replaced at every health transition
	run     context.Context // Run's context while it runs; nil otherwise
	loops   sync.WaitGroup  // health loops and probes
}

// NewPool builds one backend per URL. Every backend starts Unknown.
func NewPool(urls []*url.URL, o PoolOptions) (*Pool, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.HealthInterval, DefaultHealthInterval)
	def(&o.ProbeTimeout, DefaultProbeTimeout)
	def(&o.ProbeInterval, DefaultProbeInterval)
	def(&o.PingTimeout, DefaultPingTimeout)
	def(&o.LagTimeout, DefaultLagTimeout)
	if o.RebalanceRate == 0 {
		o.RebalanceRate = DefaultRebalanceRate
	}
	if o.DrainRate == 0 {
		o.DrainRate = DefaultDrainRate
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	p := &Pool{opts: o, log: o.Logger.Named("upstream"), changed: make(chan struct{}), wake: make(chan struct{}, 1)}
	var bs []*Backend
	seen := map[string]bool{}
	for _, u := range urls {
		if seen[u.String()] {
			continue
		}
		seen[u.String()] = true
		b, err := p.newBackend(u, false)
		if err != nil {
			return nil, err
		}
		bs = append(bs, b)
	}
	p.list.Store(&bs)
	return p, nil
}

func (p *Pool) newBackend(u *url.URL, late bool) (*Backend, error) {
	b := &Backend{URL: u, name: u.String(), pool: p, kick: make(chan struct{}, 1), late: late, loopDone: make(chan struct{})}
	to := p.opts.Transport
	var onDial func(string, error)
	if p.opts.OnDial != nil {
		onDial = func(conn string, err error) { p.opts.OnDial(b, conn, err) }
		to.onDial = onDial
	}
	t, err := newTransports(to)
	if err != nil {
		return nil, err
	}
	b.t = t
	if u.Scheme == "https" {
		addr := u.Host
		if u.Port() == "" {
			addr = net.JoinHostPort(u.Hostname(), "443")
		}
		var pingDial func(error)
		if onDial != nil {
			pingDial = func(err error) { onDial(ConnHealth, err) }
		}
		b.ping = newPinger(addr, t.tls, 0, to.KeepAlive, pingDial)
		b.spare = newPinger(addr, t.tls, 0, to.KeepAlive, pingDial)
		b.pingable.Store(true)
	}
	return b, nil
}

// Backends lists the backends, removed ones still draining included.
func (p *Pool) Backends() []*Backend { return *p.list.Load() }

// Ready reports whether some backend is usable and has answered: healthy, or degraded (it
// answers, and requests go to it when nothing better is left). Not before any has answered.
func (p *Pool) Ready() bool {
	for _, b := range p.Backends() {
		if s := b.State(); s == Healthy || s == Degraded {
			return true
		}
	}
	return false
}

// AnyHealthy reports whether some backend is healthy.
func (p *Pool) AnyHealthy() bool {
	for _, b := range p.Backends() {
		if b.State() == Healthy {
			return true
		}
	}
	return false
}

// pick returns the usable backend with the least load of the kind (open watches for a watch,
// outstanding requests otherwise): a preferred one if any, else a degraded or lagging one,
// avoiding avoid when another choice exists; nil when none is usable. Ties go round-robin.
// pickServing's serve, when not nil, says which backends can serve the request (a watch's resume point,
// docs/design.md section 10.2): one that cannot is picked only when no usable one can.
func (p *Pool) pick(watch bool, avoid *Backend) *Backend { return p.pickServing(watch, avoid, nil) }

// pickServing is pick with serve.
func (p *Pool) pickServing(watch bool, avoid *Backend, serve func(*Backend) bool) *Backend {
	bs := p.Backends()
	n := uint64(len(bs))
	start := p.next.Add(1)
	var best, fallback, avoided, unservable *Backend
	var bestLoad, fallbackLoad int64
	for i := uint64(0); i < n; i++ {
		b := bs[(start+i)%n]
		switch {
		case !b.usable():
		case serve != nil && !serve(b):
			if unservable == nil || b.preferred() {
				unservable = b
			}
		case b == avoid:
			avoided = b
		case b.preferred():
			if l := b.load(watch); best == nil || l < bestLoad {
				best, bestLoad = b, l
			}
		default:
			if l := b.load(watch); fallback == nil || l < fallbackLoad {
				fallback, fallbackLoad = b, l
			}
		}
	}
	switch {
	case best != nil:
		return best
	case fallback != nil:
		return fallback
	case avoided != nil:
		return avoided
	}
	return unservable
}

// healthySince returns the last time any backend was known healthy (zero: never).
func (p *Pool) healthySince() time.Time {
	var last int64
	for _, b := range p.Backends() {
		last = max(last, b.healthyAt.Load())
	}
	if last == 0 {
		return time.Time{}
	}
	return time.Unix(0, last)
}

// maxDescribed bounds the backends an error message names.
const maxDescribed = 10

// describe names the backends (at most maxDescribed, then how many more) with their state,
// since when, and why they are not healthy (their Health), for an error message.
func (p *Pool) describe() string {
	bs := p.Backends()
	parts := make([]string, 0, min(len(bs), maxDescribed+1))
	for i, b := range bs {
		if i == maxDescribed {
			parts = append(parts, fmt.Sprintf("%d more", len(bs)-i))
			break
		}
		parts = append(parts, b.String()+" "+b.Health().Describe())
	}
	return strings.Join(parts, "; ")
}

// changes returns a channel closed at the next health transition of any backend.
func (p *Pool) changes() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

// setState records a verdict. A transition is logged once, told to OnState, wakes whoever
// waits for a usable backend and the mover. This is the only place a backend's state changes;
// a removed backend's state changes only when it is added again (revive).
func (p *Pool) setState(b *Backend, s State, cause error) { p.transition(b, s, cause, false) }

func (p *Pool) transition(b *Backend, s State, cause error, revive bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.transitionLocked(b, s, cause, revive)
}

// transitionLocked is transition with p.mu held.
func (p *Pool) transitionLocked(b *Backend, s State, cause error, revive bool) {
	now := time.Now()
	old := State(b.state.Load())
	if old == Removed && s != Removed && !revive {
		return
	}
	b.state.Store(int32(s))
	if s == Healthy || old == Healthy {
		b.healthyAt.Store(now.UnixNano()) // healthy until now
	}
	if old == s {
		return
	}
	var kind zap.Field = zap.Skip()
	if c, ok := cause.(*Cause); ok {
		kind = zap.String("cause", string(c.Kind))
	}
	switch s {
	case Healthy:
		if old == Degraded || old == Unhealthy {
			b.laggingTill.Store(0) // its lag came with the trouble it recovered from
		}
		var after zap.Field = zap.Skip()
		if h := b.health.snap.Load(); h != nil && h.LastError != nil && old != Unknown {
			after = zap.String("after", h.LastError.Error()) // what it was not healthy for
		}
		p.log.Info("upstream healthy", zap.Stringer("upstream", b), zap.Stringer("was", old), after)
	case Degraded:
		p.log.Warn("upstream degraded: it answers, but not ready; used only while no healthy upstream is left, its watches move",
			zap.Stringer("upstream", b), zap.Stringer("was", old), kind, zap.Error(cause))
	case Unknown:
		p.log.Info("upstream added again", zap.Stringer("upstream", b))
	case Removed:
		p.log.Info("upstream removed; its watches move", zap.Stringer("upstream", b), zap.Stringer("was", old),
			zap.Int64("watches", b.OpenWatches()))
	default:
		var silent time.Duration
		if at := b.aliveAt.Load(); at > 0 {
			silent = now.Sub(time.Unix(0, at))
		}
		// Nothing waits on it (section 10.8): requests still waiting for its answer are cut,
		// to be retried elsewhere or answered 503.
		cut := b.waiting.cutAll()
		p.log.Warn("upstream unhealthy", zap.Stringer("upstream", b), zap.Stringer("was", old),
			zap.Duration("silentFor", silent), zap.Int64("watches", b.OpenWatches()), zap.Int("requestsCut", cut), kind, zap.Error(cause))
		if old != Unknown && silent > 0 && p.opts.OnDetect != nil {
			p.opts.OnDetect(b, "unhealthy", silent)
		}
		b.t.closeIdle()
	}
	if p.opts.OnState != nil {
		p.opts.OnState(b, s)
	}
	close(p.changed)
	p.changed = make(chan struct{})
	p.kickMover()
}

func (p *Pool) kickMover() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// passiveFailure takes a failed dial from real traffic as a verdict, and asks for one early
// re-check at most per health interval.
func (p *Pool) passiveFailure(b *Backend, err error) {
	b.liveness.Store(livenessDead)
	p.verdict(b, Unhealthy, err)
	p.recheck(b)
}

// suspect takes a 5xx or 429 answer from real traffic as a reason to check b now, /readyz
// included: a proxy in front of an apiserver (Envoy, an L7 balancer) answers pings itself, so
// only /readyz and traffic show that the apiserver behind it is gone.
func (p *Pool) suspect(b *Backend) {
	b.probedAt.Store(0)
	p.recheck(b)
}

// recheck asks b's health loop for an early check, at most once per health interval.
func (p *Pool) recheck(b *Backend) {
	now := time.Now().UnixNano()
	last := b.kickedAt.Load()
	if now-last < int64(p.opts.HealthInterval) || !b.kickedAt.CompareAndSwap(last, now) {
		return
	}
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// ReportFailure tells the pool that traffic on b failed in a way that may mean b is in
// trouble (a connection reset or lost, a watch that went silent): b is checked at once,
// rather than at its next interval. It judges nothing by itself: the check does.
func (b *Backend) ReportFailure(err error) {
	if err != nil {
		b.pool.recheck(b)
	}
}

// markLagging records that b served watches (or a list) behind what the other backends
// serve; it is not preferred for lagHold.
func (p *Pool) markLagging(b *Backend, since time.Time, why string) {
	now := time.Now()
	was := b.Lagging()
	b.laggingTill.Store(now.Add(lagHold).UnixNano())
	if was {
		return
	}
	p.log.Warn("upstream lagging: it serves older data than the other upstreams; not preferred for a while",
		zap.Stringer("upstream", b), zap.String("why", why), zap.Duration("behindFor", now.Sub(since)), zap.Duration("for", lagHold))
	if p.opts.OnDetect != nil {
		p.opts.OnDetect(b, "lagging", now.Sub(since))
	}
	p.recheck(b)
}

// SetUpstreams makes urls the pool's backends: new ones are added (tried once their first
// probe answers), missing ones are removed (their watches move at the drain rate, and they are
// forgotten once drained), one removed and named again is kept. Nothing changes on an error.
// The set never becomes empty: an empty urls is refused.
func (p *Pool) SetUpstreams(urls []*url.URL) (added, removed []string, err error) {
	if len(urls) == 0 {
		return nil, nil, errors.New("no upstream: the set of upstreams may not become empty")
	}
	p.mu.Lock()
	cur := p.Backends()
	byName := make(map[string]*Backend, len(cur))
	for _, b := range cur {
		byName[b.name] = b
	}
	want := map[string]bool{}
	var next, fresh, revived []*Backend
	for _, u := range urls {
		name := u.String()
		if want[name] {
			continue
		}
		want[name] = true
		if b := byName[name]; b != nil {
			next = append(next, b)
			if b.State() == Removed {
				revived = append(revived, b)
			}
			continue
		}
		b, err := p.newBackend(u, true)
		if err != nil {
			p.mu.Unlock()
			return nil, nil, fmt.Errorf("upstream %s: %w", name, err)
		}
		next = append(next, b)
		fresh = append(fresh, b)
	}
	var leaving []*Backend
	for _, b := range cur {
		if !want[b.name] {
			next = append(next, b) // kept until drained
			if b.State() != Removed {
				leaving = append(leaving, b)
			}
		}
	}
	p.list.Store(&next)
	for _, b := range fresh {
		if p.opts.OnAdd != nil {
			p.opts.OnAdd(b)
		}
		if p.run != nil {
			p.startLoop(b)
		}
		added = append(added, b.name)
	}
	for _, b := range revived {
		b.removedAt.Store(0)
		p.transitionLocked(b, Unknown, nil, true)
		p.recheck(b)
		added = append(added, b.name)
	}
	for _, b := range leaving {
		b.removedAt.Store(time.Now().UnixNano())
		p.transitionLocked(b, Removed, nil, false)
		removed = append(removed, b.name)
	}
	p.mu.Unlock()
	p.kickMover()
	return added, removed, nil
}

// forget drops a removed, drained backend for good.
func (p *Pool) forget(b *Backend) {
	p.mu.Lock()
	if b.State() != Removed {
		p.mu.Unlock()
		return
	}
	cur := p.Backends()
	next := make([]*Backend, 0, len(cur))
	for _, c := range cur {
		if c != b {
			next = append(next, c)
		}
	}
	p.list.Store(&next)
	stop := b.stopLoop
	p.mu.Unlock()
	if stop != nil {
		stop()
	}
	b.t.closeIdle()
	if b.ping != nil {
		b.ping.Close()
		b.spare.Close()
	}
	p.log.Info("upstream forgotten: drained", zap.Stringer("upstream", b))
	if p.opts.OnForget != nil {
		p.opts.OnForget(b)
	}
}

// Run checks every backend and moves watches until ctx ends; backends added by SetUpstreams
// while it runs are checked too. It returns once every loop it started has ended.
func (p *Pool) Run(ctx context.Context) {
	p.mu.Lock()
	p.run = ctx
	for _, b := range p.Backends() {
		p.startLoop(b)
	}
	p.mu.Unlock()
	p.moveLoop(ctx)
	p.mu.Lock()
	p.run = nil
	p.mu.Unlock()
	p.loops.Wait()
	for _, b := range p.Backends() {
		if b.ping != nil {
			b.ping.Close()
			b.spare.Close()
		}
	}
}

// startLoop starts b's health loop under Run's context; p.mu is held.
func (p *Pool) startLoop(b *Backend) {
	ctx, cancel := context.WithCancel(p.run)
	b.stopLoop = cancel
	p.loops.Add(1)
	go func() {
		defer p.loops.Done()
		defer close(b.loopDone)
		defer cancel()
		p.checkLoop(ctx, b)
	}()
}
