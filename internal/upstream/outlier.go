package upstream

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Outlier detection (Envoy's term): a backend whose data is behind the other backends' is
// lagging, and not preferred for lagHold, while it still serves when nothing better is left
// (docs/design.md section 10.11). This file is the one owner of the verdict: it is set in one
// place, markLagging, on the two signals that find it (the mover's watch behind its scope's
// peers, a 504 to a list at the high-water mark, attempt.go), and cleared in one place,
// forgiveLag, which the health checker calls when the backend recovers from a trouble the
// lag came with.

// outlierState is a backend's lag verdict. Written by outlier.go alone.
type outlierState struct {
	// till: its data was found behind the others' until then (Unix ns on the pool's clock);
	// zero: never, or forgiven.
	till atomic.Int64
}

// Lagging reports whether its watches were found behind the other backends' lately.
func (b *Backend) Lagging() bool { return b.laggingAt(b.pool.clk.Now()) }

// laggingAt is Lagging at now.
func (b *Backend) laggingAt(now time.Time) bool { return now.UnixNano() < b.lag.till.Load() }

// markLagging records that b served watches (or a list) behind what the other backends
// serve, found behind since since; it is not preferred for lagHold. The first mark of a
// spell is logged, told to OnDetect, and asks the health checker for a check of b now.
func (p *Pool) markLagging(b *Backend, since time.Time, why string) {
	now := p.clk.Now()
	was := b.laggingAt(now)
	b.lag.till.Store(now.Add(lagHold).UnixNano())
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

// forgiveLag drops b's lag verdict: the health checker found it recovering from a trouble
// (a freeze, a spell degraded or unhealthy) its lag came with, and its cache catches up now.
// announce logs it, when a verdict was dropped.
func (p *Pool) forgiveLag(b *Backend, announce bool) {
	if b.lag.till.Swap(0) != 0 && announce {
		p.log.Info("upstream answers again; no longer held back as lagging", zap.Stringer("upstream", b))
	}
}
