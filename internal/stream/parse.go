package stream

// parseState is what parsing one frame needs, kept in the Reader so that steady-state parsing
// allocates nothing but the event's one string.
type parseState struct {
	// The fields found, aliasing the frame or arena. typ and the object's fields are separate
	// because a later "object" replaces every object field but not the type.
	typ, rv, uid, ns, name []byte
	// initialEventsEnd: the object's k8s.io/initial-events-end annotation is "true".
	initialEventsEnd bool
	loc              rvLocation

	// arena holds strings that had to be decoded (JSON escapes, indefinite-length CBOR
	// strings). Fields keep slices of it; when it must grow, a new array is started and the
	// old one stays alive for as long as they point to it.
	arena []byte
	// key holds a decoded JSON key or CBOR key that was not contiguous on the wire.
	key []byte
	// strs is the block the events' strings are carved from (str).
	strs []byte
	// js is the JSON splitter's scanner, whose container spans the parser uses; jsSkip
	// skips what it did not record. cs is shared by the CBOR splitter and skipper (never in
	// use at the same time).
	js, jsSkip jsonScan
	cs         cborScan
}

func (ps *parseState) reset(raw []byte) {
	ps.typ, ps.rv, ps.uid, ps.ns, ps.name = nil, nil, nil, nil, nil
	ps.initialEventsEnd = false
	ps.loc = rvLocation{}
	ps.arena = ps.arena[:0]
}

// resetObject forgets every object field: a later object replaces an earlier one whole.
func (ps *parseState) resetObject() {
	ps.rv, ps.uid, ps.ns, ps.name = nil, nil, nil, nil
	ps.initialEventsEnd = false
	ps.loc = rvLocation{}
}

// arenaFor returns the arena with room for n more bytes, starting a new one if needed.
func (ps *parseState) arenaFor(n int) []byte {
	if cap(ps.arena)-len(ps.arena) < n {
		ps.arena = make([]byte, 0, max(n, 2*cap(ps.arena), 256))
	}
	return ps.arena
}

// internType returns the constant for a standard event type so that it costs nothing.
func internType(b []byte) (string, bool) {
	switch string(b) { // no allocation: the compiler compares in place
	case Added:
		return Added, true
	case Modified:
		return Modified, true
	case Deleted:
		return Deleted, true
	case Bookmark:
		return Bookmark, true
	case Error:
		return Error, true
	case "":
		return "", true
	}
	return "", false
}

// fill sets ev from the parsed fields. The event's strings are carved from strs, a block
// shared by several events' strings (strings.go).
func (ps *parseState) fill(ev *Event, raw []byte, f Format) {
	*ev = Event{Raw: raw}
	typ, known := internType(ps.typ)
	n := len(ps.rv) + len(ps.uid) + len(ps.ns) + len(ps.name)
	if !known {
		n += len(ps.typ)
	}
	if n > 0 {
		if cap(ps.strs)-len(ps.strs) < n {
			ps.strs = make([]byte, 0, blockFor(n, ps.strs == nil))
		}
		if !known {
			typ = ps.str(ps.typ)
		}
		ev.RV = ps.str(ps.rv)
		ev.UID = ps.str(ps.uid)
		ev.Namespace = ps.str(ps.ns)
		ev.Name = ps.str(ps.name)
	}
	ev.Type = typ
	ev.RVInt, ev.RVIsInt = ParseRV(ev.RV)
	ev.InitialEventsEnd = typ == Bookmark && ps.initialEventsEnd
	if ps.loc.format != 0 {
		ev.rv = ps.loc
	}
}
