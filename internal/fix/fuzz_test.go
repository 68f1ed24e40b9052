package fix

import (
	"strconv"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/stream"
)

// fuzzStream turns fuzz bytes into stream options and events. data[0] picks the start,
// data[1] the start RV; then three bytes per event: type, RV move, object.
func fuzzStream(data []byte) (Options, []*stream.Event) {
	var o Options
	clock := uint64(1)
	if len(data) >= 2 {
		n := uint64(data[1]) + 1
		switch data[0] % 5 {
		case 0:
			o.StartRV = ""
		case 1:
			o.StartRV = "0"
		case 2:
			o.StartRV, clock = strconv.FormatUint(n, 10), n
		case 3:
			o.StartRV = "opaque"
		case 4:
			o.StartRV, clock, o.SendInitialEvents = strconv.FormatUint(n, 10), n, true
		}
		data = data[2:]
	}
	const maxEvents = 400
	var evs []*stream.Event
	for ; len(data) >= 3 && len(evs) < maxEvents; data = data[3:] {
		t, r, id := data[0], data[1], data[2]
		e := &stream.Event{}
		switch t % 8 {
		case 0, 1:
			e.Type = stream.Added
		case 2:
			e.Type = stream.Modified
		case 3:
			e.Type = stream.Deleted
		case 4:
			e.Type = stream.Bookmark
		case 5:
			e.Type, e.InitialEventsEnd = stream.Bookmark, true
		case 6:
			e.Type = stream.Error
		case 7:
			e.Type = "WEIRD"
		}
		switch r >> 6 {
		case 0, 1: // forward, by 0 to 3
			clock += uint64(r & 3)
			e.SetRV(strconv.FormatUint(clock, 10))
		case 2: // backward
			back := uint64(r & 0x3f)
			rv := uint64(1)
			if clock > back+1 {
				rv = clock - back
			}
			e.SetRV(strconv.FormatUint(rv, 10))
		case 3:
			if r&1 == 0 {
				e.SetRV("opaque-" + strconv.Itoa(int(r)))
			} else {
				e.SetRV("")
			}
		}
		switch {
		case id >= 240: // no identity at all
		case id%12 < 9:
			e.UID, e.Namespace, e.Name = "uid-"+strconv.Itoa(int(id%12)), "ns", "n"+strconv.Itoa(int(id%12))
		default:
			e.Namespace, e.Name = "ns", "n"+strconv.Itoa(int(id%12))
		}
		evs = append(evs, e)
	}
	return o, evs
}

