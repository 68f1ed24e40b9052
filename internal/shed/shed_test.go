package shed

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestLimit(t *testing.T) {
	for _, c := range []struct {
		replicas, expected int
		slack              float64
		floor, want        int
	}{
		{2, 100, 0.1, 0, 55},   // share 50, 10% over
		{3, 100, 0.1, 0, 38},   // share 34 (rounded up), 4 over
		{2, 10, 0, 0, 6},       // share 5, at least one over
		{2, 10, 0.1, 20, 20},   // the floor
		{1, 100, 0.5, 10, 150}, // one replica: its share is everything
	} {
		if got := Limit(c.replicas, c.expected, c.slack, c.floor); got != c.want {
			t.Errorf("Limit(%d, %d, %v, %d) = %d, want %d", c.replicas, c.expected, c.slack, c.floor, got, c.want)
		}
	}
}

// replica is a Shedder with its connections, which tell moved when shed.
type replica struct {
	s     *Shedder
	conns []*Conn
}

func newReplica(clk *clocktesting.FakeClock, o Options) *replica {
	o.Clock = clk
	return &replica{s: New(o)}
}

func (r *replica) open(onShed func()) *Conn {
	var c *Conn
	c = r.s.Open(func() {
		r.s.Close(c) // the client goes at once in this model
		if onShed != nil {
			onShed()
		}
	}, nil)
	r.conns = append(r.conns, c)
	return c
}

func TestRunShedsAtTheRateDownToTheLimit(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	shed := 0
	r := newReplica(clk, Options{Replicas: 2, Expected: 20, Slack: 0, Floor: 0, Rate: 2, MinAge: time.Second, OnShed: func() { shed++ }})
	for range 20 {
		r.open(nil)
	}
	if r.s.Limit() != 11 {
		t.Fatalf("limit %d, want 11", r.s.Limit())
	}
	// Younger than MinAge: none shed, though the replica is over its limit.
	clk.Step(500 * time.Millisecond)
	if r.s.Step() || r.s.Held() != 20 {
		t.Fatalf("held %d after half a second, want 20 (too young to shed)", r.s.Held())
	}
	clk.Step(500 * time.Millisecond)
	done := make(chan struct{})
	defer close(done)
	go r.s.Run(done)
	waitTicker(t, clk)
	// One every half second (Rate 2), and none once at the limit.
	for i := 1; i <= 12; i++ {
		clk.Step(500 * time.Millisecond)
		want := max(20-i, 11)
		waitHeld(t, r.s, want)
	}
	if shed != 9 {
		t.Fatalf("shed %d, want 9", shed)
	}
}

func TestStepKeepsTheFloorAndSkipsWhatIsNotReady(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	s := New(Options{Replicas: 4, Expected: 8, Slack: 0, Floor: 5, Rate: 1, Clock: clk})
	for range 6 {
		var c *Conn
		c = s.Open(func() { s.Close(c) }, nil)
	}
	// The share is 2, the limit 3; the floor keeps 5.
	if !s.Step() || s.Step() || s.Held() != 5 {
		t.Fatalf("held %d, want the floor, 5", s.Held())
	}
	// A connection that is not ready (its watches too young) is passed over for the next.
	s2 := New(Options{Replicas: 2, Expected: 2, Rate: 1, Clock: clk})
	var picked []int
	for i := range 4 {
		s2.Open(func() { picked = append(picked, i) }, func(time.Time) bool { return i != 0 })
		clk.Step(time.Second)
	}
	s2.Step()
	if len(picked) != 1 || picked[0] != 1 {
		t.Fatalf("shed %v, want the oldest ready one, [1]", picked)
	}
	// Shed once: it no longer counts as held though its client has not gone yet.
	if s2.Held() != 3 {
		t.Fatalf("held %d, want 3", s2.Held())
	}
	s2.Step()
	if s2.Step() {
		t.Fatal("shed below the limit")
	}
}

