package upstream

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// MoveReason says why the Pool moved a watch to another backend; its String is the stable
// value of the moves metric's reason label.
type MoveReason uint8

const (
	// MoveUnhealthy: its backend stopped answering; every watch on it moves at once.
	MoveUnhealthy MoveReason = iota
	// MoveDegraded: its backend answers but is not ready (shutting down, etcd failing).
	MoveDegraded
	// MoveRemoved: its backend left the configured or discovered set.
	MoveRemoved
	// MoveRebalance: a backend with fewer watches is healthy (recovered or added).
	MoveRebalance
	// MoveLagging: a watch of the same scope on another backend delivered an event this one
	// did not deliver within the lag timeout.
	MoveLagging

	numMoveReasons
)

var moveNames = [numMoveReasons]string{"unhealthy", "degraded", "removed", "rebalance", "lagging"}

func (r MoveReason) String() string {
	if r < numMoveReasons {
		return moveNames[r]
	}
	return "MoveReason(?)"
}

// MoveReasons lists every move reason (to initialise metric series).
func MoveReasons() []MoveReason {
	out := make([]MoveReason, 0, numMoveReasons)
	for r := MoveReason(0); r < numMoveReasons; r++ {
		out = append(out, r)
	}
	return out
}

// MoveError is the cause with which the Pool ends a watch attempt so that the watch resumes
// on another backend (context.Cause of the attempt's context). The watch's owner resumes it at
// once, without backoff: nothing is wrong with the watch.
type MoveError struct {
	From   *Backend
	Reason MoveReason
}

func (e *MoveError) Error() string {
	return "watch moved off " + e.From.String() + " (" + e.Reason.String() + ")"
}

// leaseSet is a backend's open watch attempts.
type leaseSet struct {
	mu     sync.Mutex
	set    map[*Lease]struct{}
	count  atomic.Int64
	moving atomic.Int64 // moved, not yet released
}

func (s *leaseSet) add(l *Lease) {
	s.mu.Lock()
	if s.set == nil {
		s.set = map[*Lease]struct{}{}
	}
	s.set[l] = struct{}{}
	s.count.Store(int64(len(s.set)))
	s.mu.Unlock()
}

func (s *leaseSet) remove(l *Lease) {
	s.mu.Lock()
	delete(s.set, l)
	s.count.Store(int64(len(s.set)))
	s.mu.Unlock()
}

// snapshot returns the open leases (in no order).
func (s *leaseSet) snapshot() []*Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Lease, 0, len(s.set))
	for l := range s.set {
		out = append(out, l)
	}
	return out
}

// Lease is one watch attempt's place on its backend: it counts toward the backend's open
// watches (balancing), and through it the Pool can end the attempt to move the watch
// elsewhere. The watch's owner tells it how far the watch got (Progress) and whether the watch
// could resume without its client noticing (SetMovable). It ends with the attempt (Cancel).
type Lease struct {
	b      *Backend
	cancel context.CancelCauseFunc
	scope  *scopeEntry    // its watch's scope on the progress board; nil: none
	high   *atomic.Uint64 // the high-water mark of its resource; nil: not tracked
	pos    atomic.Uint64  // the resume point its watch has reached (events and bookmarks)
	ok     atomic.Bool    // movable: resuming it is invisible to its client
	done   atomic.Bool    // released
	moved  atomic.Bool    // the Pool ended it (only once)
	behind atomic.Uint64  // a scope value it had not reached when the mover last looked (mover)
	since  atomic.Int64   // when the mover first saw it behind that value (Unix ns)
	// waiting is when its watch began waiting for the upstream's next bytes (Unix ns); 0 while
	// the watch is busy with what it read (writing it to its client). Only waiting time can be
	// the upstream's silence or lag (Waiting, Busy).
	waiting atomic.Int64
	// asks, for a make-before-break watch (Plan.MakeBeforeBreak), carries the Pool's request
	// to move it to its owner, at most one at a time (capacity 1; nil: the Pool ends the
	// attempt itself); hold: a move it could not make is not asked again before then (Unix ns).
	asks chan MoveReason
	hold atomic.Int64
}

// Backend is the backend the lease is on.
func (l *Lease) Backend() *Backend { return l.b }

