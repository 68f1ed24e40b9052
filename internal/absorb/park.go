package absorb

import (
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// A reflector's watch ends every 5 to 10 minutes (its timeoutSeconds), and it watches again
// from the last resourceVersion it got: a watch from a client's resourceVersion, whose feed
// cannot know what the client holds (docs/design.md section 12). But the feed whose stream just
// ended knew: its complete state at its last delivered resourceVersion D is every object alive
// at D with its bytes, the scope's true state at D, and so what any client at D holds. So a
// private feed with a complete state that ends is parked, by what it watched, whom as and D,
// for the park time; a new watch of the same scope, as the same principal, from exactly D
// adopts it and is complete from its start. A client that got less than the feed delivered (a
// last write lost) re-watches from below D and adopts nothing; one that asked for no bookmarks
// while the feed's last delivery was a bookmark it was not sent, likewise.

// Parked holds the states of ended watches, by their key and resourceVersion (NewParked). What
// they hold stays counted in their budget until adopted or expired, and so does each entry
// itself (its key, which carries the client's query and Accept, and Overhead): an empty
// state costs nothing of its own, so without that a client ending watches of distinct empty
// scopes would park entries the budget never saw. clk and ttl are set at construction; states
// is guarded by mu.
type Parked struct {
	clk clock.WithDelayedExecution
	ttl time.Duration

	mu     sync.Mutex
	states map[string]*parkedState
}

type parkedState struct {
	s     *State
	timer clock.Timer
	cost  int64 // the entry's own, taken from s.budget
}

// NewParked keeps parked states for ttl on clk.
func NewParked(clk clock.WithDelayedExecution, ttl time.Duration) *Parked {
	return &Parked{clk: clk, ttl: ttl, states: map[string]*parkedState{}}
}

// Park keeps s, complete at resourceVersion rv, for a re-watch from rv under key; an older one
// parked under the same key is freed. False: the budget is spent, and s was freed.
func (p *Parked) Park(key, rv string, s *State) bool {
	k := key + "\x00rv=" + rv
	p.mu.Lock()
	defer p.mu.Unlock()
	if old := p.states[k]; old != nil {
		delete(p.states, k)
		old.timer.Stop()
		old.release()
	}
	cost := int64(len(k)) + Overhead
	if !s.budget.take(cost) {
		s.Free() // the budget is spent: the re-watch goes without, as if none were parked
		return false
	}
	ps := &parkedState{s: s, cost: cost}
	ps.timer = p.clk.AfterFunc(p.ttl, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.states[k] == ps {
			delete(p.states, k)
			ps.release()
		}
	})
	p.states[k] = ps
	return true
}

// release frees a parked state nobody adopted, and the entry's own cost.
func (ps *parkedState) release() {
	ps.s.budget.give(ps.cost)
	ps.s.Free()
}

// Adopt takes the state parked under key for a watch from rv, or nil.
func (p *Parked) Adopt(key, rv string) *State {
	k := key + "\x00rv=" + rv
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

// Len is how many states are parked (tests, debugging).
func (p *Parked) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.states)
}

// At says whether a state is parked at resourceVersion rv, under any key (tests).
func (p *Parked) At(rv string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := range p.states {
		if strings.HasSuffix(k, "\x00rv="+rv) {
			return true
		}
	}
	return false
}
