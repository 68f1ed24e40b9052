// Package fix is watchsan's per-stream resourceVersion policy: for every event of one client
// watch it decides whether the event passes unchanged, passes with a rewritten
// resourceVersion, or is dropped, so that the client never sees a resourceVersion go
// backwards, a replayed event, or a second delete of the same object (docs/design.md section 1a).
//
// The caller (internal/watch) builds one Stream per client watch, calls Decide for each event
// read from the upstream, acts on the returned Decision, and counts and logs from it. A Stream
// is not safe for concurrent use; one goroutine owns it. A DeleteMemory is shared by all the
// streams of a process and carries rewritten deletes from one client watch to the client's
// next one.
//
// resourceVersions are compared only when both sides are unsigned decimal integers
// (stream.Event.RVIsInt); anything else is passed through untouched and never compared.
package fix

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/watchsan/watchsan/internal/stream"
)

// Mode says whether a Stream changes the stream or only reports what it would change.
type Mode int

const (
	// Repair (the zero value) rewrites and drops events as Decide says.
	Repair Mode = iota
	// Observe changes nothing: every Decision's Action is Pass, and Would tells what Repair
	// would have done, for counting and logging.
	Observe
	// PassAll is for resources exempt from sanitizing: every event passes (Action and Would
	// are Pass, with ReasonExempt once the initial phase is over), nothing is judged, counted
	// as a regression or remembered; the stream still keeps the initial phase and the resume
	// point (LastDelivered), by the same rules as the other modes.
	PassAll
)

// ParseMode parses "repair" or "observe" (the --fix-mode values).
func ParseMode(s string) (Mode, error) {
	switch s {
	case "repair":
		return Repair, nil
	case "observe":
		return Observe, nil
	}
	return Repair, fmt.Errorf("fix mode %q: want repair or observe", s)
}

