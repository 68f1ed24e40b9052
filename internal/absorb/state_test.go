package absorb

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	testclock "k8s.io/utils/clock/testing"

	"github.com/watchsan/watchsan/internal/stream"
)

// TestStateAccountsInPlaceUpdates: an object's next frame overwrites the one held when it fits
// (Observe), a longer one replaces it, a uid change replaces it; through all of them the state
// holds exactly the newest frame of each object, and what it counts against its budget is the
// sum of its objects' costs by capacity, all of it given back when it is freed.
func TestStateAccountsInPlaceUpdates(t *testing.T) {
	b := NewBudget(1<<20, 1<<20, nil, nil)
	s := NewState(b, stream.JSON)
	events := []string{
		cmU("ADDED", "a", "u1", "10"),
		cmU("ADDED", "b", "u2", "11"),
		strings.Replace(cmU("MODIFIED", "a", "u1", "12"), `"v":"12"`, `"v":"12`+strings.Repeat("x", 200)+`"`, 1), // longer
		cmU("MODIFIED", "a", "u1", "13"), // shorter: in place
		cmU("MODIFIED", "b", "u3", "14"), // another uid under the same key
		cmU("DELETED", "b", "u3", "15"),
		cmU("ADDED", "c", "u4", "16"),
	}
	for i, e := range events {
		ev := readEvent(t, e)
		if !s.Observe(ev) {
			t.Fatalf("event %d: the state was dropped: %s", i, s.dropped)
		}
		var sum int64
		for k, o := range s.objs {
			sum += objCost(k, o)
		}
		if s.bytes != sum || b.held.Load() != sum {
			t.Fatalf("after event %d: the state counts %d bytes and the budget holds %d, want both %d", i, s.bytes, b.held.Load(), sum)
		}
	}
	want := map[string]string{"d/a": cmU("MODIFIED", "a", "u1", "13"), "d/c": cmU("ADDED", "c", "u4", "16")}
	if len(s.objs) != len(want) {
		t.Fatalf("the state holds %d objects, want %d", len(s.objs), len(want))
	}
	for k, frame := range want {
		o := s.objs[k]
		if o == nil || !bytes.Equal(o.frame, []byte(frame)) {
			t.Fatalf("the state's %s is %v, want the frame %q", k, o, frame)
		}
	}
	if o := s.objs["d/a"]; o.rv != 13 || cap(o.frame) <= len(o.frame) {
		t.Errorf("d/a: rv %d, frame len %d cap %d: want rv 13 and the longer frame's buffer kept", o.rv, len(o.frame), cap(o.frame))
	}
	s.Free()
	if n := b.held.Load(); n != 0 {
		t.Errorf("the budget holds %d bytes after the state was freed, want 0", n)
	}
}

func readEvent(t *testing.T, frame string) *stream.Event {
	t.Helper()
	ev, err := ReadOne(stream.JSON, []byte(frame), 1<<20)
	if err != nil {
		t.Fatalf("reading %q: %v", frame, err)
	}
	return ev
}

// cmU is a watch event of the configmap name with uid uid at rv.
func cmU(typ, name, uid, rv string) string {
	return fmt.Sprintf(`{"type":%q,"object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":%q,"namespace":"d","uid":%q,"resourceVersion":%q},"data":{"v":%q}}}`+"\n", typ, name, uid, rv, rv)
}

