package upstream

import (
	"context"
	"net/url"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Pool is the set of backends. Pick is round-robin over the healthy ones; when none is healthy it
// falls back to all of them (a last resort: a stale verdict must not take the cluster away).
type Pool struct {
	backends []*Backend
	next     atomic.Uint64
	log      *zap.Logger

	// Interval between health checks of each backend; zero means 5s.
	Interval time.Duration
	// OnHealth, if set, is told every verdict (for metrics).
	OnHealth func(b *Backend, healthy bool)
}

// NewPool builds one backend per URL with the given transport options. Backends start healthy.
func NewPool(urls []*url.URL, o TransportOptions, log *zap.Logger) (*Pool, error) {
	p := &Pool{log: log.Named("upstream")}
	for _, u := range urls {
		t, err := newTransports(o)
		if err != nil {
			return nil, err
		}
		b := &Backend{URL: u, t: t, checkNow: make(chan struct{}, 1)}
		b.healthy.Store(true)
		p.backends = append(p.backends, b)
	}
	return p, nil
}

// Backends lists every backend.
func (p *Pool) Backends() []*Backend { return p.backends }

// Pick returns the next backend to use, preferring healthy ones; never nil.
func (p *Pool) Pick() *Backend {
	return p.PickExcept(nil)
}

// PickExcept is Pick avoiding avoid when another choice exists (a resume after a failure goes
// elsewhere when it can).
func (p *Pool) PickExcept(avoid *Backend) *Backend {
	n := uint64(len(p.backends))
	start := p.next.Add(1)
	var fallback *Backend
	for i := uint64(0); i < n; i++ {
		b := p.backends[(start+i)%n]
		if b == avoid {
			if fallback == nil {
				fallback = b
			}
			continue
		}
		if b.Healthy() {
			return b
		}
		if fallback == nil || fallback == avoid {
			fallback = b
		}
	}
	if avoid != nil && avoid.Healthy() {
		return avoid
	}
	return fallback
}

// Ready reports whether any backend is healthy.
func (p *Pool) Ready() bool {
	for _, b := range p.backends {
		if b.Healthy() {
			return true
		}
	}
	return false
}

// Run checks every backend until ctx ends: every Interval, and at once after a passive failure.
func (p *Pool) Run(ctx context.Context) {
	interval := p.Interval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	done := make(chan struct{})
	for _, b := range p.backends {
		go func() {
			defer func() { done <- struct{}{} }()
			p.check(ctx, b)
			t := time.NewTicker(interval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				case <-b.checkNow:
				}
				p.check(ctx, b)
			}
		}()
	}
	for range p.backends {
		<-done
	}
}

func (p *Pool) check(ctx context.Context, b *Backend) {
	err := b.Probe(ctx, 3*time.Second)
	if ctx.Err() != nil {
		return
	}
	ok := err == nil
	if was := b.healthy.Swap(ok); was != ok {
		if ok {
			p.log.Info("upstream healthy", zap.Stringer("upstream", b))
		} else {
			p.log.Warn("upstream unhealthy", zap.Stringer("upstream", b), zap.Error(err))
			b.t.closeIdle()
		}
	}
	if p.OnHealth != nil {
		p.OnHealth(b, ok)
	}
}
