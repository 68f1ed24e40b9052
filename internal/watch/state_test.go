package watch

import (
	"bytes"
	"strings"
	"testing"

	"github.com/watchsan/watchsan/internal/stream"
)

// TestStateAccountsInPlaceUpdates: an object's next frame overwrites the one held when it fits
// (observe), a longer one replaces it, a uid change replaces it; through all of them the state
// holds exactly the newest frame of each object, and what it counts against its budget is the
// sum of its objects' costs by capacity, all of it given back when it is freed.
func TestStateAccountsInPlaceUpdates(t *testing.T) {
	b := &stateBudget{perFeed: 1 << 20, total: 1 << 20}
	s := newFeedState(b, stream.JSON)
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
		if !s.observe(ev) {
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
	s.free()
	if n := b.held.Load(); n != 0 {
		t.Errorf("the budget holds %d bytes after the state was freed, want 0", n)
	}
}

func readEvent(t *testing.T, frame string) *stream.Event {
	t.Helper()
	ev, err := readOne(stream.JSON, []byte(frame), 1<<20)
	if err != nil {
		t.Fatalf("reading %q: %v", frame, err)
	}
	return ev
}
