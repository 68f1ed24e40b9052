package absorb

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"

	"github.com/watchsan/watchsan/internal/stream"
)

// Absorbing a 410 at the resume point (docs/design.md section 12). A feed whose state is
// complete answers an expired resume point with a list of its scope and the difference between
// it and its state, sent to its subscribers through the normal delivery path: first a DELETED
// for every object gone (or replaced: another uid), carrying its last known state at exactly
// the last delivered resourceVersion R; then ADDED and MODIFIED in ascending resourceVersion,
// all in (R, L] for the list's L; then a BOOKMARK at L. The feed then watches on from L.
// Everything is read, within the budget, before anything is written: a list that fails leaves
// the subscribers as they were, and they get the 410.

// Event is one event of an absorb, in the feed's format, read as the feed's Reader reads one
// (so the policy, the writers and the ring take it as any other). Gone: a DELETED at the last
// delivered resourceVersion (fix.Stream.DecideAbsorbedDelete decides it).
type Event struct {
	Ev   *stream.Event
	Gone bool
}

// diff is the events, in format, that take s to the list l, in the order they are sent, the
// bookmark at l's resourceVersion last; R is the last delivered resourceVersion, maxFrame the
// largest frame read. An error: the list does not agree with a complete state at R (an object
// unchanged since at or before R that the state does not hold as it is), and nothing may be
// sent.
func diff(format stream.Format, s *State, l *Listed, R uint64, maxFrame int) ([]Event, error) {
	if l.rv < R {
		return nil, fmt.Errorf("the list's resourceVersion %d is before the last delivered %d", l.rv, R)
	}
	var out []Event
	var gone []string
	for key, o := range s.objs {
		if it := l.items[key]; it == nil || it.uid != o.uid {
			gone = append(gone, key)
		}
	}
	sort.Strings(gone)
	rv := strconv.FormatUint(R, 10)
	for _, key := range gone {
		obj, err := l.codec.ObjectOf(s.objs[key].frame)
		if err != nil {
			return nil, fmt.Errorf("the state's %s: %w", key, err)
		}
		ev, err := synthesize(format, l.codec, stream.Deleted, obj, rv, maxFrame)
		if err != nil {
			return nil, fmt.Errorf("a DELETED for %s: %w", key, err)
		}
		out = append(out, Event{Ev: ev, Gone: true})
	}
	type change struct {
		typ string
		it  *obj
	}
	var changes []change
	for key, it := range l.items {
		o := s.objs[key]
		typ := stream.Added
		switch {
		case o != nil && o.uid == it.uid && o.rv == it.rv:
			continue // unchanged
		case o != nil && o.uid == it.uid:
			typ = stream.Modified
		}
		if it.rv <= R || it.rv > l.rv {
			return nil, fmt.Errorf("%s (%s) at resourceVersion %d, outside (%d, %d]", key, typ, it.rv, R, l.rv)
		}
		changes = append(changes, change{typ, it})
	}
	sort.Slice(changes, func(i, j int) bool { return changes[i].it.rv < changes[j].it.rv })
	for _, c := range changes {
		ev, err := synthesize(format, l.codec, c.typ, c.it.frame, "", maxFrame)
		if err != nil {
			return nil, fmt.Errorf("an %s: %w", c.typ, err)
		}
		out = append(out, Event{Ev: ev})
	}
	ev, err := synthesize(format, l.codec, stream.Bookmark, l.codec.Bookmark(l.kind, l.apiVersion, strconv.FormatUint(l.rv, 10)), "", maxFrame)
	if err != nil {
		return nil, fmt.Errorf("the bookmark: %w", err)
	}
	return append(out, Event{Ev: ev}), nil
}

// synthesize makes a watch event of type typ with object obj in format (codec's), as a feed's
// Reader reads one, its resourceVersion set to rv when rv is not "" (stream.Writer's in-place
// rewrite, as a delete's rewrite is made).
func synthesize(format stream.Format, codec stream.ListCodec, typ string, obj []byte, rv string, maxFrame int) (*stream.Event, error) {
	ev, err := ReadOne(format, codec.Frame(typ, obj), maxFrame)
	if err != nil || rv == "" || ev.RV == rv {
		return ev, err
	}
	var buf bytes.Buffer
	if err := stream.NewWriter(format, &buf).WriteWithRV(ev, rv); err != nil {
		return nil, err
	}
	return ReadOne(format, buf.Bytes(), maxFrame)
}

// ReadOne reads the one event in frame, in format, as its own copy.
func ReadOne(format stream.Format, frame []byte, maxFrame int) (*stream.Event, error) {
	ev, err := stream.NewReader(format, bytes.NewReader(frame), maxFrame).Next()
	if err != nil {
		return nil, err
	}
	return ev.Clone(), nil
}
