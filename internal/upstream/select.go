package upstream

import (
	"sort"
	"time"
)

// Selection (Envoy's load balancer, Caddy's selection policy): which backend a request or a
// watch goes to, and where a moved watch may go. It owns no state but the round-robin
// counter (Pool.next): the Pool takes a snapshot of its backends (candidate), once per
// choice, and the choice is a pure function of it.

// candidate is what selection knows of one backend, read once for one choice.
type candidate struct {
	b     *Backend
	state State
	// usable: requests may go to it; preferred: they go to it when there is a choice
	// (Backend.usable, Backend.preferred).
	usable, preferred bool
	// serves: it is not known unable to serve the watch's resume point (Plan.From); true when
	// there is none.
	serves bool
	// load is what balancing compares: open watches for a watch, outstanding requests
	// otherwise.
	load int64
}

// candidates reads bs once at now: for a watch (load as open watches) or not, with serve the
// test of the resume point (nil: any).
func candidates(bs []*Backend, now time.Time, watch bool, serve func(*Backend) bool) []candidate {
	cs := make([]candidate, len(bs))
	for i, b := range bs {
		st := b.State()
		c := candidate{b: b, state: st, usable: usableAs(st, b.late), serves: true}
		if c.usable {
			c.preferred = preferredAs(st, b.late, b.laggingAt(now))
			c.serves = serve == nil || serve(b)
		}
		if watch {
			c.load = b.OpenWatches()
		} else {
			c.load = b.InFlight()
		}
		cs[i] = c
	}
	return cs
}

// choose returns the usable candidate with the least load: a preferred one if any, else a
// degraded or lagging one, avoiding avoid when another choice exists; nil when none is usable.
// One that cannot serve the resume point is chosen only when no usable one can. The scan
// starts at start (mod len(cs)), so ties go round-robin as start grows.
func choose(cs []candidate, start uint64, avoid *Backend) *Backend {
	n := uint64(len(cs))
	var best, fallback, avoided, unservable *candidate
	for i := uint64(0); i < n; i++ {
		c := &cs[(start+i)%n]
		switch {
		case !c.usable:
		case !c.serves:
			if unservable == nil || c.preferred {
				unservable = c
			}
		case c.b == avoid:
			avoided = c
		case c.preferred:
			if best == nil || c.load < best.load {
				best = c
			}
		default:
			if fallback == nil || c.load < fallback.load {
				fallback = c
			}
		}
	}
	for _, c := range []*candidate{best, fallback, avoided, unservable} {
		if c != nil {
			return c.b
		}
	}
	return nil
}

// pick returns the backend for a request (watch: one with the fewest open watches; else the
// fewest outstanding requests), avoiding avoid when another choice exists (choose).
func (p *Pool) pick(watch bool, avoid *Backend) *Backend { return p.pickServing(watch, avoid, nil) }

// pickServing is pick where serve, when not nil, says which backends can serve the request (a
// watch's resume point, docs/design.md section 10.2).
func (p *Pool) pickServing(watch bool, avoid *Backend, serve func(*Backend) bool) *Backend {
	bs := p.Backends()
	start := p.next.Add(1)
	return choose(candidates(bs, p.clk.Now(), watch, serve), start, avoid)
}

// moveTargets lists where a watch on here may move for r, best first, and whether some
// backend was left out only because it cannot serve the resume point. For a rebalance only
// healthy, not lagging backends with at least two watches fewer than here's hereLoad qualify (the rule
// of Pool.rebalance); for any other reason every usable backend but here, preferred ones
// first, each by fewest watches.
func moveTargets(cs []candidate, here *Backend, hereLoad int64, r MoveReason) (targets []*Backend, blocked bool) {
	var keep []candidate
	for _, c := range cs {
		if c.b == here || !c.usable {
			continue
		}
		if r == MoveRebalance && (c.state != Healthy || !c.preferred || c.load > hereLoad-2) {
			continue
		}
		if !c.serves {
			blocked = true
			continue
		}
		keep = append(keep, c)
	}
	sort.SliceStable(keep, func(i, j int) bool {
		if keep[i].preferred != keep[j].preferred {
			return keep[i].preferred
		}
		return keep[i].load < keep[j].load
	})
	for _, c := range keep {
		targets = append(targets, c.b)
	}
	return targets, blocked
}

// MoveTargets lists where the Pool would move the lease's watch for r, best first, and whether
// some backend was left out only because it cannot serve the resume point from: a move
// (docs/design.md section 10.1) tries them in turn, make-before-break, and a fresher resume
// point (section 10.3) would open the ones left out (moveTargets says which qualify).
func (l *Lease) MoveTargets(r MoveReason, resource string, from uint64) (targets []*Backend, blocked bool) {
	p := l.b.pool
	serve := func(b *Backend) bool { return b.CanServe(resource, from) }
	return moveTargets(candidates(p.Backends(), p.clk.Now(), true, serve), l.b, l.b.OpenWatches(), r)
}
