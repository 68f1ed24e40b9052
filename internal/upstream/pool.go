package upstream

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Defaults of PoolOptions.
const (
	DefaultHealthInterval = 5 * time.Second
	DefaultProbeTimeout   = 3 * time.Second
)

// PoolOptions configure a Pool. Every field's zero value is usable.
type PoolOptions struct {
	// Transport tunes every upstream connection.
	Transport TransportOptions
	// HealthInterval is the period between probes of a healthy backend, and the longest wait
	// between probes of an unhealthy one; 0: DefaultHealthInterval.
	HealthInterval time.Duration
	// ProbeTimeout bounds one probe; 0: DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// Logger gets one line per health transition; nil: no logging.
	Logger *zap.Logger
	// OnState, if set, is told every health transition (metrics).
	OnState func(b *Backend, s State)
	// OnDial, if set, is told the outcome of every TCP dial to a backend (metrics).
	OnDial func(b *Backend, err error)
}

// Pool is the set of backends and their health. Requests go to preferred backends (healthy or
// not yet probed) in turn, to degraded ones (answering, but not ready) only when no preferred
// one is left; an unhealthy backend gets no request, only probes, until it answers.
type Pool struct {
	backends []*Backend
	next     atomic.Uint64
	opts     PoolOptions
	log      *zap.Logger

	mu      sync.Mutex
	changed chan struct{} // closed and replaced at every health transition
}

// NewPool builds one backend per URL. Every backend starts Unknown.
func NewPool(urls []*url.URL, o PoolOptions) (*Pool, error) {
	if o.HealthInterval <= 0 {
		o.HealthInterval = DefaultHealthInterval
	}
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = DefaultProbeTimeout
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	p := &Pool{opts: o, log: o.Logger.Named("upstream"), changed: make(chan struct{})}
	for _, u := range urls {
		b := &Backend{URL: u, pool: p, kick: make(chan struct{}, 1)}
		to := o.Transport
		if o.OnDial != nil {
			to.onDial = func(err error) { o.OnDial(b, err) }
		}
		t, err := newTransports(to)
		if err != nil {
			return nil, err
		}
		b.t = t
		p.backends = append(p.backends, b)
	}
	return p, nil
}

// Backends lists every backend.
func (p *Pool) Backends() []*Backend { return p.backends }

// Ready reports whether some backend is known healthy.
func (p *Pool) Ready() bool {
	for _, b := range p.backends {
		if b.State() == Healthy {
			return true
		}
	}
	return false
}

// pick returns the next preferred backend in turn, else a degraded one, avoiding avoid when
// another choice exists; nil when none is usable.
func (p *Pool) pick(avoid *Backend) *Backend {
	n := uint64(len(p.backends))
	start := p.next.Add(1)
	var degraded, avoided *Backend
	for i := uint64(0); i < n; i++ {
		b := p.backends[(start+i)%n]
		switch {
		case !b.usable():
		case b == avoid:
			avoided = b
		case b.preferred():
			return b
		case degraded == nil:
			degraded = b
		}
	}
	if degraded != nil {
		return degraded
	}
	return avoided
}

// healthySince returns the last time any backend was known healthy (zero: never).
func (p *Pool) healthySince() time.Time {
	var last int64
	for _, b := range p.backends {
		last = max(last, b.healthyAt.Load())
	}
	if last == 0 {
		return time.Time{}
	}
	return time.Unix(0, last)
}

// describe names every backend with its state, for an error message.
func (p *Pool) describe() string {
	parts := make([]string, len(p.backends))
	for i, b := range p.backends {
		parts[i] = b.String() + " " + b.State().String()
	}
	return strings.Join(parts, ", ")
}

// changes returns a channel closed at the next health transition of any backend.
func (p *Pool) changes() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

// setState records a verdict. A transition is logged once, told to OnState and wakes whoever
// waits for a usable backend. This is the only place a backend's state changes.
func (p *Pool) setState(b *Backend, s State, cause error) {
	now := time.Now().UnixNano()
	old := State(b.state.Swap(int32(s)))
	if s == Healthy || old == Healthy {
		b.healthyAt.Store(now) // healthy until now
	}
	if old == s {
		return
	}
	switch s {
	case Healthy:
		p.log.Info("upstream healthy", zap.Stringer("upstream", b), zap.Stringer("was", old))
	case Degraded:
		p.log.Warn("upstream degraded: it answers, but not ready; used only while no healthy upstream is left",
			zap.Stringer("upstream", b), zap.Stringer("was", old), zap.Error(cause))
	default:
		p.log.Warn("upstream unhealthy", zap.Stringer("upstream", b), zap.Stringer("was", old), zap.Error(cause))
		b.t.closeIdle()
	}
	if p.opts.OnState != nil {
		p.opts.OnState(b, s)
	}
	p.mu.Lock()
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// passiveFailure takes a failed dial from real traffic as a verdict, and asks for one early
// re-check at most per health interval.
func (p *Pool) passiveFailure(b *Backend, err error) {
	p.setState(b, Unhealthy, err)
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

// Run checks every backend until ctx ends: a healthy one every HealthInterval, an unhealthy one
// with backoff from a second (or the interval, if shorter) up to the interval, and at once after
// a passive failure (at most once per interval).
func (p *Pool) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, b := range p.backends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.checkLoop(ctx, b)
		}()
	}
	wg.Wait()
}

func (p *Pool) checkLoop(ctx context.Context, b *Backend) {
	interval := p.opts.HealthInterval
	down := Backoff{Initial: min(time.Second, interval), Max: interval, Jitter: 0.2}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-b.kick:
		}
		p.check(ctx, b)
		next := interval
		if b.State() == Healthy {
			down.Reset()
		} else {
			next = down.Next()
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(next)
	}
}

func (p *Pool) check(ctx context.Context, b *Backend) {
	code, err := b.Probe(ctx, p.opts.ProbeTimeout)
	if ctx.Err() != nil {
		return
	}
	if prev := b.probeStatus.Swap(int32(code)); prev != int32(code) {
		switch code {
		case 401:
			p.log.Warn("upstream answers /readyz with 401: the identity watchsan probes with (its lent credentials, or none) is not accepted; counted as reachable, but lent requests will fail too",
				zap.Stringer("upstream", b))
		case 403:
			p.log.Info("upstream answers /readyz with 403: watchsan's identity may not read /readyz (system:public-info-viewer normally allows it); counted as reachable",
				zap.Stringer("upstream", b))
		}
	}
	switch {
	case err == nil:
		p.setState(b, Healthy, nil)
	case code != 0:
		p.setState(b, Degraded, err)
	default:
		p.setState(b, Unhealthy, err)
	}
}