func (m Mode) String() string {
	switch m {
	case Repair:
		return "repair"
	case Observe:
		return "observe"
	case PassAll:
		return "pass-all"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// Action is what the caller does with an event.
type Action uint8

const (
	// Pass (the zero value): write the event exactly as it was read.
	Pass Action = iota
	// Rewrite: write the event with its resourceVersion replaced by Decision.RV.
	Rewrite
	// Drop: do not write the event.
	Drop
)

var actionNames = [...]string{Pass: "passed", Rewrite: "rewritten", Drop: "dropped"}

// String returns "passed", "rewritten" or "dropped", the values of the metrics' action label.
func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// Reason says why Decide chose its action. Its String is a short stable token for logs and
// metric labels.
type Reason uint8

const (
	// ReasonOK (the zero value): the event is in order.
	ReasonOK Reason = iota
	// ReasonInitial: an ADDED event of the initial phase; these pass in any order.
	ReasonInitial
	// ReasonInitialEventsEnd: the initial-events-end bookmark, at or above the last delivered
	// RV; passed.
	ReasonInitialEventsEnd
	// ReasonNoBaseline: an integer RV with no integer RV before it to compare with (the watch
	// started from an opaque RV, or the initial phase had none); passed, and it becomes the
	// baseline.
	ReasonNoBaseline
	// ReasonNotInteger: the event's RV is not an unsigned integer; passed untouched, never
	// compared.
	ReasonNotInteger
	// ReasonErrorEvent: an ERROR event; always passed.
	ReasonErrorEvent
	// ReasonUnknownType: an event type other than ADDED, MODIFIED, DELETED, BOOKMARK, ERROR;
	// passed untouched, with no effect on the stream's state.
	ReasonUnknownType
	// ReasonDeleteRegressed: a DELETED at or below the last delivered RV; rewritten to the
	// last delivered RV + 1.
	ReasonDeleteRegressed
	// ReasonReplay: an ADDED or MODIFIED at or below the last delivered RV; dropped.
	ReasonReplay
	// ReasonBookmarkRegressed: a BOOKMARK below the last delivered RV; dropped.
	ReasonBookmarkRegressed
	// ReasonInitialEventsEndRegressed: the initial-events-end bookmark below the last delivered
	// RV; rewritten to the last delivered RV (it is never dropped).
	ReasonInitialEventsEndRegressed
	// ReasonDeleteDelivered: a DELETED for an object whose delete this stream already
	// delivered; dropped.
	ReasonDeleteDelivered
	// ReasonDeleteRemembered: a DELETED for an object whose delete the client already got on
	// an earlier watch, which ended at the RV this watch starts from (DeleteMemory); dropped.
	ReasonDeleteRemembered
	// ReasonOverflow: a DELETED that would need a rewrite above the largest uint64; passed
	// untouched (no real apiserver gets there).
	ReasonOverflow
	// ReasonExempt: a steady-phase event of a PassAll stream; passed unjudged.
	ReasonExempt
	// ReasonAbsorbedDelete: a DELETED the watch synthesized at exactly the last delivered RV
	// for an object gone while its resume point expired (DecideAbsorbedDelete); passed.
	ReasonAbsorbedDelete

	numReasons
)

var reasonNames = [numReasons]string{
	ReasonOK:                        "ok",
	ReasonInitial:                   "initial",
	ReasonInitialEventsEnd:          "initial-events-end",
	ReasonNoBaseline:                "no-baseline",
	ReasonNotInteger:                "rv-not-integer",
	ReasonErrorEvent:                "error-event",
	ReasonUnknownType:               "unknown-type",
	ReasonDeleteRegressed:           "delete-regressed",
	ReasonReplay:                    "replay",
	ReasonBookmarkRegressed:         "bookmark-regressed",
	ReasonInitialEventsEndRegressed: "initial-events-end-regressed",
	ReasonDeleteDelivered:           "delete-already-delivered",
	ReasonDeleteRemembered:          "delete-remembered",
	ReasonOverflow:                  "rv-overflow",
	ReasonExempt:                    "exempt",
	ReasonAbsorbedDelete:            "absorbed-delete",
}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// Decision is Decide's answer for one event.
type Decision struct {
	// Action is what the caller must do. The zero value is Pass. In Observe mode it is always
	// Pass.
	Action Action
	// Would is what Repair does with the event: equal to Action in Repair mode; in Observe
	// mode the action that was not taken. The zero value is Pass.
	Would Action
	// RV is, when Would is Rewrite, the resourceVersion Repair writes; RVInt is its value.
	// Otherwise "" and 0.
	RV    string
	RVInt uint64
	// Reason says why. The zero value is ReasonOK.
	Reason Reason
}

// DefaultTrackedDeletes is the per-stream bound on remembered delivered deletes when
// Options.TrackedDeletes is zero.
const DefaultTrackedDeletes = 1024

// MaxDetails is how many RegressionDetails a Stream keeps (the first ones).
const MaxDetails = 5

// Options configure one Stream.
type Options struct {
	// Scope identifies the watch for DeleteMemory: two watches share remembered deletes only
	// when their Scopes are equal. The caller builds it from everything that selects the
	// watched objects (path, labelSelector, fieldSelector) and, to keep two clients that
	// happen to watch the same thing apart, from the client's identity. "" is a valid Scope
	// shared by every stream whose Scope is "".
	Scope string
	// StartRV is the client's resourceVersion parameter; "" or "0" start the initial phase,
	// an integer N > 0 starts the steady phase with baseline N, anything else starts the
	// steady phase with no baseline (the first integer RV becomes it).
	StartRV string
	// SendInitialEvents is the client's sendInitialEvents=true: the watch starts with the
	// initial phase whatever StartRV is. False: the phase follows StartRV alone.
	SendInitialEvents bool
	// Mode is Repair (the zero value), Observe or PassAll.
	Mode Mode
	// Memory carries rewritten deletes across re-watches. Nil: no memory; a re-watch from a
	// rewritten RV may see the delete once more.
	Memory *DeleteMemory
	// TrackedDeletes bounds how many delivered deletes the stream remembers to drop their
	// replays (oldest forgotten first). Zero: DefaultTrackedDeletes.
	TrackedDeletes int
}

// Counts are a Stream's totals by the action Repair takes (in Observe mode: would take).
type Counts struct {
	Events     uint64 // every event given to Decide
	Rewritten  uint64 // Would == Rewrite
	Dropped    uint64 // Would == Drop, Remembered included
	Remembered uint64 // drops with ReasonDeleteRemembered
	NotInteger uint64 // passes with ReasonNotInteger
}

// RegressionDetail describes one event that Repair rewrites or drops, for a per-stream log line.
type RegressionDetail struct {
	Type      string
	Namespace string
	Name      string
	UID       string
	// RV is the event's resourceVersion on the wire.
	RV string
	// Last is the highest integer RV delivered before the event, "" when there was none.
	Last string
	// Would and Reason are the Decision's; NewRV is its RV (a rewrite's target).
	Would  Action
	Reason Reason
	NewRV  string
}

// Stream is the policy state of one client watch. Create it with NewStream.
type Stream struct {
	scope   string
	startRV string
	mode    Mode
	mem     *DeleteMemory

	initial bool   // in the initial phase
	maxSeen uint64 // initial phase: highest integer RV seen
	sawInt  bool   // initial phase: maxSeen is set

	// wm is the steady phase's watermark: the highest integer RV Repair delivered (or the
	// baseline). Every comparison is against it; it never decreases.
	wm     uint64
	haveWM bool

	// chain is the RV of the newest DeleteMemory record of the current run of rewritten
	// deletes (0: none); see recordRewrite.
	chain uint64

	// The RV really written last, for LastDelivered: an integer, or opaque bytes.
	lastInt    uint64
	lastIsInt  bool
	lastOpaque []byte

	deletes deleteSet

	counts  Counts
	details []RegressionDetail
}

// NewStream returns the state of a new client watch. When the watch starts in the steady phase
// from an integer RV and o.Memory holds deletes rewritten to that RV for o.Scope, the stream
// drops those deletes when the apiserver replays them.
func NewStream(o Options) *Stream {
	s := &Stream{
		scope:   o.Scope,
		startRV: o.StartRV,
		mode:    o.Mode,
		mem:     o.Memory,
		initial: o.SendInitialEvents || o.StartRV == "" || o.StartRV == "0",
	}
	s.deletes.max = o.TrackedDeletes
	if s.deletes.max <= 0 {
		s.deletes.max = DefaultTrackedDeletes
	}
	start, startIsInt := stream.ParseRV(o.StartRV)
	s.setLastStart(start, startIsInt)
	if !s.initial && startIsInt {
		s.wm, s.haveWM = start, true
		if s.mem != nil {
			n := 0
			s.mem.lookup(s.scope, start, func(k objKey) {
				s.deletes.add(k, true)
				n++
			})
			if n > 0 {
				// The replays of these deletes are still to come: a delete rewritten on this
				// stream before any in-order event must carry them on.
				s.chain = start
			}
		}
	}
	return s
}

// InInitialPhase reports whether the stream is still in its initial phase (ADDED events of
// the current state, in no RV order).
func (s *Stream) InInitialPhase() bool { return s.initial }

// LastDelivered returns the resourceVersion of the last event really written to the client
// (after any rewrite; ERROR events and events of unknown type are not counted), the point
// to resume an upstream watch from. Until the steady phase has delivered something it is
// the highest integer RV of the initial phase, or StartRV. While InInitialPhase it is
// StartRV and is no resume point: the initial events came in no order. In Repair mode it
// never goes below an integer RV delivered before it (but for ReasonOverflow); in Observe
// mode nothing is repaired, so it can.
//
// A passed event counts as delivered even if the caller withholds it, as it does with the
// bookmarks it asked the upstream for on behalf of a client that did not: a bookmark at B
// says every event up to B was sent, so B is a sound resume point, and a delete regressing
// below it is rewritten to B+1 for the same reason as below last+1 (see Decide).
func (s *Stream) LastDelivered() string {
	if s.lastIsInt {
		return strconv.FormatUint(s.lastInt, 10)
	}
	return string(s.lastOpaque)
}

// HasResumePoint reports whether LastDelivered is not "", without formatting it: a watch asks
// for every event whether it can be moved (formatting it per event was 2% of the CPU).
func (s *Stream) HasResumePoint() bool { return s.lastIsInt || len(s.lastOpaque) > 0 }

// Counts returns the stream's totals so far.
func (s *Stream) Counts() Counts { return s.counts }

// Regressions returns the first MaxDetails events that Repair rewrites or drops.
func (s *Stream) Regressions() []RegressionDetail {
	return append([]RegressionDetail(nil), s.details...)
}

// Decide applies the policy to one event. It is meant to run for every event: it does not
// retain ev or anything that aliases it, and it does not allocate when the event passes
// (DELETED events and regressions may).
//
// The rules:
//   - ERROR always passes; so does an unknown type. Neither changes the stream's state.
//   - RVs that are not unsigned integers pass untouched, never compared.
//   - Initial phase: ADDED events pass in any order. The phase ends at the initial-events-end
//     BOOKMARK or at the first other event, which is then judged by the steady rules against
//     the baseline, the highest integer RV seen in the phase.
//   - Steady phase: delivered RVs strictly increase. An ADDED or MODIFIED at or below the
//     last delivered RV is a replay: dropped. A DELETED at or below it is rewritten to last+1
//     (see the rationale below). A BOOKMARK may equal it; one below is dropped, except the
//     initial-events-end bookmark, which is rewritten to last: it is never dropped (watch-list
//     clients wait for it) and a lower RV would move the client's resume point back.
//   - A DELETED for an object whose delete the stream already delivered, or which
//     DeleteMemory holds for this watch's StartRV, is dropped whatever its RV.
//
// Why last+1 for a regressed DELETED: say L is the last RV delivered and D the true revision
// of the delete. The apiserver sends a watch's events in revision order, and every earlier
// event of this watch (L's among them) came before the delete, so L < D, i.e. L+1 <= D.
// A client that resumes from L+1 gets every event with revision > L+1; no event of this watch
// lies in (L, D) (it would have come before the delete), so nothing is skipped. At worst it
// gets the delete itself again, which this stream's delete set and DeleteMemory drop. Any
// higher RV could be above a real event the client has not yet seen, which a resume would
// skip; L itself would not be strictly above the last delivered RV.
func (s *Stream) Decide(ev *stream.Event) Decision {
	s.counts.Events++
	var k kind
	switch ev.Type {
	case stream.Added:
		k = kindAdded
	case stream.Modified:
		k = kindModified
	case stream.Deleted:
		k = kindDeleted
	case stream.Bookmark:
		k = kindBookmark
	case stream.Error:
		return Decision{Reason: ReasonErrorEvent}
	default:
		return Decision{Reason: ReasonUnknownType}
	}

	if s.initial {
		if k == kindAdded {
			if ev.RVIsInt {
				if !s.sawInt || ev.RVInt > s.maxSeen {
					s.maxSeen, s.sawInt = ev.RVInt, true
				}
				return Decision{Reason: ReasonInitial}
			}
			s.counts.NotInteger++
			return Decision{Reason: ReasonNotInteger}
		}
		s.endInitial()
	}
	if s.mode == PassAll {
		s.setLast(ev.RVInt, ev.RVIsInt, ev.RV)
		return Decision{Reason: ReasonExempt}
	}

	d := s.judge(ev, k)

	switch d.Would {
	case Pass:
		if d.Reason == ReasonNotInteger {
			s.counts.NotInteger++
		}
	case Rewrite:
		s.counts.Rewritten++
	case Drop:
		s.counts.Dropped++
		if d.Reason == ReasonDeleteRemembered {
			s.counts.Remembered++
		}
	}
	if d.Would != Pass && len(s.details) < MaxDetails {
		s.addDetail(ev, d)
	}

	d.Action = d.Would
	if s.mode == Observe {
		d.Action = Pass
	}
	switch d.Action {
	case Pass:
		s.setLast(ev.RVInt, ev.RVIsInt, ev.RV)
	case Rewrite:
		s.setLast(d.RVInt, true, "")
	}
	return d
}

// DecideAbsorbedDelete is Decide for a DELETED that internal/watch synthesized, when it
// absorbed a 410 at its resume point, for an object that is gone from the list it took: the
// object's last known state with its resourceVersion set to exactly the last delivered RV R
// (docs/design.md section 12). Such a delete passes at R (Decide would rewrite it to R+1 as a
// regressed delete, and then drop as a replay an ADDED or MODIFIED of the same absorb at
// R+1); it is recorded in the delete set like any delivered delete, so that a replay of the
// real delete is dropped, and it moves no watermark. An event that is not such a delete (not a
// DELETED, not at R, or in the initial phase) is decided by Decide.
func (s *Stream) DecideAbsorbedDelete(ev *stream.Event) Decision {
	if ev.Type != stream.Deleted || s.initial || !ev.RVIsInt || !s.lastIsInt || ev.RVInt != s.lastInt {
		return s.Decide(ev)
	}
	s.counts.Events++
	key, hasKey := keyOf(ev)
	if hasKey {
		if _, ok := s.deletes.lookup(key); ok {
			s.counts.Dropped++
			d := Decision{Would: Drop, Reason: ReasonDeleteDelivered}
			if s.mode != Observe {
				d.Action = Drop
			}
			return d
		}
		s.deletes.add(key.clone(), false)
	}
	return Decision{Reason: ReasonAbsorbedDelete}
}

// endInitial moves to the steady phase with the highest RV seen as the baseline.
func (s *Stream) endInitial() {
	s.initial = false
	if s.sawInt {
		s.wm, s.haveWM = s.maxSeen, true
		s.setLast(s.maxSeen, true, "")
	}
}

// judge applies the steady-phase rules, updating the simulated (Repair) state: the watermark,
// the delete set, the memory chain. It fills Would, Reason and RV.
func (s *Stream) judge(ev *stream.Event, k kind) Decision {
	key, hasKey := keyOf(ev)
	if k == kindDeleted && hasKey {
		if e, ok := s.deletes.lookup(key); ok {
			if e.remembered {
				return Decision{Would: Drop, Reason: ReasonDeleteRemembered}
			}
			return Decision{Would: Drop, Reason: ReasonDeleteDelivered}
		}
	}

	isEnd := k == kindBookmark && ev.InitialEventsEnd
	var d Decision
	switch v := ev.RVInt; {
	case !ev.RVIsInt:
		d.Reason = ReasonNotInteger
	case !s.haveWM || v > s.wm:
		d.Reason = ReasonOK
		if !s.haveWM {
			d.Reason = ReasonNoBaseline
		}
		if isEnd {
			d.Reason = ReasonInitialEventsEnd
		}
		s.wm, s.haveWM = v, true
		// An in-order RV above every rewritten delete: a client resuming from here cannot be
		// replayed those deletes, so the run of rewrites is over.
		s.chain = 0
	case k == kindBookmark:
		switch {
		case v == s.wm && isEnd:
			d.Reason = ReasonInitialEventsEnd
		case v == s.wm:
			d.Reason = ReasonOK
		case isEnd:
			d = s.rewriteTo(s.wm, ReasonInitialEventsEndRegressed)
		default:
			return Decision{Would: Drop, Reason: ReasonBookmarkRegressed}
		}
	case k == kindDeleted:
		if s.wm == math.MaxUint64 {
			d.Reason = ReasonOverflow
			break
		}
		d = s.rewriteTo(s.wm+1, ReasonDeleteRegressed)
		s.wm = d.RVInt
		s.recordRewrite(key, hasKey, v, d.RVInt)
	default:
		return Decision{Would: Drop, Reason: ReasonReplay}
	}

	// Delivered (or, in Observe mode, would be).
	if hasKey {
		switch k {
		case kindDeleted:
			if d.Would != Rewrite { // a rewrite already recorded it
				s.deletes.add(key.clone(), false)
			}
		case kindAdded:
			if key.uid == "" {
				// Without a UID the key is namespace/name, which a recreated object reuses:
				// its next delete is a new one.
				s.deletes.remove(key)
			}
		}
	}
	return d
}

func (s *Stream) rewriteTo(rv uint64, r Reason) Decision {
	return Decision{Would: Rewrite, RV: strconv.FormatUint(rv, 10), RVInt: rv, Reason: r}
}

// recordRewrite remembers a delete of key (none when !hasKey), wire RV wire, rewritten to rv,
// in this stream's delete set and (in Repair mode) in DeleteMemory under (Scope, rv). A delete
// naming no object is recorded too, as a link that keeps the run's chain whole.
//
// A client that resumes from rv is replayed not only this delete but every delete rewritten
// since the last in-order event (their true revisions are all >= their rewritten RVs, and
// may all be > rv), and the deletes this stream's StartRV was remembered for, if no in-order
// event came yet. So each record links to the previous record of the run (s.chain), and a
// lookup follows the links.
func (s *Stream) recordRewrite(key objKey, hasKey bool, wire, rv uint64) {
	if hasKey {
		key = key.clone()
		s.deletes.add(key, false)
	}
	if s.mem == nil || s.mode != Repair {
		return
	}
	s.mem.record(s.scope, rv, key, wire, s.chain)
	s.chain = rv
}

func (s *Stream) addDetail(ev *stream.Event, d Decision) {
	det := RegressionDetail{
		Type:      strings.Clone(ev.Type),
		Namespace: strings.Clone(ev.Namespace),
		Name:      strings.Clone(ev.Name),
		UID:       strings.Clone(ev.UID),
		RV:        strings.Clone(ev.RV),
		Would:     d.Would,
		Reason:    d.Reason,
		NewRV:     d.RV,
	}
	if s.haveWM {
		last := s.wm
		if d.Would == Rewrite && d.Reason == ReasonDeleteRegressed {
			last = d.RVInt - 1 // judge already moved the watermark to the rewrite
		}
		det.Last = strconv.FormatUint(last, 10)
	}
	s.details = append(s.details, det)
}

func (s *Stream) setLastStart(start uint64, isInt bool) {
	s.setLast(start, isInt, s.startRV)
}

// setLast records the RV really written: an integer, or opaque text (copied: it may alias
// the reader's buffer).
func (s *Stream) setLast(v uint64, isInt bool, opaque string) {
	if isInt {
		s.lastInt, s.lastIsInt = v, true
		return
	}
	s.lastIsInt = false
	s.lastOpaque = append(s.lastOpaque[:0], opaque...)
}

// kind is an event's type, once its string is matched.
type kind uint8

const (
	kindAdded kind = iota
	kindModified
	kindDeleted
	kindBookmark
)

// objKey identifies an object: by UID when it has one, else by namespace and name.
type objKey struct {
	uid, ns, name string
}

// keyOf returns ev's object key; false when ev names no object at all.
func keyOf(ev *stream.Event) (objKey, bool) {
	if ev.UID != "" {
		return objKey{uid: ev.UID}, true
	}
	if ev.Name == "" {
		return objKey{}, false
	}
	return objKey{ns: ev.Namespace, name: ev.Name}, true
}

// clone copies the key's strings, which may alias a reader's buffer.
func (k objKey) clone() objKey {
	return objKey{strings.Clone(k.uid), strings.Clone(k.ns), strings.Clone(k.name)}
}

// deleteSet is a bounded set of object keys, forgetting the oldest insertion first.
type deleteSet struct {
	max  int
	m    map[objKey]deleteMark
	ring []deleteSlot // insertion order; when full, ring[head] is the oldest
	head int
	seq  uint64
}

type deleteMark struct {
	seq        uint64 // the insertion that put the key there, to tell stale ring slots
	remembered bool   // came from DeleteMemory
}

type deleteSlot struct {
	key objKey
	seq uint64
}

func (d *deleteSet) lookup(k objKey) (deleteMark, bool) {
	if len(d.m) == 0 {
		return deleteMark{}, false
	}
	e, ok := d.m[k]
	return e, ok
}

// add inserts k, which must not alias a reader's buffer.
func (d *deleteSet) add(k objKey, remembered bool) {
	if d.m == nil {
		d.m = make(map[objKey]deleteMark)
	}
	d.seq++
	slot := deleteSlot{key: k, seq: d.seq}
	if len(d.ring) < d.max {
		d.ring = append(d.ring, slot)
	} else {
		old := d.ring[d.head]
		if e, ok := d.m[old.key]; ok && e.seq == old.seq {
			delete(d.m, old.key)
		}
		d.ring[d.head] = slot
		d.head = (d.head + 1) % d.max
	}
	d.m[k] = deleteMark{seq: d.seq, remembered: remembered}
}

func (d *deleteSet) remove(k objKey) {
	if len(d.m) != 0 {
		delete(d.m, k)
	}
}
