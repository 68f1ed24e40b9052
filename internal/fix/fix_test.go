package fix

import (
	"testing"

	"github.com/watchsan/watchsan/internal/stream"
)

// ev builds an event; uid "" and name "" leave those out.
func ev(typ, rv, uid, ns, name string) *stream.Event {
	e := &stream.Event{Type: typ, UID: uid, Namespace: ns, Name: name}
	e.SetRV(rv)
	return e
}

func obj(typ, rv, uid string) *stream.Event { return ev(typ, rv, uid, "default", "o-"+uid) }

func bookmark(rv string) *stream.Event { return ev(stream.Bookmark, rv, "", "", "") }

func endBookmark(rv string) *stream.Event {
	e := bookmark(rv)
	e.InitialEventsEnd = true
	return e
}

// step is one event and what Repair must decide for it.
type step struct {
	ev     *stream.Event
	action Action
	rv     string // for Rewrite
	reason Reason
	// initial is InInitialPhase after the event.
	initial bool
}

func pass(e *stream.Event, r Reason) step { return step{ev: e, action: Pass, reason: r} }
func drop(e *stream.Event, r Reason) step { return step{ev: e, action: Drop, reason: r} }
func rewrite(e *stream.Event, rv string, r Reason) step {
	return step{ev: e, action: Rewrite, rv: rv, reason: r}
}
func initialPass(e *stream.Event) step { return step{ev: e, reason: ReasonInitial, initial: true} }

