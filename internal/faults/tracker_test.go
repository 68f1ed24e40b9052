package faults

import (
	"testing"

	"github.com/watchsan/watchsan/internal/stream"
)

func ev(uid, rv string) *stream.Event {
	e := &stream.Event{Type: stream.Modified, UID: uid, Name: "n-" + uid, Namespace: "ns"}
	e.RV = rv
	e.RVInt, e.RVIsInt = stream.ParseRV(rv)
	return e
}

func TestTrackerKeepsHighestAndEvictsOldest(t *testing.T) {
	tr := tracker{max: 2}
	tr.observe(ev("a", "20"))
	tr.observe(ev("a", "10")) // a lagging watch's older event
	if rv, ok := tr.prev(ev("a", "30")); !ok || rv != "20" {
		t.Errorf("prev(a) = %q, %v; want 20", rv, ok)
	}
	if _, ok := tr.prev(ev("a", "20")); ok {
		t.Error("prev returned a resourceVersion not below the delete's")
	}
	tr.observe(ev("b", "21"))
	tr.observe(ev("c", "22")) // evicts a, the oldest
	if _, ok := tr.prev(ev("a", "30")); ok {
		t.Error("a still remembered beyond the bound")
	}
	for _, uid := range []string{"b", "c"} {
		if _, ok := tr.prev(ev(uid, "30")); !ok {
			t.Errorf("%s forgotten", uid)
		}
	}
	if len(tr.m) != 2 || len(tr.order) != 2 {
		t.Errorf("%d entries, %d ordered; want 2", len(tr.m), len(tr.order))
	}
	if !tr.firstEnd(ev("c", "23")) || tr.firstEnd(ev("c", "23")) {
		t.Error("firstEnd is not true exactly once")
	}
}
