package absorb

import (
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/watchsan/watchsan/internal/budget"
	"github.com/watchsan/watchsan/internal/stream"
)

// A feed's state (docs/design.md section 12): every object alive at the last delivered
// resourceVersion, by namespace/name, with its uid, resourceVersion and the frame it was last
// delivered in. It is what lets a feed answer a 410 at its resume point with the difference
// between a fresh list and what its subscribers hold (Holder.Diff), instead of sending them
// the 410. It is kept only where it can be complete: a feed whose upstream watch began with the
// initial state (resourceVersion "" or "0" without sendInitialEvents=false, or a watch-list),
// or adopted the state of the watch its client's re-watch follows (Parked), or a shared feed
// handed one, or began at its client's own list's resourceVersion with that list parked
// (Teed), in a format absorbing reads (stream.ListCodecForAccept: JSON, protobuf, CBOR), of
// whole objects or Table rows (keyed by the row: NewStateOf). A watch from a client's resourceVersion never sees the
// objects that did not change since, so a state built from its events alone would miss them,
// and a diff against a list would miss their deletes.

// Overhead is what one object costs besides its key's, uid's and frame's bytes: the map entry,
// the obj and the string and slice headers (measured about 120 bytes on amd64; rounded up).
// The budgets count it, so that they bound memory, not just payload.
const Overhead = 160

// obj is one object of a feed's state.
type obj struct {
	uid string
	rv  uint64
	// frame is the event it was last delivered in, as read (JSON: one value and its newline).
	// It is the state's own, never shared: observe overwrites it in place with the object's
	// next frame when that fits.
	frame []byte
}

// Budget is the budget all feeds' states share (NewBudget); held counts what they hold. Its
// bounds are set at construction and never written again.
type Budget struct {
	perFeed, total int64
	held           atomic.Int64
	// copies counts what clients' lists' copies hold of held (Teed), at most a quarter of
	// total: a storm of lists in flight never takes the budget the feeds' states live in (a
	// state that cannot grow is dropped for good).
	copies atomic.Int64
	gauge  prometheus.Gauge // bytes held; nil: not exported
	// mem is the process's memory budget, which a state's bytes come out of too; nil: only
	// total bounds them.
	mem *budget.Budget
}

// NewBudget is a budget of perFeed bytes for one state and total for all, whose bytes held
// gauge shows (nil: none) and come out of mem too (nil: only total bounds them).
func NewBudget(perFeed, total int64, gauge prometheus.Gauge, mem *budget.Budget) *Budget {
	return &Budget{perFeed: perFeed, total: total, gauge: gauge, mem: mem}
}

// PerFeed is one state's bound, Total all states', Held what they hold now.
func (b *Budget) PerFeed() int64 { return b.perFeed }
func (b *Budget) Total() int64   { return b.total }
func (b *Budget) Held() int64    { return b.held.Load() }

