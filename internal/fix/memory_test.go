package fix

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/stream"
)

// fakeClock is an injectable now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func expect(t *testing.T, s *Stream, e *stream.Event, action Action, rv string, reason Reason) {
	t.Helper()
	d := s.Decide(e)
	if d.Action != action || d.RV != rv || d.Reason != reason {
		t.Fatalf("%s %s uid=%s: got %v %q (%v), want %v %q (%v)",
			e.Type, e.RV, e.UID, d.Action, d.RV, d.Reason, action, rv, reason)
	}
}

// TestIncident17 replays kubernetes#58545 (docs/design.md section 1a): object a created at 10,
// others at 11 and 12, a deleted and the DELETED carries a's previous RV, 10. The client must
// get it once, at 13; re-watching from 13 with the same scope it must not get it again.
func TestIncident17(t *testing.T) {
	mem := NewDeleteMemory(100, time.Hour, nil)
	const scope = "/api/v1/namespaces/default/services?labelSelector=app%3Dx"

	first := NewStream(Options{Scope: scope, StartRV: "9", Memory: mem})
	expect(t, first, obj(stream.Added, "10", "a"), Pass, "", ReasonOK)
	expect(t, first, obj(stream.Added, "11", "b"), Pass, "", ReasonOK)
	expect(t, first, obj(stream.Added, "12", "c"), Pass, "", ReasonOK)
	expect(t, first, obj(stream.Deleted, "10", "a"), Rewrite, "13", ReasonDeleteRegressed)
	if got := first.LastDelivered(); got != "13" {
		t.Fatalf("LastDelivered after the rewrite = %q, want 13", got)
	}
	if mem.Len() != 1 {
		t.Fatalf("memory holds %d deletes, want 1", mem.Len())
	}
	// The watch goes on: later events pass (the delete's true revision was 13 or more).
	expect(t, first, obj(stream.Modified, "15", "b"), Pass, "", ReasonOK)

	// The client's watch ended right after the delete; it re-watches from 13. The buggy
	// apiserver replays the delete with its stale RV: dropped. What follows passes.
	again := NewStream(Options{Scope: scope, StartRV: "13", Memory: mem})
	expect(t, again, obj(stream.Deleted, "10", "a"), Drop, "", ReasonDeleteRemembered)
	expect(t, again, obj(stream.Modified, "15", "b"), Pass, "", ReasonOK)
	if c := again.Counts(); c.Remembered != 1 || c.Dropped != 1 {
		t.Errorf("Counts = %+v", c)
	}

	// A fixed apiserver would replay it with its true revision: dropped too.
	fixed := NewStream(Options{Scope: scope, StartRV: "13", Memory: mem})
	expect(t, fixed, obj(stream.Deleted, "14", "a"), Drop, "", ReasonDeleteRemembered)

	// Another scope, or another start RV, is another watch: the delete is news there.
	other := NewStream(Options{Scope: scope + "x", StartRV: "13", Memory: mem})
	expect(t, other, obj(stream.Deleted, "10", "a"), Rewrite, "14", ReasonDeleteRegressed)
	from12 := NewStream(Options{Scope: scope, StartRV: "12", Memory: mem})
	expect(t, from12, obj(stream.Deleted, "10", "a"), Rewrite, "13", ReasonDeleteRegressed)
	// Without memory there is nothing to remember.
	bare := NewStream(Options{Scope: scope, StartRV: "13"})
	expect(t, bare, obj(stream.Deleted, "10", "a"), Rewrite, "14", ReasonDeleteRegressed)
	// sendInitialEvents lists the current state: no replay to drop.
	list := NewStream(Options{Scope: scope, StartRV: "13", SendInitialEvents: true, Memory: mem})
	if list.deletes.m != nil {
		t.Error("a sendInitialEvents watch loaded remembered deletes")
	}
}

