package ring

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/watchsan/watchsan/internal/budget"
)

// Ring is a shared feed's recent object events (ADDED, MODIFIED, DELETED), as delivered: each
// frame's bytes exactly as a subscriber is sent them (after the feed's policy, a rewrite
// included) with the resourceVersion delivered. It is bounded in bytes and in events, and all
// rings together by their Budget; the oldest go first. It covers the
// resourceVersions from start on: every event after start that the feed delivered is in it.
// Bookmarks and ERROR events are not kept (a joiner gets them live).
//
// Its feed adds to it and joins from it under the feed's lock; its own mu guards its frames,
// since the budget may evict from it for another feed (never holding two rings' locks).
type Ring struct {
	mu     sync.Mutex
	frames []frame // oldest first; frames[head:] are live
	head   int
	bytes  int
	// start is the resourceVersion from which the ring has every event the feed delivered:
	// the feed's starting point, then the RV of the last event evicted.
	start uint64
	// held is bytes, for the budget's choice of a ring to evict from without their locks.
	held atomic.Int64

	maxBytes, maxEvents int
	// budget bounds all rings together; nil: none (or released).
	budget *Budget
	// evicted counts evictions by cause (watchsan_shared_feed_ring_evictions_total's series,
	// resolved once per ring: a full ring evicts at every event); nil: not counted.
	evicted map[string]prometheus.Counter
}

type frame struct {
	rv  uint64
	raw []byte // the frame, owned by the ring and shared read-only with subscribers' queues
}

// The causes of ring evictions (watchsan_shared_feed_ring_evictions_total's cause label).
const (
	EvictRingBytes  = "ring-bytes"  // its own --share-ring-bytes
	EvictRingEvents = "ring-events" // its own --share-ring-events
	// EvictTotalOwn: --share-ring-total-bytes was reached, and the ring adding an event held
	// more than its fair share (the total over the rings open): it evicted its own oldest.
	EvictTotalOwn = "total-own"
	// EvictTotalLargest: --share-ring-total-bytes was reached by a ring within its fair
	// share: the largest ring's oldest went.
	EvictTotalLargest = "total-largest"
)

// EvictionCauses lists watchsan_shared_feed_ring_evictions_total's causes (to initialise
// series).
var EvictionCauses = []string{EvictRingBytes, EvictRingEvents, EvictTotalOwn, EvictTotalLargest}

// New returns an empty ring covering from start, bounded by maxBytes and maxEvents, in budget
// b (nil: none); evicted counts its evictions by cause (nil: not counted).
func New(start uint64, maxBytes, maxEvents int, b *Budget, evicted *prometheus.CounterVec) *Ring {
	r := &Ring{start: start, maxBytes: maxBytes, maxEvents: maxEvents}
	if evicted != nil {
		r.evicted = make(map[string]prometheus.Counter, len(EvictionCauses))
		for _, c := range EvictionCauses {
			r.evicted[c] = evicted.WithLabelValues(c)
		}
	}
	if b != nil {
		b.join(r)
	}
	return r
}

func (r *Ring) len() int { return len(r.frames) - r.head }

// Add keeps the frame raw of an event delivered at rv, evicting the oldest to stay within
// bounds, then the budget's (never waiting for another feed: see Budget). A frame bigger
// than the byte bound on its own evicts everything, itself included: the ring then covers
// from rv.
func (r *Ring) Add(rv uint64, raw []byte) {
	r.mu.Lock()
	r.frames = append(r.frames, frame{rv: rv, raw: raw})
	r.setBytes(r.bytes + len(raw))
	for r.len() > 0 && (r.bytes > r.maxBytes || r.len() > r.maxEvents) {
		cause := EvictRingBytes
		if r.len() > r.maxEvents {
			cause = EvictRingEvents
		}
		r.evictLocked(cause)
	}
	b := r.budget
	r.mu.Unlock()
	if b != nil {
		b.fit(r)
	}
}

// evictLocked lets the oldest frame go; the ring is not empty and mu is held.
func (r *Ring) evictLocked(cause string) {
	old := r.frames[r.head]
	r.frames[r.head] = frame{}
	r.head++
	r.setBytes(r.bytes - len(old.raw))
	r.start = old.rv
	if c := r.evicted[cause]; c != nil {
		c.Inc()
	}
	// Compact once half the slice is dead, so the backing array stays about twice the bound.
	if r.head >= len(r.frames)/2 {
		n := copy(r.frames, r.frames[r.head:])
		clear(r.frames[n:])
		r.frames = r.frames[:n]
		r.head = 0
	}
}

