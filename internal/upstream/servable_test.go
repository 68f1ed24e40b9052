package upstream

import (
	"net/url"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestTooOldFloor(t *testing.T) {
	for msg, want := range map[string]uint64{
		"too old resource version: 215 (219)":                    219,
		"The resourceVersion for the provided watch is too old.": 0,
		"too old resource version: 5":                            0,
	} {
		got, ok := TooOldFloor(msg)
		if got != want || ok != (want > 0) {
			t.Errorf("TooOldFloor(%q) = %d, %v; want %d", msg, got, ok, want)
		}
	}
}

// a watch's resume point goes to a backend known unable to serve it only
// when no usable backend may; floors only rise and are per resource.
func TestPickServesTheResumePoint(t *testing.T) {
	p, err := NewPool([]*url.URL{{Scheme: "http", Host: "a"}, {Scheme: "http", Host: "b"}}, PoolOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a, b := p.Backends()[0], p.Backends()[1]
	a.hc.state.Store(int32(Healthy))
	b.hc.state.Store(int32(Healthy))
	lease(p, b, "", 0, true) // b has more watches: picked only if a cannot serve
	a.NoteTooOld("configmaps", 219)
	a.NoteTooOld("configmaps", 200) // floors only rise
	plan := Plan{Watch: true, Resource: "configmaps", From: 215}
	for range 5 {
		if got := p.pickServing(true, nil, plan.servable()); got != b {
			t.Fatalf("picked %v for a resume point below a's floor, want b", got)
		}
	}
	plan.From = 219
	if got := p.pickServing(true, nil, plan.servable()); got != a {
		t.Fatalf("picked %v from a's floor itself, want a (fewest watches)", got)
	}
	plan.From, plan.Resource = 215, "pods"
	if got := p.pickServing(true, nil, plan.servable()); got != a {
		t.Fatalf("picked %v for another resource, want a", got)
	}
	b.NoteTooOld("configmaps", 300)
	plan.Resource = "configmaps"
	if got := p.pickServing(true, nil, plan.servable()); got == nil {
		t.Fatal("no backend can serve: want one anyway (the 410 is then the client's)")
	}
	if targets, blocked := p.Backends()[1].leases.snapshot()[0].MoveTargets(MoveDegraded, "configmaps", 215); len(targets) != 0 || !blocked {
		t.Fatalf("move targets %v, blocked %v; want none, blocked by a's floor", targets, blocked)
	}
}

// a make-before-break lease is asked, not cut; a failed move holds it
// for the time its owner says, on the Pool's clock, and the mover does not ask again
// meanwhile.
func TestMoveHandlerAskedAndHeld(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	p, err := NewPool([]*url.URL{{Scheme: "http", Host: "a"}, {Scheme: "http", Host: "b"}}, PoolOptions{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	a := p.Backends()[0]
	a.hc.state.Store(int32(Degraded))
	p.Backends()[1].hc.state.Store(int32(Healthy))
	cut := false
	l := p.newLease(a, Plan{From: 7, MakeBeforeBreak: true}, func(error) { cut = true })
	asked := l.Asked()
	l.SetMovable(true)
	k := &bucket{rate: -1}
	p.drain(p.Backends(), time.Now(), k)
	if r := <-asked; r != MoveDegraded {
		t.Fatalf("asked to move for %v, want degraded", r)
	}
	if cut {
		t.Fatal("the Pool cut a make-before-break lease")
	}
	if a.leases.moving.Load() != 1 {
		t.Fatal("a move asked for is not in transit")
	}
	p.drain(p.Backends(), time.Now(), k) // asked once at a time
	l.MoveFailed(time.Hour)
	if a.leases.moving.Load() != 0 {
		t.Fatal("a failed move is still in transit")
	}
	clk.SetTime(clk.Now().Add(59 * time.Minute))
	p.drain(p.Backends(), time.Now(), k)
	select {
	case r := <-asked:
		t.Fatalf("asked again (%v) while held", r)
	default:
	}
	clk.SetTime(clk.Now().Add(2 * time.Minute))
	p.drain(p.Backends(), time.Now(), k)
	select {
	case r := <-asked:
		if r != MoveDegraded {
			t.Fatalf("asked again for %v, want degraded", r)
		}
	default: // the request is in the channel when the Pool's drain returns: it starts nothing
		t.Fatal("not asked again once the hold was over")
	}
	l.Cut(MoveDegraded)
	if !cut {
		t.Fatal("Cut did not end the attempt")
	}
}
