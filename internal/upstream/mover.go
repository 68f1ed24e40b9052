package upstream

import (
	"context"
	"time"
)

// The mover is the one loop that moves watches between backends. It never opens anything:
// it ends a watch attempt through its Lease with a MoveError, and the watch's owner resumes it
// through the Attempter, whose pick sends it to the preferred backend with the fewest watches.
// Every tick (and at once after a health transition) it:
//   - drains: an unhealthy backend's watches all move at once (they are dead anyway), when
//     another backend is usable; a degraded or removed backend's movable watches move at the
//     drain rate, while a healthy backend takes them; a removed backend's other watches end
//     after RemoveGrace, and a drained removed backend is forgotten;
//   - finds lag: a movable watch that has not reached an event another watch of its scope
//     delivered more than LagTimeout ago, while waiting for its upstream (not while busy on
//     its client: Lease.Busy), is moved, and its backend marked lagging;
//   - rebalances: while the healthy backends' watch counts differ by two or more, movable
//     watches move off the fullest one at the rebalance rate.

// bucket is a token bucket of moves.
type bucket struct {
	rate   float64 // per second; negative: unlimited
	tokens float64
}

func (k *bucket) fill(dt time.Duration) {
	if k.rate > 0 {
		k.tokens = min(k.tokens+k.rate*dt.Seconds(), max(k.rate, 1))
	}
}

func (k *bucket) take() bool {
	if k.rate < 0 {
		return true
	}
	if k.tokens >= 1 {
		k.tokens--
		return true
	}
	return false
}

// kickMover asks the mover to look now (after a health transition, a change of the set).
func (p *Pool) kickMover() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *Pool) moveLoop(ctx context.Context) {
	t := p.clk.NewTicker(moveTick)
	defer t.Stop()
	drain := bucket{rate: p.opts.DrainRate}
	rebalance := bucket{rate: p.opts.RebalanceRate}
	last := p.clk.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		case <-p.wake:
		}
		now := p.clk.Now()
		drain.fill(now.Sub(last))
		rebalance.fill(now.Sub(last))
		last = now
		bs := p.Backends()
		p.drain(bs, now, &drain)
		if p.opts.LagTimeout > 0 {
			p.findLag(bs, now)
		}
		if p.opts.RebalanceRate > 0 {
			p.rebalance(bs, now, &rebalance)
		}
	}
}

// requestMove asks l to move for r; a lease without a move handler moves now, and is counted.
func (p *Pool) requestMove(b *Backend, l *Lease, r MoveReason) bool {
	if !l.move(r) {
		return false
	}
	if l.asks == nil {
		p.moved(b, r)
	}
	return true
}

func (p *Pool) moved(b *Backend, r MoveReason) {
	if p.opts.OnMove != nil {
		p.opts.OnMove(b, r)
	}
}

// drain moves watches off backends that are being left.
func (p *Pool) drain(bs []*Backend, now time.Time, k *bucket) {
	healthyTarget := false
	for _, b := range bs {
		if b.State() == Healthy && !b.laggingAt(now) {
			healthyTarget = true
		}
	}
	usableOther := func(b *Backend) bool {
		for _, c := range bs {
			if c != b && c.usable() {
				return true
			}
		}
		return false
	}
	for _, b := range bs {
		switch b.State() {
		case Unhealthy:
			if b.OpenWatches() > 0 && usableOther(b) {
				for _, l := range b.leases.snapshot() {
					p.requestMove(b, l, MoveUnhealthy)
				}
			}
		case Degraded:
			if healthyTarget {
				p.moveMovable(b, MoveDegraded, k, -1)
			}
		case Removed:
			removedAt := time.Unix(0, b.member.removedAt.Load())
			if usableOther(b) {
				p.moveMovable(b, MoveRemoved, k, -1)
			}
			if now.Sub(removedAt) > RemoveGrace {
				for _, l := range b.leases.snapshot() {
					p.requestMove(b, l, MoveRemoved)
				}
			}
			if drained := b.OpenWatches() == 0 && b.InFlight() == 0; (drained && now.Sub(removedAt) > RemoveGrace) || now.Sub(removedAt) > 2*RemoveGrace {
				p.forget(b)
			}
		}
	}
}

// moveMovable moves up to limit (negative: any number) of b's movable watches while k allows.
// It returns how many moved.
func (p *Pool) moveMovable(b *Backend, r MoveReason, k *bucket, limit int) int {
	n := 0
	now := p.clk.Now()
	for _, l := range b.leases.snapshot() {
		if limit >= 0 && n >= limit {
			break
		}
		if !l.ok.Load() || l.done.Load() || l.moved.Load() || l.held(now) {
			continue
		}
		if !k.take() {
			break
		}
		if p.requestMove(b, l, r) {
			n++
		}
	}
	return n
}

// findLag moves movable watches that stay behind their scope's progress.
func (p *Pool) findLag(bs []*Backend, now time.Time) {
	limit := p.opts.LagTimeout
	for _, b := range bs {
		if !b.usable() {
			continue
		}
		for _, l := range b.leases.snapshot() {
			if l.scope == nil || !l.ok.Load() || l.moved.Load() {
				continue
			}
			if _, waiting := l.WaitingSince(); !waiting {
				// Busy writing to its client: behind because of the client, not the backend. The
				// clock starts again when it waits for its upstream (100 watches that
				// did not read made a backend streaming at full speed look lagging).
				l.behind.Store(0)
				continue
			}
			top, pos := l.scope.max.Load(), l.pos.Load()
			target := l.behind.Load()
			switch {
			case pos >= top:
				l.behind.Store(0)
			case target == 0 || pos >= target:
				// Behind a newer event than last time, or for the first time: the clock starts.
				l.behind.Store(top)
				l.since.Store(now.UnixNano())
			case now.Sub(time.Unix(0, l.since.Load())) > limit:
				since := time.Unix(0, l.since.Load())
				if p.requestMove(b, l, MoveLagging) {
					p.markLagging(b, since, "a watch did not deliver an event its peers on other upstreams delivered")
				}
			}
		}
	}
}

// rebalance moves movable watches from the healthy backend with the most watches toward the
// one with the fewest, while they differ by two or more.
func (p *Pool) rebalance(bs []*Backend, now time.Time, k *bucket) {
	var targets []*Backend
	for _, b := range bs {
		if b.State() == Healthy && !b.laggingAt(now) {
			targets = append(targets, b)
		}
	}
	if len(targets) < 2 {
		return
	}
	// Watches on their way (moved, not yet ended) land where there are fewest: count them
	// there already, or they would be moved for twice.
	counts := make([]int64, len(targets))
	var transit int64
	for i, b := range targets {
		m := b.leases.moving.Load()
		counts[i] = b.OpenWatches() - m
		transit += m
	}
	for ; transit > 0; transit-- {
		lo := 0
		for i := range counts {
			if counts[i] < counts[lo] {
				lo = i
			}
		}
		counts[lo]++
	}
	exhausted := make([]bool, len(targets))
	for {
		hi, lo := -1, -1
		for i := range targets {
			if !exhausted[i] && (hi < 0 || counts[i] > counts[hi]) {
				hi = i
			}
			if lo < 0 || counts[i] < counts[lo] {
				lo = i
			}
		}
		if hi < 0 || counts[hi]-counts[lo] < 2 {
			return
		}
		if k.tokens < 1 {
			return
		}
		if p.moveMovable(targets[hi], MoveRebalance, k, 1) == 0 {
			exhausted[hi] = true
			continue
		}
		counts[hi]--
		counts[lo]++
	}
}
