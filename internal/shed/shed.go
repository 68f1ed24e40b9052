// Package shed evens out long-lived client connections across the replicas of a watchsan
// frontend (docs/design.md section 10.12): a replica that holds more than its share of the
// connections sheds the excess, one at a time at a bounded rate, never below a floor, so that
// clients reconnect through the load balancer and some land on the replicas that hold fewer.
//
// The shedder decides which connection goes and when; what shedding a connection does (a
// GOAWAY, the watches on it ended cleanly) is its caller's, given as Conn's shed function.
package shed

import (
	"math"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Defaults of what a frontend replica's shedder is given besides its share and rate.
const (
	// DefaultSlack: a replica holds a tenth over its share before it sheds.
	DefaultSlack = 0.1
	// DefaultFloor: a replica keeps ten connections whatever its share.
	DefaultFloor = 10
	// DefaultMinAge: a connection is held ten seconds before it may be shed, so that a client
	// that just moved here is not passed on at once.
	DefaultMinAge = 10 * time.Second
)

// A round of sheds: after RoundSheds, the shedder checks that as many connections did not come
// back. When they all did (or new ones replaced them), shedding moves nothing: the other
// replicas are down or full, or the expected total is below the real one. It then pauses,
// FirstPause and twice as long after each round that moved nothing more, up to MaxPause.
const (
	RoundSheds = 10
	FirstPause = 30 * time.Second
	MaxPause   = 10 * time.Minute
)

// Options configure a Shedder; every field is read once, by New.
type Options struct {
	// Replicas is how many replicas share the connections, Expected how many connections
	// they hold together; a replica's share is Expected/Replicas, rounded up. Both must be
	// positive.
	Replicas, Expected int
	// Slack is the fraction above the share that a replica holds before it sheds (0.1: 10%
	// more), and at least one connection: without it, two replicas at share+1 and share-1
	// would pass a connection back and forth.
	Slack float64
	// Floor is the least connections a replica keeps whatever its share.
	Floor int
	// Rate is how many connections a second a replica sheds at most; must be positive.
	Rate float64
	// MinAge is how long a connection is held before it may be shed: one that just moved
	// here stays, so that no client is passed on from replica to replica.
	MinAge time.Duration
	// Clock times the sheds and the ages; nil: the real clock.
	Clock clock.WithTicker
	// OnShed is told each connection shed, after its shed function returned; nil: no one.
	OnShed func()
	// OnPause is told each pause after a round that moved nothing, with its length and the
	// connections that came in during the round's sheds; nil: no one.
	OnPause func(pause time.Duration, shed, arrived int)
}

// Shedder keeps the set of a replica's connections and sheds those above its limit. Its
// methods are safe for concurrent use.
type Shedder struct {
	limit   int
	period  time.Duration
	minAge  time.Duration
	clk     clock.WithTicker
	onShed  func()
	onPause func(time.Duration, int, int)

	mu    sync.Mutex
	conns map[*Conn]struct{}
	held  int // conns not shedding
	// opened counts every Open; the round began with roundOpened of them and has shed
	// roundShed (RoundSheds at most). pause is the last pause (0: none since a round that
	// moved connections), pausedUntil when it ends.
	opened, roundOpened, roundShed int
	pause                          time.Duration
	pausedUntil                    time.Time
}

// Conn is one connection the Shedder may shed.
type Conn struct {
	opened time.Time
	shed   func()
	ready  func(now time.Time) bool
	// shedding is set once the connection is picked; it no longer counts as held. Guarded by
	// the Shedder's mu.
	shedding bool
}

// New builds a Shedder; Run sheds.
func New(o Options) *Shedder {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &Shedder{
		limit: Limit(o.Replicas, o.Expected, o.Slack, o.Floor), period: time.Duration(float64(time.Second) / o.Rate),
		minAge: o.MinAge, clk: o.Clock, onShed: o.OnShed, onPause: o.OnPause, conns: map[*Conn]struct{}{},
	}
}

// Limit is how many connections a replica holds before it sheds: its share (expected over
// replicas, rounded up), plus slack times it and at least one, and never below floor.
func Limit(replicas, expected int, slack float64, floor int) int {
	share := (expected + replicas - 1) / replicas
	extra := int(math.Ceil(float64(share) * slack))
	return max(floor, share+max(1, extra))
}

// Limit is the most connections this replica holds before it sheds one.
func (s *Shedder) Limit() int { return s.limit }

// Now is the time on the Shedder's clock (Options.Clock), which a Conn's ready is asked at.
func (s *Shedder) Now() time.Time { return s.clk.Now() }

// Held is how many connections the replica holds and has not shed.
func (s *Shedder) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// Open adds a connection opened now: shed ends it (the caller's: it must not block for
// long), ready (nil: always) says whether it may be shed at the time given, besides its age.
// The caller calls Close when the connection closes.
func (s *Shedder) Open(shed func(), ready func(now time.Time) bool) *Conn {
	c := &Conn{opened: s.clk.Now(), shed: shed, ready: ready}
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.held++
	s.opened++
	s.mu.Unlock()
	return c
}

// Close takes c out of the set; only its first call counts.
func (s *Shedder) Close(c *Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.conns[c]; !ok {
		return
	}
	delete(s.conns, c)
	if !c.shedding {
		s.held--
	}
}

// Step sheds one connection if the replica holds more than its limit: the oldest one at least
// MinAge old that is ready, unless shedding is paused (RoundSheds). It reports whether it shed
// one. Run calls it once a period; a test
// calls it with a stepped clock.
func (s *Shedder) Step() bool { return s.step(s.clk.Now()) }

// step is Step at the time now (Run's: its tick's).
func (s *Shedder) step(now time.Time) bool {
	s.mu.Lock()
	if s.held <= s.limit || now.Before(s.pausedUntil) {
		s.mu.Unlock()
		return false
	}
	if paused, shed, arrived := s.endRoundLocked(now); paused > 0 {
		s.mu.Unlock()
		if s.onPause != nil {
			s.onPause(paused, shed, arrived)
		}
		return false
	}
	var pick *Conn
	for c := range s.conns { // O(connections) once a period: at most --max-connections
		if c.shedding || now.Sub(c.opened) < s.minAge || (pick != nil && !c.opened.Before(pick.opened)) {
			continue
		}
		if c.ready != nil && !c.ready(now) {
			continue
		}
		pick = c
	}
	if pick == nil {
		s.mu.Unlock()
		return false
	}
	pick.shedding = true
	s.held--
	if s.roundShed == 0 {
		s.roundOpened = s.opened
	}
	s.roundShed++
	s.mu.Unlock()
	pick.shed()
	if s.onShed != nil {
		s.onShed()
	}
	return true
}

// endRoundLocked ends a full round, a period or more after its last shed, and starts a new
// one: when as many connections came in (arrived) as it shed, it pauses shedding and returns
// the pause. s.mu is held.
func (s *Shedder) endRoundLocked(now time.Time) (paused time.Duration, shed, arrived int) {
	if s.roundShed < RoundSheds {
		return 0, 0, 0
	}
	shed, arrived = s.roundShed, s.opened-s.roundOpened
	s.roundShed = 0
	if arrived < shed {
		s.pause = 0
		return 0, shed, arrived
	}
	s.pause = min(max(2*s.pause, FirstPause), MaxPause)
	s.pausedUntil = now.Add(s.pause)
	return s.pause, shed, arrived
}

// Run sheds at most one connection a period (1/Rate) until done is closed.
func (s *Shedder) Run(done <-chan struct{}) {
	t := s.clk.NewTicker(s.period)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case now := <-t.C():
			s.step(now)
		}
	}
}