// The budgets are real bounds: a state never holds more than its feed's budget, the states
// together never more than the total, an object's Overhead counted, and what a dropped or
// ended state held is given back.
func TestStateBudgetsHold(t *testing.T) {
	b := NewBudget(2000, 3000, nil, nil)
	s1, s2 := NewState(b, stream.JSON), NewState(b, stream.JSON)
	ev := func(typ, name, rv string) *stream.Event {
		e, err := ReadOne(stream.JSON, []byte(cmU(typ, name, "u"+name, rv)), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	for i := 0; i < 100 && s1.dropped == ""; i++ {
		s1.Observe(ev("ADDED", fmt.Sprint("a", i), fmt.Sprint(10+i)))
		if s1.dropped == "" && (s1.bytes > b.perFeed || b.held.Load() > b.total) {
			t.Fatalf("state holds %d bytes (all: %d), over its budget", s1.bytes, b.held.Load())
		}
		if s1.dropped == "" && s1.bytes < int64(len(s1.objs))*(Overhead+int64(len(ev("ADDED", "a1", "11").Raw))) {
			t.Fatalf("state counts %d bytes for %d objects: their frames and Overhead not counted", s1.bytes, len(s1.objs))
		}
	}
	if s1.dropped != OverBudget || s1.objs != nil || s1.bytes != 0 {
		t.Fatalf("a state over its feed's budget: dropped %q, %d objects, %d bytes: want dropped over-budget, nothing held", s1.dropped, len(s1.objs), s1.bytes)
	}
	if b.held.Load() != 0 {
		t.Fatalf("the budget holds %d bytes after the only state was dropped", b.held.Load())
	}
	// Two states under their own budget together pass the total: the second is dropped.
	s1 = NewState(b, stream.JSON)
	for i := 0; i < 6; i++ {
		s1.Observe(ev("ADDED", fmt.Sprint("a", i), fmt.Sprint(10+i)))
	}
	for i := 0; i < 100 && s2.dropped == ""; i++ {
		s2.Observe(ev("ADDED", fmt.Sprint("b", i), fmt.Sprint(10+i)))
		if b.held.Load() > b.total {
			t.Fatalf("the states hold %d bytes, over the total %d", b.held.Load(), b.total)
		}
	}
	if s1.dropped != "" || s2.dropped != OverBudget {
		t.Fatalf("dropped %q and %q: want the second state over the total dropped", s1.dropped, s2.dropped)
	}
	held := b.held.Load()
	s1.Observe(ev("DELETED", "a0", "30"))
	if b.held.Load() >= held || len(s1.objs) != 5 {
		t.Fatalf("a delete gave back nothing (%d -> %d bytes, %d objects)", held, b.held.Load(), len(s1.objs))
	}
	s1.Free()
	if b.held.Load() != 0 {
		t.Fatalf("the budget holds %d bytes after every state ended", b.held.Load())
	}
}

// A parked entry is counted in the budget on its own, not only the state it holds: an empty
// state's entry costs its key and Overhead until adopted or expired, and with the budget
// spent nothing is parked (the state is freed).
func TestParkedEntryIsCounted(t *testing.T) {
	clk := testclock.NewFakeClock(time.Unix(1e9, 0))
	p := NewParked(clk, DefaultParkTime)
	b := NewBudget(1<<20, 1<<20, nil, nil)
	s := NewState(b, stream.JSON)
	p.Park("scope", "5", s)
	if want := int64(len("scope\x00rv=5")) + Overhead; b.held.Load() != want || p.Len() != 1 {
		t.Fatalf("an empty state parked: %d bytes held, %d parked; want %d and 1", b.held.Load(), p.Len(), want)
	}
	if got := p.Adopt("scope", "5"); got != s || b.held.Load() != 0 {
		t.Fatalf("adopted %p (want %p), %d bytes held after; want 0", got, s, b.held.Load())
	}
	p.Park("scope", "6", s)
	clk.Step(DefaultParkTime)
	if p.Len() != 0 || b.held.Load() != 0 {
		t.Fatalf("after the park time: %d parked, %d bytes held; want none", p.Len(), b.held.Load())
	}
	tight := NewBudget(1<<20, 10, nil, nil)
	s2 := NewState(tight, stream.JSON)
	p.Park("scope", "7", s2)
	if p.Len() != 0 || tight.held.Load() != 0 || s2.dropped == "" {
		t.Fatalf("over the budget: %d parked, %d bytes held, dropped %q; want nothing parked and the state freed", p.Len(), tight.held.Load(), s2.dropped)
	}
}