// TestConverges: two replicas behind a round-robin balancer, every client connected while one
// was down. Each shed client reconnects through the balancer (to either replica), and the
// replicas even out within their limits in about (excess) / rate seconds, however the
// balancer places the reconnects.
func TestConverges(t *testing.T) {
	const clients = 200
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	o := Options{Replicas: 2, Expected: clients, Slack: 0.1, Floor: 5, Rate: 1, MinAge: 10 * time.Second,
		OnPause: func(d time.Duration, shed, arrived int) {
			t.Errorf("paused %v after %d sheds and %d arrivals, though half of them went to the other replica", d, shed, arrived)
		}}
	a, b := newReplica(clk, o), newReplica(clk, o)
	next := 0
	var reconnect func()
	reconnect = func() { // the balancer, round robin
		next++
		if next%2 == 0 {
			a.open(reconnect)
		} else {
			b.open(reconnect)
		}
	}
	for range clients {
		a.open(reconnect)
	}
	clk.Step(time.Minute)
	seconds := 0
	for ; a.s.Held() > a.s.Limit() || b.s.Held() > b.s.Limit(); seconds++ {
		if seconds > 600 {
			t.Fatalf("not even after %d s: %d and %d, limit %d", seconds, a.s.Held(), b.s.Held(), a.s.Limit())
		}
		clk.Step(time.Second)
		a.s.Step()
		b.s.Step()
	}
	if a.s.Held()+b.s.Held() != clients {
		t.Fatalf("held %d + %d, want %d in all", a.s.Held(), b.s.Held(), clients)
	}
	// An excess of 90 over its limit of 110, half of the reconnects back to it: about 180 s.
	t.Logf("even after %d s: %d and %d (limit %d)", seconds, a.s.Held(), b.s.Held(), a.s.Limit())
	if seconds > 250 {
		t.Fatalf("took %d s, want about 180", seconds)
	}
}

func waitTicker(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("Run never made its ticker")
		}
		time.Sleep(time.Millisecond)
	}
}

// waitHeld waits for Run's goroutine to take the tick the clock sent.
func waitHeld(t *testing.T, s *Shedder, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.Held() != want {
		if time.Now().After(deadline) {
			t.Fatalf("held %d, want %d", s.Held(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPausesWhenShedConnectionsComeBack: with the other replica down, every connection shed
// comes back at once. After a round of RoundSheds the shedder pauses, twice as long after each
// round that moved nothing, up to MaxPause; the connections shed stay bounded by a round per
// pause, not one a second for as long as the other replica is away.
func TestPausesWhenShedConnectionsComeBack(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	var pauses []time.Duration
	r := newReplica(clk, Options{Replicas: 2, Expected: 20, Floor: 0, Rate: 1,
		OnPause: func(d time.Duration, shed, arrived int) {
			if shed != RoundSheds || arrived != RoundSheds {
				t.Errorf("paused after %d sheds and %d arrivals, want %d and %d", shed, arrived, RoundSheds, RoundSheds)
			}
			pauses = append(pauses, d)
		}})
	var back func()
	back = func() { r.open(back) } // the balancer has no other replica
	for range 20 {
		r.open(back)
	}
	shed := 0
	start := clk.Now()
	for clk.Since(start) < time.Hour {
		clk.Step(time.Second)
		if r.s.Step() {
			shed++
		}
	}
	want := []time.Duration{FirstPause, 2 * FirstPause, 4 * FirstPause, 8 * FirstPause, 16 * FirstPause, MaxPause}
	if len(pauses) < len(want) {
		t.Fatalf("pauses %v, want them to begin %v", pauses, want)
	}
	for i, d := range want {
		if pauses[i] != d {
			t.Fatalf("pauses %v, want them to begin %v", pauses, want)
		}
	}
	if r.s.Held() != 20 || shed > 12*RoundSheds {
		t.Fatalf("held %d, shed %d in an hour; want all 20 held and at most a round per pause", r.s.Held(), shed)
	}
	t.Logf("an hour with the other replica down: %d shed, pauses %v", shed, pauses)
}
