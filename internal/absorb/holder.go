package absorb

import (
	"errors"
	"fmt"
	"time"

	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// Holder is a feed's hold on its state: the state its deliveries keep (nil: none), the key it
// is parked by, why it holds none, and the pacing of its absorbs. The zero value holds none
// and says no why ("": absorbing is off). Every field is written here only; the feed's
// goroutine calls its methods once the feed runs, its maker before (a shared feed's registry,
// under its lock, before the feed's goroutine starts).
type Holder struct {
	state *State
	// key is what state is parked by when its feed ends (Park), set with it.
	key string
	// why is why state is nil (an Outcomes value; "": absorbing is off, or a state is held).
	why string
	// pacing, made at the first absorb, paces a run of them (Pace).
	pacing *pacing
}

// Hold makes s, parked by key when its feed ends, the state held; one held before is freed.
func (h *Holder) Hold(s *State, key string) {
	if h.state != nil && h.state != s {
		h.state.Free()
	}
	h.state, h.key, h.why = s, key, ""
}

// None frees the state held, if any, and holds none from now on; why says why (an Outcomes
// value).
func (h *Holder) None(why string) {
	if h.state != nil {
		h.state.Free()
	}
	h.state, h.key, h.why = nil, "", why
}

// State is the state held, nil for none (read only: Observe updates it).
func (h *Holder) State() *State { return h.state }

// Take moves the state held out (a handoff's: the feed keeps none from then on, and a later
// 410 is its client's), with why when there is none.
func (h *Holder) Take() (*State, string) {
	s, why := h.state, h.why
	h.state, h.key, h.why = nil, "", NotComplete
	if s == nil && why == "" {
		why = NotComplete
	}
	return s, why
}

// Free frees the state held, if any (its feed ended and it cannot be parked); why is kept.
func (h *Holder) Free() {
	if h.state != nil {
		h.state.Free()
		h.state, h.key = nil, ""
	}
}

// Park parks the state held, complete at the feed's last delivered resourceVersion rv, in p
// for the next watch from there, or frees it when it is not complete there: dropped, still in
// its initial phase (initial), rv not an integer, or the feed's format one absorbing does not
// read. It holds none after.
func (h *Holder) Park(p *Parked, format stream.Format, rv string, initial bool) {
	s, key := h.state, h.key
	if s == nil {
		return
	}
	h.state, h.key = nil, ""
	if _, ok := stream.ParseRV(rv); ok && s.dropped == "" && !initial && stream.ListCodecFor(format) != nil {
		p.Park(key, rv, s)
		return
	}
	s.Free()
}

// Observe updates the state held with an event delivered: the Outcomes value why the state
// was dropped, once, when this event dropped it; else "".
func (h *Holder) Observe(ev *stream.Event) string {
	s := h.state
	if s == nil || s.dropped != "" || s.Observe(ev) {
		return ""
	}
	return s.dropped
}

// Unable is why a 410 at the feed's resume point cannot be absorbed (an Outcomes value), ""
// when it can; resumable says the feed has a resume point a list can be compared with (an
// integer resourceVersion, past its initial phase).
func (h *Holder) Unable(resumable bool) string {
	why := h.why
	switch {
	case h.state == nil && why == "":
		why = NotComplete
	case h.state != nil && h.state.dropped != "":
		why = h.state.dropped
	}
	if why == "" && !resumable {
		why = NotComplete
	}
	return why
}

// maxRun bounds the absorbs in a row with no sign of the upstream's progress between them (an
// upstream that answers 410 to every list's resourceVersion): each after the first waits the
// absorb backoff, and the one after these sends the 410.
const maxRun = 8

// pacing paces a run of absorbs with no sign of progress between them: run of them, the last
// at at, when the feed's progress count (Pace) was progress; each list after the run's first
// waits backoff's next step.
type pacing struct {
	backoff  upstream.Backoff
	run      int
	progress uint64
	at       time.Time
}

// Pace counts an absorb about to list, now, the feed's progress count being progress: a count
// that grows with every sign that the upstream got past the last absorb's resourceVersion (an
// upstream event handed to the feed's sink, or an upstream stream that lived long enough to be
// no loop's; the feed's brake decides that). A run of absorbs with no progress between them,
// within window (the resume timeout) of the last, is paced by its own backoff and bounded,
// since an upstream that answers 410 to every list's resourceVersion costs a list per backoff
// step: its resumed streams are refused or end young. Independent 410s on a quiet watch (no
// events, no bookmarks: a resource without the watch cache), each after a resumed stream that
// lived, are each a run of their own. It returns the absorb's place in its run (1: the first,
// whose list goes at once), and false when the run is over its bound (the client relists).
func (h *Holder) Pace(progress uint64, now time.Time, window time.Duration) (int, bool) {
	pc := h.pacing
	if pc == nil {
		pc = &pacing{backoff: upstream.ResumeBackoff}
		h.pacing = pc
	}
	if progress != pc.progress || now.Sub(pc.at) > window {
		pc.backoff.Reset()
		pc.run = 0
	}
	pc.run++
	return pc.run, pc.run <= maxRun
}

// Backoff is what an absorb's first page waits on after the first absorb of a run (Pace made
// it); the Attempter steps it.
func (h *Holder) Backoff() *upstream.Backoff { return &h.pacing.backoff }

// Absorbed records an absorb done at now, the feed's progress count (Pace) being progress: the
// next 410 with the count unchanged since is the same run's.
func (h *Holder) Absorbed(progress uint64, now time.Time) {
	h.pacing.progress, h.pacing.at = progress, now
}

// Diff is the events, in the feed's format, that take the state held to the list l, in the
// order they are to be sent (the bookmark at l's resourceVersion last), for the last delivered
// resourceVersion R; maxFrame is the largest frame the feed reads. An error: the list does not
// agree with the state, and nothing may be sent.
func (h *Holder) Diff(format stream.Format, l *Listed, R uint64, maxFrame int) ([]Event, error) {
	if h.state == nil {
		return nil, errors.New("no state")
	}
	return diff(format, h.state, l, R, maxFrame)
}

// Complete makes the feed hold, parked by key, the state of the list l its scope had at exactly
// resourceVersion c (docs/design.md section 12, the completing list): listErr is the list's
// failure. It returns the CompletingListResults value, and the error when not CompleteDone
// (the feed then holds none: NotComplete). It frees l.
func (h *Holder) Complete(b *Budget, format stream.Format, key string, c string, l *Listed, listErr error) (string, error) {
	if listErr != nil {
		h.None(NotComplete)
		switch {
		case errors.Is(listErr, ErrListGone):
			return CompleteGone, listErr
		case errors.Is(listErr, ErrListBudget):
			return CompleteOverBudget, listErr
		}
		return CompleteFailed, listErr
	}
	defer l.Free()
	if want, _ := stream.ParseRV(c); l.rv != want {
		h.None(NotComplete)
		return CompleteFailed, fmt.Errorf("the exact list answered at %d", l.rv)
	}
	s, ok := stateOfList(b, format, l)
	if !ok {
		h.None(NotComplete)
		return CompleteOverBudget, ErrListBudget
	}
	h.Hold(s, key)
	return CompleteDone, nil
}
