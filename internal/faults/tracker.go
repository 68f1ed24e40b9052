package faults

import (
	"strings"
	"sync"

	"github.com/watchsan/watchsan/internal/stream"
)

// tracker is the layer's bounded memory of objects, keyed by UID (or namespace/name when an
// object has none): the highest integer resourceVersion seen in an ADDED or MODIFIED event of
// it on any watch, and whether a watch already ended after its delete. When full, the oldest
// key goes.
type tracker struct {
	mu    sync.Mutex
	max   int
	m     map[string]*tracked
	order []string // keys in insertion order, a ring once len(order) == max
	head  int      // the oldest key's index in order, once it is a ring
}

type tracked struct {
	rv    string
	rvInt uint64
	ended bool
}

func objectKey(ev *stream.Event) string {
	if ev.UID != "" {
		return ev.UID
	}
	return ev.Namespace + "/" + ev.Name
}

// observe records ev's resourceVersion for its object if it is an integer above the one
// remembered. Watches lag each other, so an older event may arrive after a newer one.
func (t *tracker) observe(ev *stream.Event) {
	if !ev.RVIsInt || (ev.UID == "" && ev.Name == "") {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entryLocked(objectKey(ev))
	if e.rv == "" || ev.RVInt > e.rvInt {
		e.rv, e.rvInt = strings.Clone(ev.RV), ev.RVInt
	}
}

// record stores rv as an object's resourceVersion (from the fallback LIST).
func (t *tracker) record(key, rv string, rvInt uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entryLocked(key)
	if e.rv == "" || rvInt > e.rvInt {
		e.rv, e.rvInt = rv, rvInt
	}
}

// prev returns the resourceVersion remembered for ev's object if it is below ev's, that is
// what the object carried before the change ev reports.
func (t *tracker) prev(ev *stream.Event) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[objectKey(ev)]
	if !ok || e.rv == "" || e.rvInt >= ev.RVInt {
		return "", false
	}
	return e.rv, true
}

// firstEnd reports whether no watch ended yet after ev's object was deleted, and marks that
// one has now.
func (t *tracker) firstEnd(ev *stream.Event) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entryLocked(objectKey(ev))
	if e.ended {
		return false
	}
	e.ended = true
	return true
}

// entryLocked returns key's entry, creating it (and evicting the oldest when full).
func (t *tracker) entryLocked(key string) *tracked {
	if e, ok := t.m[key]; ok {
		return e
	}
	if t.m == nil {
		if t.max <= 0 {
			t.max = defaultMaxTracked
		}
		t.m = make(map[string]*tracked)
	}
	key = strings.Clone(key)
	if len(t.order) < t.max {
		t.order = append(t.order, key)
	} else {
		delete(t.m, t.order[t.head])
		t.order[t.head] = key
		t.head = (t.head + 1) % t.max
	}
	e := &tracked{}
	t.m[key] = e
	return e
}
