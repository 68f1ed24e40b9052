package upstream

import (
	"regexp"
	"strconv"
	"sync"
)

// Which resourceVersions a backend can serve a watch from (docs/design.md section 10.2). An
// apiserver's watch cache answers a watch from r with "too old resource version: r (L)" when
// r is older than its window, L its oldest servable revision (watch_cache_history.go); the
// window only moves forward (events leave it, a restart starts it again at a newer list), so
// once a backend has said L for a resource, nothing below L is asked of it again: a watch
// resumes or moves only where its resume point is not known to be gone.

// servable is a backend's known floors, per resource (GROUP/RESOURCE, RESOURCE for the core
// group): a watch from below the floor gets 410 there.
type servable struct {
	mu     sync.Mutex
	floors map[string]uint64
}

// NoteTooOld records that b cannot serve resource's watches from below floor (its 410 said
// so). Floors only rise.
func (b *Backend) NoteTooOld(resource string, floor uint64) {
	if resource == "" || floor == 0 {
		return
	}
	s := &b.servable
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.floors == nil {
		s.floors = map[string]uint64{}
	}
	if cur, ok := s.floors[resource]; ok || len(s.floors) < maxTrackedResources {
		s.floors[resource] = max(cur, floor)
	}
}

// CanServe reports whether b is not known to be unable to serve a watch of resource from rv
// (0: no resume point, anything goes).
func (b *Backend) CanServe(resource string, rv uint64) bool {
	if rv == 0 || resource == "" {
		return true
	}
	s := &b.servable
	s.mu.Lock()
	defer s.mu.Unlock()
	return rv >= s.floors[resource]
}

// tooOldRE matches the cacher's message (watch_cache_history.go: "too old resource version:
// %d (%d)"); the second number is the oldest revision the cache holds.
var tooOldRE = regexp.MustCompile(`too old resource version: \d+ \((\d+)\)`)

// TooOldFloor reads the floor out of a 410 Status message; false when it names none.
func TooOldFloor(msg string) (uint64, bool) {
	m := tooOldRE.FindStringSubmatch(msg)
	if m == nil {
		return 0, false
	}
	n, err := strconv.ParseUint(m[1], 10, 64)
	return n, err == nil && n > 0
}

// Servable reports whether a usable backend other than except is not known to be unable to
// serve a watch of resource from rv: where a 410 on except need not be the client's.
func (a *Attempter) Servable(resource string, rv uint64, except *Backend) bool {
	for _, b := range a.pool.Backends() {
		if b != except && b.usable() && b.CanServe(resource, rv) {
			return true
		}
	}
	return false
}