// setBytes sets what the ring holds, and the budget's total with it; mu is held.
func (r *Ring) setBytes(n int) {
	if r.budget != nil {
		r.budget.add(int64(n - r.bytes))
	}
	r.bytes = n
	r.held.Store(int64(n))
}

// evictOldest lets the oldest frame go for the budget, if the ring holds any; false if not.
func (r *Ring) evictOldest(cause string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.len() == 0 {
		return false
	}
	r.evictLocked(cause)
	return true
}

// After returns the frames of the events after rv, oldest first, and their bytes: what a
// watch from rv gets before the live ones; ok false when the ring does not cover rv (it
// starts above it). The slice is new; the frames are shared.
func (r *Ring) After(rv uint64) (frames [][]byte, bytes int, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rv < r.start {
		return nil, 0, false
	}
	live := r.frames[r.head:]
	i := len(live)
	for i > 0 && live[i-1].rv > rv {
		i--
	}
	frames = make([][]byte, 0, len(live)-i)
	for _, f := range live[i:] {
		frames = append(frames, f.raw)
		bytes += len(f.raw)
	}
	return frames, bytes, true
}

// Covers says whether the ring has every event after rv the feed delivered.
func (r *Ring) Covers(rv uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return rv >= r.start
}

// Stats is what /debug/feeds shows of the ring: its events, bytes, start and the
// resourceVersion of its newest event (its start when it holds none).
func (r *Ring) Stats() (events, bytes int, from, to uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	to = r.start
	if r.len() > 0 {
		to = r.frames[len(r.frames)-1].rv
	}
	return r.len(), r.bytes, r.start, to
}

// Release lets every frame go and takes the ring out of its budget: its feed ended, or
// replaced it (an absorb's end). It then holds nothing and covers nothing older than before.
func (r *Ring) Release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.len() > 0 {
		r.start = r.frames[len(r.frames)-1].rv
	}
	r.setBytes(0)
	r.frames, r.head = nil, 0
	if r.budget != nil {
		r.budget.leave(r)
		r.budget = nil
	}
}

// Budget bounds the bytes all shared feeds' rings hold together (--share-ring-total-bytes,
// docs/design.md section 11, "Bounds"): each ring is bounded on its own too, but distinct
// watches of one busy scope (any query parameter splits feeds, as it must) would each keep
// their own copy. When an add takes the total over, the ring that added evicts its own oldest
// if it holds more than its fair share (the total over the rings open), else the largest ring
// does, oldest first, until the total fits. Nothing waits: an eviction takes one ring's lock
// at a time, never a feed's, and delivery goes on; a ring that evicted covers less, and a
// client re-watching from before it gets a private feed, as when a ring evicts on its own.
type Budget struct {
	max   int64
	total atomic.Int64
	gauge prometheus.Gauge // the total; nil: not exported
	// mem is the process's memory budget, charged for every ring byte; while it is short the
	// rings give way as if past their own total. Nil: only max bounds them.
	mem *budget.Budget

	mu    sync.Mutex
	rings map[*Ring]struct{}
}

// NewBudget returns a budget of max bytes for all rings together; gauge (nil: none) shows
// their total, and mem (nil: none) is the process's memory budget they are charged to.
func NewBudget(max int64, gauge prometheus.Gauge, mem *budget.Budget) *Budget {
	return &Budget{max: max, gauge: gauge, mem: mem, rings: map[*Ring]struct{}{}}
}

func (b *Budget) join(r *Ring) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rings[r] = struct{}{}
	r.budget = b
}

func (b *Budget) leave(r *Ring) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.rings, r)
}

func (b *Budget) add(n int64) {
	if n == 0 {
		return
	}
	b.total.Add(n)
	b.mem.Charge(budget.Rings, n)
	if b.gauge != nil {
		b.gauge.Add(float64(n))
	}
}

// fit evicts until the total is within the budget, after r added (see Budget). Two adds
// at once may each evict for the same excess: at most a frame more than needed each.
func (b *Budget) fit(r *Ring) {
	for b.total.Load() > b.max || b.mem.Short() {
		victim, cause := r, EvictTotalOwn
		b.mu.Lock()
		fair := b.max / int64(max(len(b.rings), 1))
		if r.held.Load() <= fair {
			victim, cause = b.largestLocked(), EvictTotalLargest
		}
		b.mu.Unlock()
		if victim == nil || !victim.evictOldest(cause) {
			return // emptied under us: the others' adds fit it
		}
	}
}

// largestLocked is the ring holding the most bytes; nil: none holds any. mu is held.
func (b *Budget) largestLocked() *Ring {
	var big *Ring
	var most int64
	for r := range b.rings {
		if n := r.held.Load(); n > most {
			big, most = r, n
		}
	}
	return big
}