// TestMemoryChain: a client resuming from the last of a run of rewritten deletes is replayed
// every delete of the run; all are dropped. An in-order event ends the run.
func TestMemoryChain(t *testing.T) {
	mem := NewDeleteMemory(100, time.Hour, nil)
	s := NewStream(Options{Scope: "s", StartRV: "12", Memory: mem})
	expect(t, s, obj(stream.Deleted, "10", "a"), Rewrite, "13", ReasonDeleteRegressed)
	expect(t, s, obj(stream.Deleted, "11", "b"), Rewrite, "14", ReasonDeleteRegressed)

	r := NewStream(Options{Scope: "s", StartRV: "14", Memory: mem})
	expect(t, r, obj(stream.Deleted, "10", "a"), Drop, "", ReasonDeleteRemembered)
	expect(t, r, obj(stream.Deleted, "11", "b"), Drop, "", ReasonDeleteRemembered)
	// This stream rewrites another delete before any in-order event: its record carries the
	// run on, so a client resuming from 15 is spared a, b and c.
	expect(t, r, obj(stream.Deleted, "9", "c"), Rewrite, "15", ReasonDeleteRegressed)
	r2 := NewStream(Options{Scope: "s", StartRV: "15", Memory: mem})
	for _, uid := range []string{"a", "b", "c"} {
		expect(t, r2, obj(stream.Deleted, "9", uid), Drop, "", ReasonDeleteRemembered)
	}

	// A delete naming no object does not break the run.
	expect(t, r, ev(stream.Deleted, "9", "", "", ""), Rewrite, "16", ReasonDeleteRegressed)
	r2 = NewStream(Options{Scope: "s", StartRV: "16", Memory: mem})
	for _, uid := range []string{"a", "b", "c"} {
		expect(t, r2, obj(stream.Deleted, "9", uid), Drop, "", ReasonDeleteRemembered)
	}

	// An in-order event, then a new rewrite: that run starts afresh.
	expect(t, r, obj(stream.Modified, "30", "x"), Pass, "", ReasonOK)
	expect(t, r, obj(stream.Deleted, "8", "d"), Rewrite, "31", ReasonDeleteRegressed)
	r3 := NewStream(Options{Scope: "s", StartRV: "31", Memory: mem})
	expect(t, r3, obj(stream.Deleted, "10", "a"), Rewrite, "32", ReasonDeleteRegressed)
	expect(t, r3, obj(stream.Deleted, "8", "d"), Drop, "", ReasonDeleteRemembered)
}

// TestObserveDoesNotRecord: in Observe mode the client got the wire RV, never the rewrite.
func TestObserveDoesNotRecord(t *testing.T) {
	mem := NewDeleteMemory(100, time.Hour, nil)
	s := NewStream(Options{Scope: "s", StartRV: "12", Memory: mem, Mode: Observe})
	if d := s.Decide(obj(stream.Deleted, "10", "a")); d.Would != Rewrite {
		t.Fatalf("%+v", d)
	}
	if mem.Len() != 0 {
		t.Error("Observe mode recorded a rewrite that never happened")
	}
}

func lookupAll(m *DeleteMemory, scope string, rv uint64) map[string]bool {
	got := map[string]bool{}
	m.lookup(scope, rv, func(k objKey) { got[k.uid] = true })
	return got
}

func TestMemoryEvictsOldestByCount(t *testing.T) {
	m := NewDeleteMemory(3, time.Hour, nil)
	for i := 1; i <= 5; i++ {
		m.record("s", uint64(i), objKey{uid: fmt.Sprint("u", i)}, 1, 0)
	}
	if m.Len() != 3 {
		t.Fatalf("Len = %d, want 3", m.Len())
	}
	for i := 1; i <= 5; i++ {
		got := lookupAll(m, "s", uint64(i))
		if want := i > 2; got[fmt.Sprint("u", i)] != want {
			t.Errorf("entry %d remembered = %v, want %v", i, !want, want)
		}
	}
	// Several deletes under one key leave in insertion order.
	m.record("t", 7, objKey{uid: "x"}, 1, 0)
	m.record("t", 7, objKey{uid: "y"}, 1, 0)
	m.record("t", 7, objKey{uid: "y"}, 1, 0) // a duplicate is not stored twice
	m.record("t", 7, objKey{uid: "z"}, 1, 0)
	if got := lookupAll(m, "t", 7); len(got) != 3 || m.Len() != 3 {
		t.Fatalf("bucket = %v, Len %d", got, m.Len())
	}
	m.record("t", 8, objKey{uid: "w"}, 1, 0)
	if got := lookupAll(m, "t", 7); got["x"] || !got["y"] || !got["z"] {
		t.Errorf("after evicting the oldest, bucket = %v, want y z", got)
	}
}

