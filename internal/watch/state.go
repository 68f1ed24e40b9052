package watch

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/watchsan/watchsan/internal/budget"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// A feed's state (docs/design.md section 12): every object alive at the last
// delivered resourceVersion, by namespace/name, with its uid, resourceVersion and the frame it
// was last delivered in. It is what lets a feed answer a 410 at its resume point with the
// difference between a fresh list and what its subscribers hold (absorb.go), instead of
// sending them the 410. It is kept only where it can be complete: a feed whose upstream watch
// began with the initial state (resourceVersion "" or "0" without sendInitialEvents=false, or
// a watch-list), or adopted the state of the watch its client's re-watch follows (park, below),
// or a shared feed handed one (share_state.go), in a format absorbing reads (stream.ListCodecFor:
// JSON, protobuf, CBOR), of whole objects (no "as=" in Accept). A watch from a client's
// resourceVersion never sees the objects that did not change since, so a state built from its
// events alone would miss them, and a diff against a list would miss their deletes.

// Defaults of the state's budgets, the flags' defaults.
const (
	// DefaultAbsorbStateBytes bounds one feed's state: a namespace's pods or a cluster's nodes
	// fit many times over; a feed over it drops its state.
	DefaultAbsorbStateBytes = 16 << 20
	// DefaultAbsorbTotalBytes bounds the states of all feeds together.
	DefaultAbsorbTotalBytes = 128 << 20
)

// stateOverhead is what one object costs besides its key's, uid's and frame's bytes: the map
// entry, the stateObj and the string and slice headers (measured about 120 bytes on amd64;
// rounded up). The budgets count it, so that they bound memory, not just payload.
const stateOverhead = 160

// stateObj is one object of a feed's state.
type stateObj struct {
	uid string
	rv  uint64
	// frame is the event it was last delivered in, as read (JSON: one value and its newline).
	// It is the state's own, never shared: observe overwrites it in place with the object's
	// next frame when that fits.
	frame []byte
}

// stateBudget is the budget all feeds' states share; held counts what they hold.
type stateBudget struct {
	perFeed, total int64
	held           atomic.Int64
	gauge          prometheus.Gauge // bytes held; nil: not exported
	// mem is the process's memory budget, which a state's bytes come out of too; nil: only
	// total bounds them.
	mem *budget.Budget
}

// take reserves n bytes of the total, and of the memory budget; false when that would pass
// either.
func (b *stateBudget) take(n int64) bool {
	if b.held.Add(n) > b.total {
		b.held.Add(-n)
		return false
	}
	if !b.mem.Take(budget.States, n) {
		b.held.Add(-n)
		return false
	}
	if b.gauge != nil {
		b.gauge.Add(float64(n))
	}
	return true
}

// give returns n bytes taken.
func (b *stateBudget) give(n int64) {
	if n == 0 {
		return
	}
	b.held.Add(-n)
	b.mem.Give(budget.States, n)
	if b.gauge != nil {
		b.gauge.Sub(float64(n))
	}
}

// feedState is one feed's state. Only the feed's goroutine touches it.
type feedState struct {
	budget *stateBudget
	key    string // what it is parked by when its feed ends (stateKey)
	// format is its frames' format, the one of the feed that built it: a state goes only to
	// a feed answered in the same (a parked state's key holds the client's Accept, not the
	// format the apiserver chose for it).
	format stream.Format
	objs   map[string]*stateObj
	bytes  int64
	// scratch is where observe builds an event's key.
	scratch []byte
	// dropped, once set, says why the state is gone for good (an absorbOutcomes value): the
	// feed answers a later 410 as without state.
	dropped string
}

func newFeedState(b *stateBudget, format stream.Format) *feedState {
	return &feedState{budget: b, format: format, objs: map[string]*stateObj{}}
}

func objCost(key string, o *stateObj) int64 {
	// By the frame's capacity, what it holds: a frame overwritten in place by a shorter one
	// keeps its buffer.
	return int64(len(key)+len(o.uid)+cap(o.frame)) + stateOverhead
}

// observe updates the state with one delivered event; false when it no longer holds a state
// (dropped says why).
func (s *feedState) observe(ev *stream.Event) bool {
	if s.dropped != "" {
		return false
	}
	switch ev.Type {
	case stream.Added, stream.Modified, stream.Deleted:
	default:
		return true // a bookmark, an ERROR: no object
	}
	if ev.Name == "" || !ev.RVIsInt {
		// Nothing to key it by, or a resourceVersion a list cannot be compared with.
		s.drop(absorbNotComplete)
		return false
	}
	// The key is built in scratch and looked up without a string of its own (the compiler's
	// map index by string(bytes)): most events are a MODIFIED of an object the state holds.
	s.scratch = append(append(append(s.scratch[:0], ev.Namespace...), '/'), ev.Name...)
	old := s.objs[string(s.scratch)]
	if ev.Type == stream.Deleted {
		if old != nil {
			key := string(s.scratch)
			s.release(key, old)
			delete(s.objs, key)
		}
		return true
	}
	if old != nil && old.uid == ev.UID && cap(old.frame) >= len(ev.Raw) {
		// The same object again, in a frame that fits the one held: overwritten in place (the
		// state is the frame's only holder, stateObj). Its cost, counted by capacity, is
		// unchanged.
		old.frame = append(old.frame[:0], ev.Raw...)
		old.rv = ev.RVInt
		return true
	}
	// The key is a new string, the uid cloned (ev's strings share a block with other events',
	// stream.Event, which a state of many objects would keep alive) and Raw copied: the state
	// holds only its own bytes, as its budget counts them.
	return s.put(string(s.scratch), &stateObj{uid: strings.Clone(ev.UID), rv: ev.RVInt, frame: append(make([]byte, 0, len(ev.Raw)), ev.Raw...)})
}