// take reserves n bytes of the total, and of the memory budget; false when that would pass
// either.
func (b *Budget) take(n int64) bool {
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

// takeCopy is take for a client's list's copy (Teed), within a quarter of the total for all
// copies.
func (b *Budget) takeCopy(n int64) bool {
	if b.copies.Add(n) > b.total/4 {
		b.copies.Add(-n)
		return false
	}
	if !b.take(n) {
		b.copies.Add(-n)
		return false
	}
	return true
}

// giveCopy returns n bytes takeCopy took.
func (b *Budget) giveCopy(n int64) {
	b.copies.Add(-n)
	b.give(n)
}

// give returns n bytes taken.
func (b *Budget) give(n int64) {
	if n == 0 {
		return
	}
	b.held.Add(-n)
	b.mem.Give(budget.States, n)
	if b.gauge != nil {
		b.gauge.Sub(float64(n))
	}
}

// State is one feed's state (NewState). Only its feed's goroutine touches it, or whoever
// holds it while it is parked or handed over.
type State struct {
	budget *Budget
	// format is its frames' format, the one of the feed that built it: a state goes only to
	// a feed answered in the same (a parked state's key holds the client's Accept, not the
	// format the apiserver chose for it).
	format stream.Format
	objs   map[string]*obj
	bytes  int64
	// scratch is where observe builds an event's key.
	scratch []byte
	// dropped, once set, says why the state is gone for good (an Outcomes value): the
	// feed answers a later 410 as without state.
	dropped string
	// table: its frames are Table watch events (stream.IsTable), keyed by their row; false:
	// by their object, as the Reader reads it.
	table bool
}

// NewState is an empty state, complete, of frames in format, within b.
func NewState(b *Budget, format stream.Format) *State {
	return &State{budget: b, format: format, objs: map[string]*obj{}}
}

// NewStateOf is an empty state, complete, of frames in format as codec makes them (the Table
// codec's: Table watch events), within b.
func NewStateOf(b *Budget, format stream.Format, codec stream.ListCodec) *State {
	s := NewState(b, format)
	s.table = stream.IsTable(codec)
	return s
}

// Table says whether the state's frames are Table watch events.
func (s *State) Table() bool { return s.table }

// Format is the format of the state's frames.
func (s *State) Format() stream.Format { return s.format }

// Dropped says why the state is gone for good (an Outcomes value); "": it is not.
func (s *State) Dropped() string { return s.dropped }

func objCost(key string, o *obj) int64 {
	// By the frame's capacity, what it holds: a frame overwritten in place by a shorter one
	// keeps its buffer.
	return int64(len(key)+len(o.uid)+cap(o.frame)) + Overhead
}

// Observe updates the state with one delivered event; false when it no longer holds a state
// (Dropped says why).
func (s *State) Observe(ev *stream.Event) bool {
	if s.dropped != "" {
		return false
	}
	switch ev.Type {
	case stream.Added, stream.Modified, stream.Deleted:
	default:
		return true // a bookmark, an ERROR: no object
	}
	uid := ev.UID
	if s.table {
		// A Table's identity is its one row's object's (stream.RowOf), which the Reader does
		// not read: parsed here, for Table feeds alone (kubectl's, few and slow).
		// The Table's resourceVersion is the event's (the row's object's, but for an
		// absorb's DELETED, rewritten to the last delivered one).
		key, rowUID, _, err := stream.RowOf(ev.Raw)
		if err != nil || !ev.RVIsInt {
			s.drop(NotComplete)
			return false
		}
		s.scratch, uid = append(s.scratch[:0], key...), rowUID
	} else {
		if ev.Name == "" || !ev.RVIsInt {
			// Nothing to key it by, or a resourceVersion a list cannot be compared with.
			s.drop(NotComplete)
			return false
		}
		// The key is built in scratch and looked up without a string of its own (the
		// compiler's map index by string(bytes)): most events are a MODIFIED of an object the
		// state holds.
		s.scratch = append(append(append(s.scratch[:0], ev.Namespace...), '/'), ev.Name...)
	}
	old := s.objs[string(s.scratch)]
	if ev.Type == stream.Deleted {
		if old != nil {
			key := string(s.scratch)
			s.release(key, old)
			delete(s.objs, key)
		}
		return true
	}
	if old != nil && old.uid == uid && cap(old.frame) >= len(ev.Raw) {
		// The same object again, in a frame that fits the one held: overwritten in place (the
		// state is the frame's only holder, obj). Its cost, counted by capacity, is unchanged.
		old.frame = append(old.frame[:0], ev.Raw...)
		old.rv = ev.RVInt
		return true
	}
	// The key is a new string, the uid cloned (ev's strings share a block with other events',
	// stream.Event, which a state of many objects would keep alive) and Raw copied: the state
	// holds only its own bytes, as its budget counts them.
	return s.put(string(s.scratch), &obj{uid: strings.Clone(uid), rv: ev.RVInt, frame: append(make([]byte, 0, len(ev.Raw)), ev.Raw...)})
}

// put holds o under key, within the budgets; false when they would be passed (the state is
// dropped).
func (s *State) put(key string, o *obj) bool {
	old := s.objs[key]
	cost := objCost(key, o)
	var freed int64
	if old != nil {
		freed = objCost(key, old)
	}
	if s.bytes-freed+cost > s.budget.perFeed {
		s.drop(OverBudget)
		return false
	}
	if grow := cost - freed; grow > 0 && !s.budget.take(grow) {
		s.drop(OverBudget)
		return false
	} else if grow < 0 {
		s.budget.give(-grow)
	}
	s.bytes += cost - freed
	s.objs[key] = o
	return true
}

func (s *State) release(key string, o *obj) {
	c := objCost(key, o)
	s.bytes -= c
	s.budget.give(c)
}

// drop lets the state go for good, why an Outcomes value.
func (s *State) drop(why string) {
	if s.dropped != "" {
		return
	}
	s.dropped = why
	s.budget.give(s.bytes)
	s.bytes, s.objs = 0, nil
}

// Free returns everything the state holds (its feed ended).
func (s *State) Free() {
	if s.dropped == "" {
		s.drop("ended")
	}
}
