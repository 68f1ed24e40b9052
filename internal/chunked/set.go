package chunked

import (
	"context"
	"sync"
)

// Set holds the taken connections (Options.Set) that shutdown waits for: http.Server.Shutdown
// does not wait for hijacked connections, so the server waits for them with Wait after it. Its
// zero value is empty and ready.
type Set struct {
	mu    sync.Mutex
	conns map[*Conn]struct{} // from Take to Release
	// gone is closed when conns is empty (a Wait waits on it); forced is set once a Wait gave
	// up, after which add refuses.
	gone   chan struct{}
	forced bool
}

// add puts c in the set; false once a Wait gave up (the caller ends c at once: Start).
func (s *Set) add(c *Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.forced {
		return false
	}
	if s.conns == nil {
		s.conns = map[*Conn]struct{}{}
	}
	s.conns[c] = struct{}{}
	return true
}

// remove takes c out of the set, and tells Wait when it is empty.
func (s *Set) remove(c *Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
	if len(s.conns) == 0 && s.gone != nil {
		close(s.gone)
		s.gone = nil
	}
}

// Wait waits until the set is empty, or until ctx ends: then it ends the connections left
// (each one's Options.Abort, else its Close), refuses the connections taken after, and returns
// ctx's error.
func (s *Set) Wait(ctx context.Context) error {
	for {
		s.mu.Lock()
		if len(s.conns) == 0 {
			s.mu.Unlock()
			return nil
		}
		if s.gone == nil {
			s.gone = make(chan struct{})
		}
		gone := s.gone
		s.mu.Unlock()
		select {
		case <-gone:
		case <-ctx.Done():
			s.mu.Lock()
			s.forced = true
			left := make([]*Conn, 0, len(s.conns))
			for c := range s.conns {
				left = append(left, c)
			}
			s.mu.Unlock()
			for _, c := range left {
				if c.abort != nil {
					c.abort()
				} else {
					c.Close() // the watch's next write fails, and it ends
				}
			}
			return ctx.Err()
		}
	}
}

// Len is how many connections of class (Options.Class) the set holds.
func (s *Set) Len(class int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for c := range s.conns {
		if c.class == class {
			n++
		}
	}
	return n
}

// Conns returns the connections of class the set holds (tests, /debug).
func (s *Set) Conns(class int) []*Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	var cs []*Conn
	for c := range s.conns {
		if c.class == class {
			cs = append(cs, c)
		}
	}
	return cs
}