func TestDecideRules(t *testing.T) {
	tests := []struct {
		name          string
		opts          Options
		startsInitial bool
		steps         []step
		last          string // LastDelivered at the end, in Repair mode
	}{
		{
			name:          "initial ADDED in any order, ended by the initial-events-end bookmark",
			opts:          Options{StartRV: "0"},
			startsInitial: true,
			steps: []step{
				initialPass(obj(stream.Added, "15", "a")),
				initialPass(obj(stream.Added, "3", "b")),
				initialPass(obj(stream.Added, "9", "c")),
				pass(endBookmark("20"), ReasonInitialEventsEnd),
				pass(obj(stream.Modified, "21", "a"), ReasonOK),
				drop(obj(stream.Modified, "19", "b"), ReasonReplay),
				drop(obj(stream.Added, "21", "d"), ReasonReplay),
			},
			last: "21",
		},
		{
			name:          "initial-events-end bookmark below the highest initial RV is rewritten, never dropped",
			opts:          Options{StartRV: ""},
			startsInitial: true,
			steps: []step{
				initialPass(obj(stream.Added, "30", "a")),
				initialPass(obj(stream.Added, "10", "b")),
				rewrite(endBookmark("20"), "30", ReasonInitialEventsEndRegressed),
				drop(obj(stream.Modified, "25", "b"), ReasonReplay),
				pass(obj(stream.Modified, "31", "b"), ReasonOK),
			},
			last: "31",
		},
		{
			name:          "initial phase ends at the first non-ADDED, judged against the highest RV seen",
			opts:          Options{StartRV: "0"},
			startsInitial: true,
			steps: []step{
				initialPass(obj(stream.Added, "5", "a")),
				initialPass(obj(stream.Added, "9", "b")),
				drop(obj(stream.Modified, "7", "a"), ReasonReplay),
				drop(obj(stream.Added, "8", "c"), ReasonReplay), // no longer initial
				pass(obj(stream.Modified, "10", "a"), ReasonOK),
			},
			last: "10",
		},
		{
			name:          "initial phase ended by a regressed DELETED rewrites it above the baseline",
			opts:          Options{StartRV: "0"},
			startsInitial: true,
			steps: []step{
				initialPass(obj(stream.Added, "5", "a")),
				initialPass(obj(stream.Added, "9", "b")),
				rewrite(obj(stream.Deleted, "5", "a"), "10", ReasonDeleteRegressed),
			},
			last: "10",
		},
		{
			name:          "initial phase ended by a plain bookmark below the baseline drops it",
			opts:          Options{StartRV: "0"},
			startsInitial: true,
			steps: []step{
				initialPass(obj(stream.Added, "9", "a")),
				drop(bookmark("8"), ReasonBookmarkRegressed),
				pass(bookmark("9"), ReasonOK),
			},
			last: "9",
		},
		{
			name:          "sendInitialEvents starts the initial phase whatever the start RV",
			opts:          Options{StartRV: "100", SendInitialEvents: true},
			startsInitial: true,
			steps: []step{
				initialPass(obj(stream.Added, "50", "a")),
				initialPass(obj(stream.Added, "120", "b")),
				initialPass(obj(stream.Added, "7", "c")),
				pass(endBookmark("120"), ReasonInitialEventsEnd),
				pass(bookmark("120"), ReasonOK),
				pass(obj(stream.Deleted, "121", "c"), ReasonOK),
			},
			last: "121",
		},
		{
			name: "steady phase from N: strict order, replays dropped, deletes rewritten to last+1",
			opts: Options{StartRV: "10"},
			steps: []step{
				drop(obj(stream.Modified, "10", "a"), ReasonReplay),
				pass(obj(stream.Modified, "11", "a"), ReasonOK),
				drop(obj(stream.Added, "11", "b"), ReasonReplay),
				pass(bookmark("11"), ReasonOK),
				drop(bookmark("10"), ReasonBookmarkRegressed),
				rewrite(obj(stream.Deleted, "11", "a"), "12", ReasonDeleteRegressed),
				rewrite(obj(stream.Deleted, "3", "b"), "13", ReasonDeleteRegressed),
				drop(obj(stream.Modified, "13", "c"), ReasonReplay),
				pass(obj(stream.Modified, "14", "c"), ReasonOK),
				pass(obj(stream.Deleted, "15", "c"), ReasonOK),
			},
			last: "15",
		},
		{
			name: "ERROR and unknown types pass and change nothing",
			opts: Options{StartRV: "10"},
			steps: []step{
				pass(ev(stream.Error, "", "", "", ""), ReasonErrorEvent),
				pass(ev(stream.Error, "3", "", "", ""), ReasonErrorEvent),
				pass(ev("SURPRISE", "2", "x", "", "x"), ReasonUnknownType),
				drop(obj(stream.Modified, "10", "a"), ReasonReplay),
			},
			last: "10",
		},
		{
			name:          "ERROR does not end the initial phase",
			opts:          Options{StartRV: "0"},
			startsInitial: true,
			steps: []step{
				initialPass(obj(stream.Added, "5", "a")),
				{ev: ev(stream.Error, "", "", "", ""), reason: ReasonErrorEvent, initial: true},
				initialPass(obj(stream.Added, "3", "b")),
			},
			last: "0",
		},
		{
			name: "non-integer RVs pass untouched and are never compared; the integer watermark stays",
			opts: Options{StartRV: "10"},
			steps: []step{
				pass(obj(stream.Modified, "abc", "a"), ReasonNotInteger),
				pass(obj(stream.Modified, "007", "a"), ReasonNotInteger),
				drop(obj(stream.Modified, "9", "a"), ReasonReplay),
				pass(obj(stream.Modified, "11", "a"), ReasonOK),
				pass(bookmark("zzz"), ReasonNotInteger),
			},
			last: "zzz",
		},
		{
			name:          "non-integer ADDED in the initial phase",
			opts:          Options{StartRV: "0"},
			startsInitial: true,
			steps: []step{
				{ev: obj(stream.Added, "x1", "a"), reason: ReasonNotInteger, initial: true},
				pass(obj(stream.Modified, "5", "a"), ReasonNoBaseline),
				drop(obj(stream.Modified, "4", "a"), ReasonReplay),
			},
			last: "5",
		},
		{
			name: "opaque start RV: the first integer RV becomes the baseline",
			opts: Options{StartRV: "xyz"},
			steps: []step{
				pass(obj(stream.Modified, "5", "a"), ReasonNoBaseline),
				drop(obj(stream.Modified, "4", "a"), ReasonReplay),
				rewrite(obj(stream.Deleted, "5", "a"), "6", ReasonDeleteRegressed),
			},
			last: "6",
		},
		{
			name: "a second DELETED of the same UID is dropped whatever its RV",
			opts: Options{StartRV: "10"},
			steps: []step{
				pass(obj(stream.Deleted, "11", "a"), ReasonOK),
				drop(obj(stream.Deleted, "12", "a"), ReasonDeleteDelivered),
				drop(obj(stream.Deleted, "5", "a"), ReasonDeleteDelivered),
				drop(obj(stream.Deleted, "nope", "a"), ReasonDeleteDelivered),
				rewrite(obj(stream.Deleted, "4", "b"), "12", ReasonDeleteRegressed),
				drop(obj(stream.Deleted, "4", "b"), ReasonDeleteDelivered),
				drop(obj(stream.Deleted, "20", "b"), ReasonDeleteDelivered),
				pass(obj(stream.Modified, "20", "c"), ReasonOK),
			},
			last: "20",
		},
		{
			name: "without a UID, namespace/name keys deletes until the object is added again",
			opts: Options{StartRV: "10"},
			steps: []step{
				pass(ev(stream.Deleted, "11", "", "ns", "x"), ReasonOK),
				drop(ev(stream.Deleted, "12", "", "ns", "x"), ReasonDeleteDelivered),
				pass(ev(stream.Deleted, "12", "", "other", "x"), ReasonOK),
				drop(ev(stream.Added, "5", "", "ns", "x"), ReasonReplay), // a replay: no new life
				drop(ev(stream.Deleted, "13", "", "ns", "x"), ReasonDeleteDelivered),
				pass(ev(stream.Added, "14", "", "ns", "x"), ReasonOK),
				pass(ev(stream.Deleted, "15", "", "ns", "x"), ReasonOK),
				drop(ev(stream.Deleted, "16", "", "ns", "x"), ReasonDeleteDelivered),
			},
			last: "15",
		},
		{
			name: "a DELETED naming no object is never deduplicated",
			opts: Options{StartRV: "10"},
			steps: []step{
				pass(ev(stream.Deleted, "11", "", "", ""), ReasonOK),
				pass(ev(stream.Deleted, "12", "", "", ""), ReasonOK),
				rewrite(ev(stream.Deleted, "12", "", "", ""), "13", ReasonDeleteRegressed),
			},
			last: "13",
		},
		{
			name: "initial-events-end bookmark met in the steady phase is never dropped",
			opts: Options{StartRV: "10"},
			steps: []step{
				pass(obj(stream.Modified, "12", "a"), ReasonOK),
				rewrite(endBookmark("11"), "12", ReasonInitialEventsEndRegressed),
				pass(endBookmark("12"), ReasonInitialEventsEnd),
				pass(endBookmark("13"), ReasonInitialEventsEnd),
				pass(endBookmark("q"), ReasonNotInteger),
			},
			last: "q",
		},
		{
			name: "a rewrite past the largest uint64 is not attempted",
			opts: Options{StartRV: "18446744073709551615"},
			steps: []step{
				pass(obj(stream.Deleted, "5", "a"), ReasonOverflow),
				drop(obj(stream.Modified, "6", "b"), ReasonReplay),
			},
			last: "5",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			repair := NewStream(tt.opts)
			obsOpts := tt.opts
			obsOpts.Mode = Observe
			observe := NewStream(obsOpts)
			if repair.InInitialPhase() != tt.startsInitial {
				t.Fatalf("InInitialPhase at start = %v, want %v", repair.InInitialPhase(), tt.startsInitial)
			}
			if got := repair.LastDelivered(); got != tt.opts.StartRV {
				t.Fatalf("LastDelivered at start = %q, want StartRV %q", got, tt.opts.StartRV)
			}
			if got := repair.HasResumePoint(); got != (tt.opts.StartRV != "") {
				t.Fatalf("HasResumePoint at start = %v with StartRV %q", got, tt.opts.StartRV)
			}
			var want Counts
			for i, st := range tt.steps {
				d := repair.Decide(st.ev)
				if d.Action != st.action || d.Would != st.action || d.Reason != st.reason || d.RV != st.rv {
					t.Fatalf("step %d (%s %s): got %v/%v %q reason %v, want %v %q reason %v",
						i, st.ev.Type, st.ev.RV, d.Action, d.Would, d.RV, d.Reason, st.action, st.rv, st.reason)
				}
				if st.action == Rewrite && d.RV != "" {
					if n, ok := stream.ParseRV(d.RV); !ok || n != d.RVInt {
						t.Fatalf("step %d: RV %q and RVInt %d disagree", i, d.RV, d.RVInt)
					}
				}
				if repair.InInitialPhase() != st.initial {
					t.Fatalf("step %d: InInitialPhase = %v, want %v", i, repair.InInitialPhase(), st.initial)
				}
				if got, want := repair.HasResumePoint(), repair.LastDelivered() != ""; got != want {
					t.Fatalf("step %d: HasResumePoint = %v with LastDelivered %q", i, got, repair.LastDelivered())
				}
				o := observe.Decide(st.ev)
				if o.Action != Pass || o.Would != d.Would || o.Reason != d.Reason || o.RV != d.RV {
					t.Fatalf("step %d: Observe decided %+v, Repair %+v", i, o, d)
				}
				want.Events++
				switch st.action {
				case Rewrite:
					want.Rewritten++
				case Drop:
					want.Dropped++
				}
				if st.reason == ReasonNotInteger {
					want.NotInteger++
				}
			}
			if got := repair.LastDelivered(); got != tt.last {
				t.Errorf("LastDelivered = %q, want %q", got, tt.last)
			}
			if got := repair.Counts(); got != want {
				t.Errorf("Counts = %+v, want %+v", got, want)
			}
			if got := observe.Counts(); got != want {
				t.Errorf("Observe Counts = %+v, want %+v", got, want)
			}
			nreg := int(want.Rewritten + want.Dropped)
			if nreg > MaxDetails {
				nreg = MaxDetails
			}
			if got := len(repair.Regressions()); got != nreg {
				t.Errorf("%d regression details, want %d", got, nreg)
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	for s, want := range map[string]Mode{"repair": Repair, "observe": Observe} {
		m, err := ParseMode(s)
		if err != nil || m != want || m.String() != s {
			t.Errorf("ParseMode(%q) = %v, %v", s, m, err)
		}
	}
	for _, s := range []string{"", "Repair", "off"} {
		if _, err := ParseMode(s); err == nil {
			t.Errorf("ParseMode(%q) accepted", s)
		}
	}
	var zero Mode
	if zero != Repair {
		t.Error("the zero Mode is not Repair")
	}
}

func TestStrings(t *testing.T) {
	if Pass.String() != "passed" || Rewrite.String() != "rewritten" || Drop.String() != "dropped" {
		t.Error("Action strings are the metric label values passed|rewritten|dropped")
	}
	seen := map[string]bool{}
	for r := Reason(0); r < numReasons; r++ {
		s := r.String()
		if s == "" || seen[s] {
			t.Errorf("Reason %d has the empty or duplicate name %q", r, s)
		}
		seen[s] = true
	}
	if ReasonOK.String() != "ok" || ReasonNotInteger.String() != "rv-not-integer" {
		t.Error("reason names changed")
	}
}

// TestObserveLastDelivered: in Observe mode the resume point is what the client really got.
func TestObserveLastDelivered(t *testing.T) {
	s := NewStream(Options{StartRV: "10", Mode: Observe})
	s.Decide(obj(stream.Modified, "12", "a"))
	d := s.Decide(obj(stream.Deleted, "10", "a"))
	if d.Action != Pass || d.Would != Rewrite || d.RV != "13" {
		t.Fatalf("Observe decision %+v", d)
	}
	if got := s.LastDelivered(); got != "10" {
		t.Errorf("Observe LastDelivered = %q, want the RV really sent, 10", got)
	}
	// Repair would have delivered 13, so the simulation goes on from 13.
	if d := s.Decide(obj(stream.Modified, "13", "b")); d.Would != Drop {
		t.Errorf("Observe after a would-be rewrite to 13: %+v, want Would Drop", d)
	}
}

// TestLastDeliveredDoesNotAlias: the resume point survives the reader reusing its buffer.
func TestLastDeliveredDoesNotAlias(t *testing.T) {
	s := NewStream(Options{StartRV: "10"})
	buf := []byte("opaque-1")
	e := &stream.Event{Type: stream.Modified, RV: string(buf)}
	s.Decide(e)
	copy(buf, "XXXXXXXX")
	if got := s.LastDelivered(); got != "opaque-1" {
		t.Errorf("LastDelivered = %q", got)
	}
}

func TestRegressionDetails(t *testing.T) {
	s := NewStream(Options{StartRV: "12"})
	s.Decide(ev(stream.Deleted, "10", "uid-a", "ns", "a"))
	s.Decide(ev(stream.Modified, "11", "uid-b", "ns", "b"))
	for i := 0; i < 10; i++ {
		s.Decide(bookmark("1"))
	}
	det := s.Regressions()
	if len(det) != MaxDetails {
		t.Fatalf("%d details, want the first %d", len(det), MaxDetails)
	}
	want := RegressionDetail{Type: stream.Deleted, Namespace: "ns", Name: "a", UID: "uid-a", RV: "10",
		Last: "12", Would: Rewrite, Reason: ReasonDeleteRegressed, NewRV: "13"}
	if det[0] != want {
		t.Errorf("detail 0 = %+v, want %+v", det[0], want)
	}
	want = RegressionDetail{Type: stream.Modified, Namespace: "ns", Name: "b", UID: "uid-b", RV: "11",
		Last: "13", Would: Drop, Reason: ReasonReplay}
	if det[1] != want {
		t.Errorf("detail 1 = %+v, want %+v", det[1], want)
	}
	c := s.Counts()
	if c.Events != 12 || c.Rewritten != 1 || c.Dropped != 11 {
		t.Errorf("Counts = %+v", c)
	}
}

func TestTrackedDeletesBound(t *testing.T) {
	s := NewStream(Options{StartRV: "10", TrackedDeletes: 2})
	s.Decide(obj(stream.Deleted, "11", "a"))
	s.Decide(obj(stream.Deleted, "12", "b"))
	if d := s.Decide(obj(stream.Deleted, "13", "a")); d.Action != Drop {
		t.Fatalf("second delete of a within the bound: %+v", d)
	}
	s.Decide(obj(stream.Deleted, "14", "c")) // evicts a
	if d := s.Decide(obj(stream.Deleted, "15", "a")); d.Action != Pass {
		t.Errorf("a was evicted from a set of 2, yet its delete was %+v", d)
	}
	if d := s.Decide(obj(stream.Deleted, "16", "c")); d.Action != Drop {
		t.Errorf("c is still tracked, yet its second delete was %+v", d)
	}
}

// TestDecidePassAllocs: the pass path allocates nothing.
func TestDecidePassAllocs(t *testing.T) {
	s := NewStream(Options{StartRV: "1"})
	s.Decide(obj(stream.Deleted, "2", "z")) // a non-empty delete set is on the path too
	e := ev(stream.Modified, "3", "uid", "ns", "name")
	noUID := ev(stream.Added, "3", "", "ns", "name")
	b := bookmark("3")
	n := uint64(3)
	allocs := testing.AllocsPerRun(1000, func() {
		n++
		e.RVInt = n
		s.Decide(e)
		n++
		noUID.RVInt = n
		s.Decide(noUID)
		b.RVInt = n
		s.Decide(b)
		s.Decide(ev0)
	})
	if allocs != 0 {
		t.Errorf("pass path: %v allocations per run, want 0", allocs)
	}
	s0 := NewStream(Options{StartRV: "0"})
	allocs = testing.AllocsPerRun(1000, func() { s0.Decide(noUID) })
	if allocs != 0 {
		t.Errorf("initial phase: %v allocations per run, want 0", allocs)
	}
}

var ev0 = &stream.Event{Type: stream.Error}

// TestPassAllTracksPhaseAndResumePointOnly: an exempt resource's stream passes everything,
// judges and counts nothing, and still owns the initial phase and the resume point.
func TestPassAllTracksPhaseAndResumePointOnly(t *testing.T) {
	mem := NewDeleteMemory(10, 0, nil)
	s := NewStream(Options{Scope: "s", StartRV: "0", Mode: PassAll, Memory: mem})
	steps := []struct {
		e       *stream.Event
		initial bool
		last    string
	}{
		{ev(stream.Added, "12", "a", "d", "a"), true, "0"},
		{ev(stream.Added, "10", "b", "d", "b"), true, "0"},
		{ev(stream.Modified, "13", "a", "d", "a"), false, "13"},
		{ev(stream.Deleted, "12", "a", "d", "a"), false, "12"}, // a regression: passed as sent
		{ev(stream.Modified, "11", "b", "d", "b"), false, "11"},
	}
	for i, st := range steps {
		d := s.Decide(st.e)
		if d.Action != Pass || d.Would != Pass {
			t.Fatalf("step %d: %+v, want Pass", i, d)
		}
		if s.InInitialPhase() != st.initial || s.LastDelivered() != st.last {
			t.Fatalf("step %d: initial %v last %q, want %v %q", i, s.InInitialPhase(), s.LastDelivered(), st.initial, st.last)
		}
	}
	if c := s.Counts(); c.Rewritten+c.Dropped != 0 || len(s.Regressions()) != 0 || mem.Len() != 0 {
		t.Fatalf("PassAll judged something: %+v, %d details, %d remembered", c, len(s.Regressions()), mem.Len())
	}
}

// An absorbed delete passes at the last delivered RV, moves nothing, and the absorb's ADDED
// at last+1 still passes; the real delete, replayed later, is dropped; anything else goes to
// Decide's rules.
func TestDecideAbsorbedDelete(t *testing.T) {
	s := NewStream(Options{StartRV: "10"})
	if d := s.Decide(obj(stream.Modified, "20", "a")); d.Action != Pass {
		t.Fatalf("in-order MODIFIED: %+v", d)
	}
	if d := s.DecideAbsorbedDelete(obj(stream.Deleted, "20", "b")); d.Action != Pass || d.Reason != ReasonAbsorbedDelete {
		t.Fatalf("absorbed delete at the last delivered RV: %+v, want passed (%v)", d, ReasonAbsorbedDelete)
	}
	if got := s.LastDelivered(); got != "20" {
		t.Fatalf("LastDelivered %q after the absorbed delete, want 20", got)
	}
	if d := s.Decide(obj(stream.Added, "21", "c")); d.Action != Pass || d.Reason != ReasonOK {
		t.Fatalf("ADDED at last+1 after an absorbed delete: %+v, want passed", d)
	}
	if d := s.Decide(obj(stream.Deleted, "19", "b")); d.Action != Drop || d.Reason != ReasonDeleteDelivered {
		t.Fatalf("the real delete replayed: %+v, want dropped as delivered", d)
	}
	if d := s.DecideAbsorbedDelete(obj(stream.Deleted, "5", "d")); d.Action != Rewrite || d.RV != "22" {
		t.Fatalf("a delete below the last delivered RV is no absorbed delete: %+v, want rewritten to 22", d)
	}
	if d := s.DecideAbsorbedDelete(obj(stream.Modified, "30", "a")); d.Action != Pass || d.Reason != ReasonOK {
		t.Fatalf("a MODIFIED given to DecideAbsorbedDelete: %+v, want Decide's pass", d)
	}
	if c := s.Counts(); c.Events != 6 {
		t.Fatalf("counted %d events, want 6", c.Events)
	}
}