func TestMemoryExpiresByAge(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	m := NewDeleteMemory(100, time.Minute, clock.now)
	m.record("s", 13, objKey{uid: "a"}, 10, 0)
	clock.advance(30 * time.Second)
	m.record("s", 14, objKey{uid: "b"}, 10, 13)
	clock.advance(30 * time.Second) // a is exactly maxAge old: kept
	if m.Len() != 2 {
		t.Fatalf("Len = %d at maxAge, want 2", m.Len())
	}
	clock.advance(time.Nanosecond)
	if m.Len() != 1 {
		t.Fatalf("Len = %d past a's maxAge, want 1", m.Len())
	}
	if got := lookupAll(m, "s", 14); !got["b"] || got["a"] {
		t.Errorf("lookup after a expired = %v", got)
	}
	// A stream starting from 13 now finds nothing.
	s := NewStream(Options{Scope: "s", StartRV: "13", Memory: m})
	expect(t, s, obj(stream.Deleted, "10", "a"), Rewrite, "14", ReasonDeleteRegressed)
	clock.advance(time.Hour)
	if m.Len() != 0 {
		t.Errorf("Len = %d an hour later, want 0", m.Len())
	}
}

func TestMemoryDefaults(t *testing.T) {
	m := NewDeleteMemory(0, 0, nil)
	if m.max != DefaultMemoryEntries || m.maxAge != DefaultMemoryAge || m.now == nil {
		t.Errorf("defaults not applied: %d %v", m.max, m.maxAge)
	}
}

// TestMemoryConcurrent runs the incident on many goroutines sharing one memory (go test -race).
func TestMemoryConcurrent(t *testing.T) {
	const workers, rounds = 8, 200
	// Large enough that no worker's record is evicted before its re-watch looks it up.
	mem := NewDeleteMemory(workers*rounds, time.Hour, nil)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				scope := fmt.Sprintf("w%d/%d", w, i)
				s := NewStream(Options{Scope: scope, StartRV: "12", Memory: mem})
				if d := s.Decide(obj(stream.Deleted, "10", "a")); d.Action != Rewrite || d.RV != "13" {
					errs <- fmt.Errorf("worker %d round %d: first stream %+v", w, i, d)
					return
				}
				r := NewStream(Options{Scope: scope, StartRV: "13", Memory: mem})
				if d := r.Decide(obj(stream.Deleted, "10", "a")); d.Action != Drop {
					errs <- fmt.Errorf("worker %d round %d: re-watch %+v", w, i, d)
					return
				}
				_ = mem.Len()
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := mem.Len(); n != workers*rounds {
		t.Errorf("Len = %d, want %d", n, workers*rounds)
	}
}

// TestMemoryBytesPerDelete measures the heap a remembered delete costs (UID-keyed, with a
// shared scope string), and fails if it grows past a generous bound.
func TestMemoryBytesPerDelete(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 100k entries")
	}
	const n = 100000
	uids := make([]string, n)
	for i := range uids {
		uids[i] = fmt.Sprintf("%08x-1c2d-4e5f-8a9b-%012x", i, i) // 36 bytes, like a UID
	}
	scope := "/api/v1/namespaces/default/endpoints?fieldSelector=metadata.name%3Dx|user=system:serviceaccount:kube-system:ctrl"
	m := NewDeleteMemory(n, time.Hour, nil)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < n; i++ {
		// record takes ownership of the key's strings, as Stream does with its clones.
		m.record(scope, uint64(1000+i), objKey{uid: uids[i]}, uint64(i), uint64(999+i))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	uidBytes := 48.0 // a 36-byte string's allocation size class
	t.Logf("%.0f bytes per remembered delete (%d entries), of which the UID's text is %.0f (allocated by the reader's clone)",
		per+uidBytes, m.Len(), uidBytes)
	if per+uidBytes > 400 {
		t.Errorf("%.0f bytes per remembered delete, want <= 400", per+uidBytes)
	}
	runtime.KeepAlive(m)
	runtime.KeepAlive(uids)
}