// SetMovable says whether the watch can be resumed elsewhere without its client noticing
// (past its initial phase, with a resume point). Only movable watches are rebalanced or
// drained from a backend that still answers; an unhealthy backend's watches all move.
func (l *Lease) SetMovable(ok bool) {
	if l.ok.Load() != ok { // called per event: a load costs less than a store
		l.ok.Store(ok)
	}
}

// Alive tells the lease that its upstream sent something just now: a sign of life of its
// backend, on the Pool's clock (the health checker's). The watch calls it per read from the
// upstream, not per event (a clock read and a store to the backend's shared aliveAt per event
// were 3% of the CPU at saturation).
func (l *Lease) Alive() { l.b.alive() }

// Waiting tells the lease that its watch waits for its upstream's next bytes from now (Unix
// ns, on the watch's clock: only the watch's watchdog reads the time back, the Pool only
// whether it waits) on: a read from the upstream is under way.
func (l *Lease) Waiting(now int64) { l.waiting.Store(now) }

// Busy tells the lease that its watch is not waiting for its upstream: it has bytes to deliver,
// and delivering them may block on its client for as long as the client's write deadline
// allows. Until the next Waiting, neither a silence nor a lag of the watch is its upstream's:
// a client that stops reading must not make a healthy upstream look hung or behind.
func (l *Lease) Busy() { l.waiting.Store(0) }

// WaitingSince returns since when the watch has been waiting for its upstream, or false (and
// the zero time) while it is busy (Busy). A new lease waits from its creation.
func (l *Lease) WaitingSince() (time.Time, bool) {
	at := l.waiting.Load()
	if at == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, at), true
}

// Progress tells the lease that its watch has delivered up to resourceVersion pos (events and
// bookmarks). event > 0 is the RV of an object event of the watch's live phase: every watch of
// the same scope must deliver it too, and one that does not within the lag timeout is behind.
func (l *Lease) Progress(pos, event uint64) {
	if pos > 0 {
		storeMax(&l.pos, pos)
		if l.high != nil {
			storeMax(l.high, pos)
		}
	}
	if event > 0 && l.scope != nil {
		storeMax(&l.scope.max, event)
	}
}

// Observed raises the resource's high-water mark to rv, an RV the watch delivered that is no
// resume point (an event of the initial phase, in no order).
func (l *Lease) Observed(rv uint64) {
	if l.high != nil && rv > 0 {
		storeMax(l.high, rv)
	}
}

// Movable reports what the watch last said of itself (SetMovable).
func (l *Lease) Movable() bool { return l.ok.Load() }

// Pos is the resume point the watch has reached (Progress), or its Plan.From.
func (l *Lease) Pos() uint64 { return l.pos.Load() }

// Asked delivers the Pool's request to move the watch, for a make-before-break watch
// (Plan.MakeBeforeBreak): its owner, which receives it while the attempt lasts, opens a target
// and ends the attempt with Cut once the target has accepted the watch, or calls MoveFailed. At
// most one request is pending, and none is sent again before Cut or MoveFailed answers it. Nil
// (a receive that never returns) for any other lease: the Pool ends its attempt itself.
func (l *Lease) Asked() <-chan MoveReason { return l.asks }

// move asks for the watch to move, once at a time: a make-before-break lease's owner is asked
// (Asked), and ends the attempt (Cut) only once a target has accepted the watch, or gives up
// (MoveFailed); any other lease's attempt ends now with a MoveError. False if it had ended, is
// being moved, or is held after a failed move. It never waits, and starts nothing.
func (l *Lease) move(r MoveReason) bool {
	if l.done.Load() || l.held(l.b.pool.clk.Now()) || !l.moved.CompareAndSwap(false, true) {
		return false
	}
	l.b.leases.moving.Add(1)
	if l.asks != nil {
		// Empty: a request is sent only while none is outstanding (moved), and its owner takes
		// it before it answers with Cut or MoveFailed.
		select {
		case l.asks <- r:
		default:
		}
		return true
	}
	l.cut(r)
	return true
}

// held reports whether a failed move keeps the lease from being asked again yet.
func (l *Lease) held(now time.Time) bool { return now.UnixNano() < l.hold.Load() }

// Cut ends the attempt of a lease whose move its owner has made (the target accepted the
// watch): the watch's context ends with a MoveError, and the move is counted.
func (l *Lease) Cut(r MoveReason) {
	l.cut(r)
	l.b.pool.moved(l.b, r)
}

