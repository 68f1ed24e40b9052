// Package coalesce serves a storm of identical reads (many clients of one principal relisting
// the same resource at once, or fetching the same discovery and OpenAPI documents) from as
// few upstream reads as the apiserver's semantics allow, streaming each upstream answer to
// every client it serves as it arrives (docs/design.md section 18).
//
// The rule is ReadIndex batching (Raft, section 6.4): a request joins only an upstream read
// that has not begun yet. Per key there is at most one read on the wire and one pending; a
// request that arrives while one is on the wire joins the pending one, which is sent as soon
// as the one on the wire is answered (its status and headers: the apiserver has read the state
// it answers with). Every answer a client gets therefore comes
// from a read the apiserver received after the client's request arrived, with the same path,
// query, headers and credentials: an answer the apiserver could have given that request
// itself. So a write made before a client's read began is in its answer whenever the
// apiserver would have put it there. A continue page, whose answer its token fixes, may also
// join a read that has begun while that read still holds its whole answer.
//
// Keys (Classify) include the principal; a list the caller had reviewed for its own
// credentials may use ReviewedKey instead, shared across identities.
package coalesce

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/watchsan/watchsan/internal/budget"
	"github.com/watchsan/watchsan/internal/upstream"
)

// Defaults of Config.
const (
	// DefaultMaxMembers bounds the clients one upstream read serves.
	DefaultMaxMembers = 10000
	// DefaultMaxGroups bounds the keys with a read on the wire or pending.
	DefaultMaxGroups = 1000
	// DefaultLagBytes is how far a client may be behind the fastest client of its read.
	DefaultLagBytes = 16 << 20
	// DefaultTotalBytes bounds what every read buffers together.
	DefaultTotalBytes = 256 << 20
	// keepFixed is how long a continue page's answer is kept after its last member left, for
	// the clients of the same snapshot still coming (a wave's clients reach their next page
	// seconds apart: docs/design.md section 18). The answer is the token's whenever it is read.
	keepFixed = 5 * time.Second
	// chunkSize is what one read of the upstream body asks for.
	chunkSize = 32 << 10
)

// Config bounds a Coalescer. Every field's zero value is its default's.
type Config struct {
	// MaxMembers bounds the requests one upstream read serves; a request arriving when the
	// pending read of its key has that many goes upstream on its own. 0: DefaultMaxMembers.
	MaxMembers int
	// MaxGroups bounds the keys with a read on the wire or pending; a request of a new key
	// beyond it goes upstream on its own. 0: DefaultMaxGroups.
	MaxGroups int
	// LagBytes bounds how far a member may be behind the fastest member of its read: one
	// further behind is ended (its response cut, so its client retries), and the upstream
	// read is read no further ahead of the fastest than this. A read therefore buffers at
	// most LagBytes and two chunks. 0: DefaultLagBytes.
	LagBytes int64
	// TotalBytes bounds what the reads buffer together: while they hold more, each read's
	// lag bound is its fair share of it (TotalBytes over the reads being read, at least two
	// chunks), so a read over its share ends its lagging members rather than growing. Every
	// read buffers at most its bound and two chunks. 0: DefaultTotalBytes.
	TotalBytes int64
	// Clock times how long a finished continue page is kept. Nil: the real clock.
	Clock clock.WithDelayedExecution
	// Budget is the process's memory budget, which what the reads buffer is counted in
	// (budget.Reads): while it is Short, every read's lag bound is two chunks, so its lagging
	// members are ended (their clients retry) and no finished read is kept for late joiners
	// (docs/design.md section 15). Nil: the reads are bounded by TotalBytes alone.
	Budget *budget.Budget
}

// Send sends one upstream read: r is a request of its key's, with ctx as its context, cred
// its credentials. It returns the response and what to call when done with it, or an error
// before any response.
type Send func(ctx context.Context, r *http.Request, cred upstream.Credentials) (*http.Response, func(), error)

// Metrics are what a Coalescer counts; every field is required.
type Metrics struct {
	Coalesced     *prometheus.CounterVec   // kind: requests served by an upstream read another request began
	UpstreamReads *prometheus.CounterVec   // kind: upstream reads sent
	Members       *prometheus.HistogramVec // kind: requests one upstream read served
	Lagging       *prometheus.CounterVec   // kind: members ended for lagging
	Bypassed      *prometheus.CounterVec   // reason: requests that could have coalesced but went alone (BypassReasons)
}

// The values of the bypassed reason label.
const (
	bypassGroups  = "group-limit"  // MaxGroups keys had a read
	bypassMembers = "member-limit" // the pending read had MaxMembers
)

// BypassReasons lists the bypassed reason label's values.
var BypassReasons = []string{bypassGroups, bypassMembers}

// Coalescer holds the reads on the wire and pending, per key. Safe for concurrent use.
type Coalescer struct {
	cfg  Config
	send Send
	m    Metrics
	log  *zap.Logger

	// buffered is what every read holds together; reading counts the reads being read.
	buffered, reading atomic.Int64

	mu    sync.Mutex
	slots map[Key]*slot
	// serving counts, per ReviewedKey, the requests being served that could share under it
	// (Track); a key is in it only while some are.
	serving map[Key]int
}

// Track says whether another request that could share under the reviewed key rk is being
// served now (a storm: worth an access review to share across identities), and counts this
// one until done is called. A lone request so costs no review.
func (c *Coalescer) Track(rk Key) (busy bool, done func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	busy = c.serving[rk] > 0
	c.serving[rk]++
	return busy, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.serving[rk]--; c.serving[rk] <= 0 {
			delete(c.serving, rk)
		}
	}
}

