package server

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// recentEvents is a bounded ring of what watchsan did lately that an operator may want to see
// on the status page (status.go): rewrites, resumes, moves, absorbs and forced relists. The
// metrics count them; this keeps the last few with what and where. One per Server, given to
// the parts that report at construction (the pool's OnMove, the watch handler's OnBreak and
// Note). Safe for concurrent use.
type recentEvents struct {
	clk clock.PassiveClock
	mu  sync.Mutex
	buf []recentEvent // a ring of cap entries; next is where the next one goes
	// next is the index the next event is written at; total counts every event added.
	next  int
	total uint64
}

// recentEvent is one thing watchsan did.
type recentEvent struct {
	At time.Time `json:"at"`
	// Kind is rewrite, resume, move, absorb or relist.
	Kind string `json:"kind"`
	// Upstream is the upstream it happened on, when known.
	Upstream string `json:"upstream,omitempty"`
	// Where is the watch's path (its resource and scope), when known.
	Where string `json:"where,omitempty"`
	// Detail says why or how (a reason, the counts of a rewrite).
	Detail string `json:"detail,omitempty"`
}

// maxRecentEvents bounds the ring.
const maxRecentEvents = 200

// newRecentEvents returns an empty ring of n entries on clk (nil: the real clock).
func newRecentEvents(n int, clk clock.PassiveClock) *recentEvents {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &recentEvents{clk: clk, buf: make([]recentEvent, 0, n)}
}

// add records an event now, the oldest dropped when the ring is full.
func (r *recentEvents) add(kind, upstream, where, detail string) {
	e := recentEvent{At: r.clk.Now(), Kind: kind, Upstream: upstream, Where: clip(where), Detail: clip(detail)}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total++
	if len(r.buf) < cap(r.buf) {
		r.buf = append(r.buf, e)
		return
	}
	if cap(r.buf) == 0 {
		return
	}
	r.buf[r.next] = e
	r.next = (r.next + 1) % cap(r.buf)
}

// list returns the events held, the newest first, and how many were added in all.
func (r *recentEvents) list() ([]recentEvent, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]recentEvent, 0, len(r.buf))
	for i := range r.buf {
		// Newest first: the one before next, going back around the ring.
		j := (r.next - 1 - i + 2*len(r.buf)) % len(r.buf)
		out = append(out, r.buf[j])
	}
	return out, r.total
}