// FuzzDecide drives random event sequences through a Repair and an Observe stream and checks:
// in the steady phase, delivered integer RVs strictly increase (bookmarks may repeat the last);
// the initial-events-end bookmark is never dropped; each object's delete is delivered at most
// once; LastDelivered is the RV really written; Observe decides what Repair does and changes
// nothing; and a re-watch from the last rewritten delete's RV is not given the deletes rewritten
// since the last in-order event again.
func FuzzDecide(f *testing.F) {
	f.Add([]byte{2, 10, 0, 1, 1, 0, 1, 2, 0, 2, 3, 3, 0x8a, 1})            // the 1.7 incident
	f.Add([]byte{1, 0, 0, 5, 1, 0, 0x82, 2, 5, 1, 3, 3, 0x81, 1, 2, 1, 2}) // initial phase
	f.Add([]byte{4, 50, 0, 1, 1, 5, 0x85, 0, 3, 0xc0, 3, 6, 0, 0, 7, 0, 4})
	f.Fuzz(func(t *testing.T, data []byte) {
		opts, evs := fuzzStream(data)
		mem := NewDeleteMemory(1<<20, time.Hour, nil)
		opts.Scope, opts.Memory = "fuzz", mem
		s := NewStream(opts)
		obsOpts := opts
		obsOpts.Mode, obsOpts.Memory = Observe, nil
		obs := NewStream(obsOpts)

		var (
			prev       uint64 // highest integer RV delivered in the steady phase
			havePrev   bool
			maxInitial uint64
			sawInitial bool
			deletes    = map[objKey]int{}  // deliveries per object
			run        = map[objKey]bool{} // deletes rewritten since the last in-order event
		)
		if n, ok := stream.ParseRV(opts.StartRV); ok && !s.InInitialPhase() {
			prev, havePrev = n, true
		}
		for i, e := range evs {
			wasInitial := s.InInitialPhase()
			d := s.Decide(e)
			o := obs.Decide(e)
			if d.Action != d.Would {
				t.Fatalf("event %d: Repair Action %v != Would %v", i, d.Action, d.Would)
			}
			if o.Action != Pass || o.Would != d.Would || o.Reason != d.Reason || o.RV != d.RV {
				t.Fatalf("event %d: Observe %+v, Repair %+v", i, o, d)
			}
			if e.Type == stream.Error || e.Type == "WEIRD" {
				if d.Action != Pass || s.InInitialPhase() != wasInitial {
					t.Fatalf("event %d: %s gave %+v", i, e.Type, d)
				}
				continue
			}
			if wasInitial && e.Type == stream.Added {
				if d.Action != Pass || !s.InInitialPhase() {
					t.Fatalf("event %d: initial ADDED gave %+v", i, d)
				}
				if e.RVIsInt && (!sawInitial || e.RVInt > maxInitial) {
					maxInitial, sawInitial = e.RVInt, true
				}
				continue
			}
			if s.InInitialPhase() {
				t.Fatalf("event %d: %s did not end the initial phase", i, e.Type)
			}
			if wasInitial && sawInitial {
				prev, havePrev = maxInitial, true
			}
			if e.InitialEventsEnd && d.Action == Drop {
				t.Fatalf("event %d: the initial-events-end bookmark was dropped: %+v", i, d)
			}
			if d.Action == Drop {
				continue
			}

			// Delivered.
			rv, rvInt, isInt := e.RV, e.RVInt, e.RVIsInt
			if d.Action == Rewrite {
				rv, rvInt, isInt = d.RV, d.RVInt, true
			}
			if got := s.LastDelivered(); got != rv {
				t.Fatalf("event %d: LastDelivered %q, delivered %q", i, got, rv)
			}
			if got := obs.LastDelivered(); got != e.RV {
				t.Fatalf("event %d: Observe LastDelivered %q, sent %q", i, got, e.RV)
			}
			if isInt {
				if havePrev {
					if e.Type == stream.Bookmark && rvInt < prev || e.Type != stream.Bookmark && rvInt <= prev {
						t.Fatalf("event %d: %s delivered with RV %d after %d (%+v)", i, e.Type, rvInt, prev, d)
					}
				}
				inOrder := d.Action == Pass && (!havePrev || rvInt > prev)
				if inOrder {
					clear(run)
				}
				if !havePrev || rvInt > prev {
					prev, havePrev = rvInt, true
				}
			}
			k, hasKey := keyOf(e)
			if !hasKey {
				continue
			}
			k = k.clone()
			switch e.Type {
			case stream.Deleted:
				deletes[k]++
				if deletes[k] > 1 {
					t.Fatalf("event %d: the delete of %+v delivered twice", i, k)
				}
				if d.Action == Rewrite {
					run[k] = true
				}
			case stream.Added:
				if k.uid == "" {
					delete(deletes, k) // a new object with the same name
				}
			}
		}

		// The client re-watches from where it stopped. If that was a rewritten delete, the
		// apiserver replays the run of rewritten deletes: none may reach the client again.
		last := s.LastDelivered()
		if _, isInt := stream.ParseRV(last); len(run) == 0 || !isInt {
			return // nothing rewritten since the last in-order event, or an opaque resume point
		}
		r := NewStream(Options{Scope: "fuzz", StartRV: last, Memory: mem})
		for k := range run {
			e := &stream.Event{Type: stream.Deleted, UID: k.uid, Namespace: k.ns, Name: k.name}
			e.SetRV("1")
			if d := r.Decide(e); d.Action != Drop || d.Reason != ReasonDeleteRemembered {
				t.Fatalf("re-watch from %s: replayed delete of %+v gave %+v", last, k, d)
			}
		}
	})
}