func (l *Lease) cut(r MoveReason) { l.cancel(&MoveError{From: l.b, Reason: r}) }

// MoveFailed says the move asked of the lease could not be made (no target accepted its
// resume point): the watch stays where it is, and is not asked to move again for hold (on
// the Pool's clock, PoolOptions.Clock).
func (l *Lease) MoveFailed(hold time.Duration) {
	l.hold.Store(l.b.pool.clk.Now().Add(hold).UnixNano())
	if l.moved.CompareAndSwap(true, false) {
		l.b.leases.moving.Add(-1)
	}
}

// release ends the lease (the attempt is over).
func (l *Lease) release() {
	if l.done.Swap(true) {
		return
	}
	l.b.leases.remove(l)
	if l.moved.CompareAndSwap(true, false) {
		l.b.leases.moving.Add(-1)
	}
	if l.scope != nil {
		l.b.pool.progress.unref(l.scope)
	}
}

func storeMax(a *atomic.Uint64, v uint64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// progress is what the Pool knows of how far watches got: per watch scope (a path and its
// selectors: every watch of one scope gets the same events), the highest object event any of
// them delivered, for lag detection; per resource, the highest resourceVersion seen from any
// backend (the high-water mark that keeps a list from travelling back in time).
type progress struct {
	mu     sync.Mutex
	scopes map[string]*scopeEntry

	highMu sync.RWMutex
	high   map[string]*atomic.Uint64
}

type scopeEntry struct {
	key  string
	refs int // guarded by progress.mu
	max  atomic.Uint64
}

// maxTrackedResources bounds the high-water marks kept (resources come from request paths).
const maxTrackedResources = 4096

func (p *progress) ref(key string) *scopeEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.scopes == nil {
		p.scopes = map[string]*scopeEntry{}
	}
	e := p.scopes[key]
	if e == nil {
		e = &scopeEntry{key: key}
		p.scopes[key] = e
	}
	e.refs++
	return e
}

func (p *progress) unref(e *scopeEntry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e.refs--; e.refs <= 0 {
		delete(p.scopes, e.key)
	}
}

// highWater returns the mark of resource, creating it unless too many are tracked (nil).
func (p *progress) highWater(resource string) *atomic.Uint64 {
	p.highMu.RLock()
	h := p.high[resource]
	p.highMu.RUnlock()
	if h != nil {
		return h
	}
	p.highMu.Lock()
	defer p.highMu.Unlock()
	if p.high == nil {
		p.high = map[string]*atomic.Uint64{}
	}
	if h = p.high[resource]; h == nil && len(p.high) < maxTrackedResources {
		h = new(atomic.Uint64)
		p.high[resource] = h
	}
	return h
}

// HighWater returns the highest resourceVersion watchsan has seen on watches of resource
// (GROUP/RESOURCE, or RESOURCE for the core group) from any backend; false when none is known.
// Marks are kept per resource, not globally: an aggregated API's resourceVersions are not the
// cluster etcd's.
func (p *Pool) HighWater(resource string) (uint64, bool) {
	p.progress.highMu.RLock()
	h := p.progress.high[resource]
	p.progress.highMu.RUnlock()
	if h == nil || h.Load() == 0 {
		return 0, false
	}
	return h.Load(), true
}

// ForgetHighWater drops resource's mark (no backend can serve it: an etcd restored from a
// backup starts below it).
func (p *Pool) ForgetHighWater(resource string) {
	p.progress.highMu.RLock()
	h := p.progress.high[resource]
	p.progress.highMu.RUnlock()
	if h != nil {
		h.Store(0)
	}
}

// newLease puts a watch attempt on b.
func (p *Pool) newLease(b *Backend, plan Plan, cancel context.CancelCauseFunc) *Lease {
	l := &Lease{b: b, cancel: cancel}
	if plan.MakeBeforeBreak {
		l.asks = make(chan MoveReason, 1)
	}
	if plan.Scope != "" {
		l.scope = p.progress.ref(plan.Scope)
	}
	if plan.Resource != "" {
		l.high = p.progress.highWater(plan.Resource)
	}
	l.pos.Store(plan.From)
	now := p.clk.Now().UnixNano()
	l.since.Store(now)
	l.waiting.Store(now)
	b.leases.add(l)
	return l
}
