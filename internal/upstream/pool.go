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
	// Clock is the one clock of the pool's parts: the health checker's rounds, ping and
	// /readyz timeouts and signs of life, the outlier detector's holds, the mover's ticks and
	// the holds of failed moves, the waits of requests on a frozen backend, and the Attempter's
	// when it is given none (AttempterOptions.Clock). Nil: the real clock. Tests step a fake
	// one (k8s.io/utils/clock/testing).
	Clock clock.WithTickerAndDelayedExecution
}

// Pool is the set of backends, their health and their load. Short requests go to the
// preferred backend (healthy, or not yet probed) with the fewest outstanding requests, watches
// to the one with the fewest open watches; degraded or lagging backends serve only when no
// preferred one is left; an unhealthy backend gets no request, only checks, until it answers.
// The Pool moves watches (through their Lease) off backends that fail, lag or leave, and onto
// backends that recover or join, at a bounded rate.
//
// Its parts, as in Envoy's and Caddy's pools, each in its file and owning its state: the
// membership (this file: the set of backends, their removal and their health loops), health
// (health.go: active checks and passive signals, the one judge of a backend's state), outlier
// detection (outlier.go: the lagging verdict), selection (select.go: a pure choice over a
// snapshot of the backends) and the mover (mover.go). All of them run on one clock, clk.
type Pool struct {
	opts PoolOptions
	log  *zap.Logger
	clk  clock.WithTickerAndDelayedExecution // opts.Clock
	// next is selection's round-robin counter (select.go).
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

// membership is a backend's place in the pool. Written by pool.go alone, under Pool.mu but
// for loopDone's close; the zero value is a backend in the set, whose loop has not started.
type membership struct {
	// removedAt is when it was removed (Unix ns, the pool's clock); 0: it was not.
	removedAt atomic.Int64
	// stopLoop ends its health loop; nil until the loop starts (startLoop).
	stopLoop context.CancelFunc
	// loopDone is closed when its health loop has ended; made by newBackend.
	loopDone chan struct{}
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
	p := &Pool{opts: o, log: o.Logger.Named("upstream"), clk: o.Clock, changed: make(chan struct{}), wake: make(chan struct{}, 1)}
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
	b := &Backend{URL: u, name: u.String(), pool: p, kick: make(chan struct{}, 1), late: late}
	b.member.loopDone = make(chan struct{})
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
		parts = append(parts, b.String()+" "+b.Health().describe(p.clk.Now()))
	}
	return strings.Join(parts, "; ")
}

// changes returns a channel closed at the next health transition of any backend.
func (p *Pool) changes() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

// notifyLocked tells of a health transition (health.go calls it, p.mu held): whoever waits
// for a usable backend (changes), and the mover.
func (p *Pool) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
	p.kickMover()
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
		b.member.removedAt.Store(0)
		p.reviveLocked(b)
		added = append(added, b.name)
	}
	for _, b := range leaving {
		b.member.removedAt.Store(p.clk.Now().UnixNano())
		p.removeLocked(b)
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
	stop := b.member.stopLoop
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
	b.member.stopLoop = cancel
	p.loops.Add(1)
	go func() {
		defer p.loops.Done()
		defer close(b.member.loopDone)
		defer cancel()
		p.checkLoop(ctx, b)
	}()
}