// put holds o under key, within the budgets; false when they would be passed (the state is
// dropped).
func (s *feedState) put(key string, o *stateObj) bool {
	old := s.objs[key]
	cost := objCost(key, o)
	var freed int64
	if old != nil {
		freed = objCost(key, old)
	}
	if s.bytes-freed+cost > s.budget.perFeed {
		s.drop(absorbOverBudget)
		return false
	}
	if grow := cost - freed; grow > 0 && !s.budget.take(grow) {
		s.drop(absorbOverBudget)
		return false
	} else if grow < 0 {
		s.budget.give(-grow)
	}
	s.bytes += cost - freed
	s.objs[key] = o
	return true
}

func (s *feedState) release(key string, o *stateObj) {
	c := objCost(key, o)
	s.bytes -= c
	s.budget.give(c)
}

// drop lets the state go for good, why an absorbOutcomes value.
func (s *feedState) drop(why string) {
	if s.dropped != "" {
		return
	}
	s.dropped = why
	s.budget.give(s.bytes)
	s.bytes, s.objs = 0, nil
}

// free returns everything the state holds (its feed ended).
func (s *feedState) free() {
	if s.dropped == "" {
		s.drop("ended")
	}
}

// A reflector's watch ends every 5 to 10 minutes (its timeoutSeconds), and it watches again
// from the last resourceVersion it got: a watch from a client's resourceVersion, whose feed
// cannot know what the client holds (docs/design.md section 12). But the feed whose stream just
// ended knew: its complete state at its last delivered resourceVersion D is every object alive
// at D with its bytes, the scope's true state at D, and so what any client at D holds. So a
// private feed with a complete state that ends is parked, by what it watched, whom as and D,
// for DefaultAbsorbParkTime; a new watch of the same scope, as the same principal, from exactly
// D adopts it and is complete from its start. A client that got less than the feed delivered
// (a last write lost) re-watches from below D and adopts nothing; one that asked for no
// bookmarks while the feed's last delivery was a bookmark it was not sent, likewise.

// DefaultAbsorbParkTime is how long an ended watch's complete state waits for its client's
// re-watch: a reflector re-watches at once after a clean end.
const DefaultAbsorbParkTime = 30 * time.Second

// parked holds the states of ended watches, by stateKey and resourceVersion. What they hold
// stays counted in their budget until adopted or expired, and so does each entry itself (its
// key, which carries the client's query and Accept, and stateOverhead): an empty state costs
// nothing of its own, so without that a client ending watches of distinct empty scopes would
// park entries the budget never saw.
type parked struct {
	mu     sync.Mutex
	states map[string]*parkedState
}

type parkedState struct {
	s     *feedState
	timer clock.Timer
	cost  int64 // the entry's own, taken from s.budget
}

// stateKey is what a state is parked and adopted by, but for its resourceVersion: the watch's
// path, every parameter but the per-subscriber ones (perSubscriber: its resourceVersion, its
// timeoutSeconds, bookmarks, timeout) and the initial-state ones (sendInitialEvents,
// resourceVersionMatch: the re-watch of a watch-list is a plain watch), its Accept, and the
// principal the upstream takes it for (cred.Principal, a digest): a state is only ever handed
// to the same identity's watch of the same scope.
func stateKey(r *http.Request, cred upstream.Credentials) string {
	q := r.URL.Query()
	for _, k := range append(perSubscriber, "sendInitialEvents", "resourceVersionMatch") {
		q.Del(k)
	}
	return r.URL.Path + "?" + q.Encode() + "\x00accept=" + r.Header.Get("Accept") + "\x00as=" + cred.Principal()
}

// park keeps s, complete at resourceVersion rv, for a re-watch from rv; an older one parked
// under the same key is freed.
func (h *Handler) park(key, rv string, s *feedState) {
	k := key + "\x00rv=" + rv
	p := h.parked
	p.mu.Lock()
	defer p.mu.Unlock()
	if old := p.states[k]; old != nil {
		delete(p.states, k)
		old.timer.Stop()
		old.release()
	}
	cost := int64(len(k)) + stateOverhead
	if !s.budget.take(cost) {
		s.free() // the budget is spent: the re-watch goes without, as if none were parked
		return
	}
	ps := &parkedState{s: s, cost: cost}
	ps.timer = h.clk.AfterFunc(h.cfg.AbsorbParkTime, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.states[k] == ps {
			delete(p.states, k)
			ps.release()
		}
	})
	p.states[k] = ps
}

// release frees a parked state nobody adopted, and the entry's own cost.
func (ps *parkedState) release() {
	ps.s.budget.give(ps.cost)
	ps.s.free()
}

// adopt takes the state parked for a watch from rv, or nil.
func (h *Handler) adopt(key, rv string) *feedState {
	k := key + "\x00rv=" + rv
	p := h.parked
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := p.states[k]
	if ps == nil {
		return nil
	}
	delete(p.states, k)
	ps.timer.Stop()
	ps.s.budget.give(ps.cost) // the entry is gone; the state's own bytes go on with it
	return ps.s
}

// parkedCount is how many states are parked (tests).
func (h *Handler) parkedCount() int {
	h.parked.mu.Lock()
	defer h.parked.mu.Unlock()
	return len(h.parked.states)
}