// lagBound is how far a member of a read may be behind its fastest member now: LagBytes, or
// while the reads hold more than TotalBytes together, the read's fair share of it, or while
// the memory budget is Short, two chunks.
func (c *Coalescer) lagBound() int64 {
	switch {
	case c.cfg.Budget.Short():
		return 2 * chunkSize
	case c.buffered.Load() <= c.cfg.TotalBytes:
		return c.cfg.LagBytes
	}
	return min(c.cfg.LagBytes, max(2*chunkSize, c.cfg.TotalBytes/max(c.reading.Load(), 1)))
}

// roomy says whether the reads may keep what no member reads now: within TotalBytes
// together, and the budget not Short.
func (c *Coalescer) roomy() bool {
	return c.buffered.Load() <= c.cfg.TotalBytes && !c.cfg.Budget.Short()
}

// hold counts n bytes a read buffers (n < 0: gives them back), in the reads' total and in the
// memory budget; the one place either changes.
func (c *Coalescer) hold(n int64) {
	c.buffered.Add(n)
	c.cfg.Budget.Charge(budget.Reads, n)
}

// slot is a key's read on the wire and not yet answered (sent) and the one pending (next; nil:
// none); for a key whose answer is fixed (Snapshot), last is its latest answered read, joinable
// while it holds its whole answer (nil: none).
type slot struct {
	sent, next, last *flight
}

// New returns a Coalescer that sends its reads with send.
func New(cfg Config, send Send, m Metrics, log *zap.Logger) *Coalescer {
	if cfg.MaxMembers <= 0 {
		cfg.MaxMembers = DefaultMaxMembers
	}
	if cfg.MaxGroups <= 0 {
		cfg.MaxGroups = DefaultMaxGroups
	}
	if cfg.LagBytes <= 0 {
		cfg.LagBytes = DefaultLagBytes
	}
	if cfg.TotalBytes <= 0 {
		cfg.TotalBytes = DefaultTotalBytes
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Coalescer{cfg: cfg, send: send, m: m, log: log, slots: map[Key]*slot{}, serving: map[Key]int{}}
}

// Serve serves r, of the given key and kind (Classify), going with cred, from an upstream read
// that begins after r arrived, shared with the requests of the same key arriving before it
// begins. It returns false, having written nothing, when a bound keeps r out: the caller then
// serves r on its own.
func (c *Coalescer) Serve(w http.ResponseWriter, r *http.Request, key Key, kind string, cred upstream.Credentials) bool {
	f, m, lead := c.join(r, key, kind, cred, Snapshot(r))
	if f == nil {
		return false
	}
	if !lead {
		c.m.Coalesced.WithLabelValues(kind).Inc()
	}
	f.serve(w, r, m)
	return true
}

// join adds r to its key's pending read, making one (and sending it at once when none of the
// key is on the wire); nil when a bound keeps it out.
func (c *Coalescer) join(r *http.Request, key Key, kind string, cred upstream.Credentials, fixed bool) (*flight, *member, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slots[key]
	if fixed && s != nil { // the answer is the same whenever it is read: any read that still has all of it
		for _, f := range []*flight{s.sent, s.last} {
			if m := f.joinLate(c.cfg.MaxMembers); m != nil {
				return f, m, false
			}
		}
	}
	if s == nil {
		if len(c.slots) >= c.cfg.MaxGroups {
			c.m.Bypassed.WithLabelValues(bypassGroups).Inc()
			return nil, nil, false
		}
		s = &slot{}
		c.slots[key] = s
	}
	lead := false
	if s.next == nil {
		s.next, lead = newFlight(c, key, kind, r, cred, fixed), true
	} else if s.next.count >= c.cfg.MaxMembers {
		c.m.Bypassed.WithLabelValues(bypassMembers).Inc()
		return nil, nil, false
	}
	f := s.next
	m := f.add()
	if s.sent == nil {
		c.start(s)
	}
	return f, m, lead
}

// start puts s's pending read on the wire. c.mu is held.
func (c *Coalescer) start(s *slot) {
	f := s.next
	s.sent, s.next = f, nil
	c.m.UpstreamReads.WithLabelValues(f.kind).Inc()
	go f.run() // ends when the upstream body is read to its end, fails, or every member left
}

// answered is told that f, on the wire, has its answer's status and headers (or failed): the
// apiserver has read the state it answers with, so the read is no longer in flight in the
// ReadIndex sense, and the pending read of its key, if any, goes on the wire now. Waiting for
// f's body to end instead would make the pending read's members wait for f's, since f is read
// no faster than its fastest member (docs/design.md section 18).
func (c *Coalescer) answered(f *flight, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slots[f.key]
	if s == nil || s.sent != f {
		return
	}
	s.sent = nil
	if f.fixed && ok && f.holdsAllServing() {
		s.last = f // joinable while it holds its whole answer; forgotten when it is done (forget)
	}
	if s.next != nil {
		c.start(s)
		return
	}
	if s.last == nil {
		delete(c.slots, f.key)
	}
}

// forget is told that f's last member left: f is no longer its key's last read.
func (c *Coalescer) forget(f *flight) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slots[f.key]
	if s == nil || s.last != f {
		return
	}
	s.last = nil
	if s.sent == nil && s.next == nil {
		delete(c.slots, f.key)
	}
}
