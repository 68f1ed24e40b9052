package watch

// ring is a shared feed's recent object events (ADDED, MODIFIED, DELETED), as delivered: each
// frame's bytes exactly as a subscriber is sent them (after the feed's policy, a rewrite
// included) with the resourceVersion delivered. It is bounded in bytes and in events; the
// oldest go first. It covers the resourceVersions from start on: every event after start
// that the feed delivered is in it. Bookmarks and ERROR events are not kept (a joiner gets
// them live). Not safe for concurrent use: its fanout's lock guards it.
type ring struct {
	frames []ringFrame // oldest first; frames[head:] are live
	head   int
	bytes  int
	// start is the resourceVersion from which the ring has every event the feed delivered:
	// the feed's starting point, then the RV of the last event evicted.
	start uint64

	maxBytes, maxEvents int
	evicted             func() // counts one eviction; nil: none
}

type ringFrame struct {
	rv  uint64
	raw []byte // the frame, owned by the ring and shared read-only with subscribers' queues
}

// newRing returns an empty ring covering from start.
func newRing(start uint64, maxBytes, maxEvents int, evicted func()) *ring {
	return &ring{start: start, maxBytes: maxBytes, maxEvents: maxEvents, evicted: evicted}
}

func (r *ring) len() int { return len(r.frames) - r.head }

// add keeps the frame raw of an event delivered at rv, evicting the oldest to stay within
// bounds. A frame bigger than the byte bound on its own evicts everything, itself included:
// the ring then covers from rv.
func (r *ring) add(rv uint64, raw []byte) {
	r.frames = append(r.frames, ringFrame{rv: rv, raw: raw})
	r.bytes += len(raw)
	for r.len() > 0 && (r.bytes > r.maxBytes || r.len() > r.maxEvents) {
		old := r.frames[r.head]
		r.frames[r.head] = ringFrame{}
		r.head++
		r.bytes -= len(old.raw)
		r.start = old.rv
		if r.evicted != nil {
			r.evicted()
		}
	}
	// Compact once half the slice is dead, so the backing array stays about twice the bound.
	if r.head > 0 && r.head >= len(r.frames)/2 {
		n := copy(r.frames, r.frames[r.head:])
		clear(r.frames[n:])
		r.frames = r.frames[:n]
		r.head = 0
	}
}

// after returns the frames of the events after rv, oldest first, and their bytes: what a
// watch from rv gets before the live ones. The caller checked that the ring covers rv.
// The slice is new; the frames are shared.
func (r *ring) after(rv uint64) (frames [][]byte, bytes int) {
	live := r.frames[r.head:]
	i := len(live)
	for i > 0 && live[i-1].rv > rv {
		i--
	}
	frames = make([][]byte, 0, len(live)-i)
	for _, f := range live[i:] {
		frames = append(frames, f.raw)
		bytes += len(f.raw)
	}
	return frames, bytes
}
