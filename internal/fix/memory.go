package fix

import (
	"sync"
	"time"
)

// Defaults for NewDeleteMemory's arguments.
const (
	// DefaultMemoryEntries bounds a DeleteMemory when maxEntries <= 0: about 21 MB at the
	// measured 212 bytes an entry (BenchmarkMemoryBytesPerDelete). The --delete-memory-entries
	// default.
	DefaultMemoryEntries = 100000
	// DefaultMemoryAge is how long a remembered delete lives when maxAge <= 0: well beyond a
	// reflector's watch (5-10 min) plus its re-watch, the window in which the client comes
	// back from the rewritten RV. The --delete-memory-ttl default.
	DefaultMemoryAge = 30 * time.Minute
)

// DeleteMemory remembers, process-wide, the deletes that streams rewrote, so that a client
// re-watching from a rewritten RV is not given the same delete again when the apiserver
// replays it. An entry is keyed by (Scope, rewritten RV) and names the object.
//
// It is bounded by entry count (the oldest entry is evicted first) and by age (entries older
// than maxAge are expired), safe for concurrent use, and O(1) per insert (amortised, with
// expiry). A lookup walks the chain of records that a run of rewrites left (see
// Stream.recordRewrite), at most Len entries.
//
// The match is by identity only (UID, else namespace/name). A client that got the RV R
// elsewhere than from watchsan's rewrite, e.g. from a LIST served at exactly revision R, and
// then watches from R with the same Scope would have that delete dropped; Scope should
// therefore include the client's identity, and maxAge be no longer than needed.
type DeleteMemory struct {
	max    int
	maxAge time.Duration
	now    func() time.Time

	mu     sync.Mutex
	byKey  map[memKey]*memEntry // the oldest entry of each key's bucket
	oldest *memEntry            // FIFO of all entries, linked by newer
	newest *memEntry
	n      int
}

type memKey struct {
	scope string
	rv    uint64
}

// memEntry is one remembered delete.
type memEntry struct {
	key   memKey
	obj   objKey
	wire  uint64 // the RV the delete carried on the wire
	prev  uint64 // the previous record of the same run of rewrites; 0 none
	at    int64  // insertion time, Unix nanoseconds
	newer *memEntry
	next  *memEntry // the next (newer) entry with the same key
}

// NewDeleteMemory returns an empty memory holding at most maxEntries deletes (<= 0:
// DefaultMemoryEntries) for at most maxAge (<= 0: DefaultMemoryAge), reading the time from
// now (nil: time.Now).
func NewDeleteMemory(maxEntries int, maxAge time.Duration, now func() time.Time) *DeleteMemory {
	if maxEntries <= 0 {
		maxEntries = DefaultMemoryEntries
	}
	if maxAge <= 0 {
		maxAge = DefaultMemoryAge
	}
	if now == nil {
		now = time.Now
	}
	return &DeleteMemory{max: maxEntries, maxAge: maxAge, now: now, byKey: make(map[memKey]*memEntry)}
}

// Len returns how many rewritten deletes are remembered (expired ones excluded; a delete
// naming no object counts too: it links its run).
func (m *DeleteMemory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expire(m.now().UnixNano())
	return m.n
}

// record remembers that obj's delete, which carried wire, was rewritten to rv on a watch of
// scope; prev links to the run's previous record (0: none). obj must not alias a reader's
// buffer. A second record of the same object under the same key is ignored.
func (m *DeleteMemory) record(scope string, rv uint64, obj objKey, wire, prev uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now().UnixNano()
	m.expire(now)

	k := memKey{scope: scope, rv: rv}
	e := &memEntry{key: k, obj: obj, wire: wire, prev: prev, at: now}
	if b := m.byKey[k]; b == nil {
		m.byKey[k] = e
	} else {
		for ; ; b = b.next {
			if b.obj == obj && b.prev == prev {
				return
			}
			if b.next == nil {
				break
			}
		}
		b.next = e
	}
	if m.newest == nil {
		m.oldest = e
	} else {
		m.newest.newer = e
	}
	m.newest = e
	m.n++
	for m.n > m.max {
		m.popOldest()
	}
}

// lookup calls fn for every object whose delete is remembered under (scope, rv) and,
// following the links, under the earlier records of the same runs.
func (m *DeleteMemory) lookup(scope string, rv uint64, fn func(objKey)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expire(m.now().UnixNano())
	if m.n == 0 {
		return
	}
	var visited map[uint64]bool
	todo := []uint64{rv}
	for steps := 0; len(todo) > 0 && steps <= m.n; steps++ {
		r := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		for e := m.byKey[memKey{scope: scope, rv: r}]; e != nil; e = e.next {
			if e.obj != (objKey{}) { // a link-only record
				fn(e.obj)
			}
			if e.prev == 0 || e.prev == r {
				continue
			}
			if visited == nil {
				visited = map[uint64]bool{r: true}
			}
			if !visited[e.prev] {
				visited[e.prev] = true
				todo = append(todo, e.prev)
			}
		}
	}
}

// expire drops the entries older than maxAge. m.mu is held.
func (m *DeleteMemory) expire(now int64) {
	limit := now - int64(m.maxAge)
	for m.oldest != nil && m.oldest.at < limit {
		m.popOldest()
	}
}

// popOldest removes the oldest entry, which is also the oldest of its bucket. m.mu is held.
func (m *DeleteMemory) popOldest() {
	e := m.oldest
	m.oldest = e.newer
	if m.oldest == nil {
		m.newest = nil
	}
	if e.next == nil {
		delete(m.byKey, e.key)
	} else {
		m.byKey[e.key] = e.next
	}
	e.newer, e.next = nil, nil
	m.n--
}
