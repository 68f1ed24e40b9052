package watch

import (
	"net/http"

	"github.com/watchsan/watchsan/internal/stream"
)

// What follows an upstream attempt that ended is decided in one place, decideNext, a pure function
// from how it ended (ending) to what the feed does next (verdict), in the style of
// internal/fix: each rule has a stable label, and the table is tested as a table. The feed
// carries the verdicts out (feed.next, feed.resume, feed.absorbError): it ends the client's
// stream, resumes through the Attempter, switches to a move's accepted target, or absorbs a
// 410 at the resume point (docs/design.md section 12) and decides again on how that went. A
// run of absorbs is a loop over verdicts, never a recursion.

// endingHow is what happened to an attempt, or to the feed's try to go on after it.
type endingHow uint8

const (
	// howEnded: the client's stream ends (ending.end says how): the client left, its
	// deadline, shutdown, garbage, memory, an ERROR passed on, a context that ended while the
	// feed tried to go on.
	howEnded endingHow = iota
	// howBroke: the upstream broke (attemptEnd.resume says why); the watch may go on.
	howBroke
	// howResumed: a resume was answered with a stream watchsan reads, in the feed's format.
	howResumed
	// howResumeGone: a resume was answered 410: its resume point is gone there.
	howResumeGone
	// howResumeFailed: no resume answered in time, or only with 5xx or 429 (the Attempter
	// ran out of time retrying them).
	howResumeFailed
	// howResumeRefused: a resume was answered otherwise (a client error; a stream in another
	// format or encoding).
	howResumeRefused
	// howAbsorbed: a 410 at the resume point was absorbed (its subscribers got the
	// difference; the resume point is the list's).
	howAbsorbed
	// howNotAbsorbed: a 410 at the resume point could not be absorbed: it is the client's.
	howNotAbsorbed
)

// ending is what decideNext reads: how it ended, and what the watch could do then.
type ending struct {
	how endingHow
	// end, for howEnded, is how the client's stream ends.
	end EndReason
	// For howBroke: resumable, the watch can resume unnoticed (resume on, the initial phase
	// over, a resume point); overDeadline, its client's deadline passed, maxLifetime that the
	// deadline is the max lifetime's (feed.maxLifetime); moved, a move's target accepted it.
	resumable    bool
	overDeadline bool
	maxLifetime  bool
	moved        bool
}

// step is what the feed does next.
type step uint8

const (
	// stepEnd: the client's stream ends (verdict.end).
	stepEnd step = iota
	// stepGoOn: receive the resumed attempt.
	stepGoOn
	// stepResume: open the watch again from the resume point through the Attempter.
	stepResume
	// stepSwitch: go on on the move's target that accepted the watch (move.go).
	stepSwitch
	// stepAbsorb: absorb the 410 at the resume point with a list, then decide on how it went.
	stepAbsorb
	// stepRelist: the 410 is the client's: it gets an ERROR 410 and relists (EndRelist).
	stepRelist
)

// verdict is decideNext's answer: the step, for stepEnd how the stream ends, and the rule that
// decided, a stable label (nextRules).
type verdict struct {
	step step
	end  EndReason
	rule string
}

// decideNext's rules, the stable labels of verdict.rule.
const (
	ruleEnded          = "ended"
	ruleNoResume       = "no-resume"
	ruleDeadline       = "deadline"
	ruleSwitch         = "switch"
	ruleResume         = "resume"
	ruleResumed        = "resumed"
	ruleAbsorb         = "absorb"
	ruleAbsorbed       = "absorbed"
	ruleNotAbsorbed    = "not-absorbed"
	ruleResumeTimedOut = "resume-timed-out"
	ruleResumeRefused  = "resume-refused"
)

// nextRules lists every rule decideNext applies.
var nextRules = []string{ruleEnded, ruleNoResume, ruleDeadline, ruleSwitch, ruleResume, ruleResumed, ruleAbsorb,
	ruleAbsorbed, ruleNotAbsorbed, ruleResumeTimedOut, ruleResumeRefused}

// decideNext decides what follows an attempt that ended as e.
func decideNext(e ending) verdict {
	switch e.how {
	case howEnded:
		return verdict{step: stepEnd, end: e.end, rule: ruleEnded}
	case howBroke:
		switch {
		case !e.resumable:
			return verdict{step: stepEnd, end: EndNoResume, rule: ruleNoResume}
		case e.overDeadline:
			return verdict{step: stepEnd, end: params{maxLifetime: e.maxLifetime}.deadlineEnd(), rule: ruleDeadline}
		case e.moved:
			// A move's target that accepted the watch meanwhile is where it goes on, whatever
			// ended this attempt (the Cut, or a break that came first).
			return verdict{step: stepSwitch, rule: ruleSwitch}
		}
		return verdict{step: stepResume, rule: ruleResume}
	case howResumed:
		return verdict{step: stepGoOn, rule: ruleResumed}
	case howResumeGone:
		return verdict{step: stepAbsorb, rule: ruleAbsorb}
	case howAbsorbed:
		// Resumed from the list's resourceVersion; a run of absorbs is paced by its own
		// backoff and bounded (absorbGone).
		return verdict{step: stepResume, rule: ruleAbsorbed}
	case howNotAbsorbed:
		return verdict{step: stepRelist, end: EndRelist, rule: ruleNotAbsorbed}
	case howResumeFailed:
		return verdict{step: stepEnd, end: EndResumeTimeout, rule: ruleResumeTimedOut}
	}
	return verdict{step: stepEnd, end: EndResumeRefused, rule: ruleResumeRefused}
}

// readable is the one answer to "is this a stream we can read": resp answered 200, in a
// format internal/stream parses, without a content encoding; and that format.
func readable(resp *http.Response) (stream.Format, bool) {
	format, ok := stream.FormatOf(resp.Header.Get("Content-Type"))
	return format, ok && resp.StatusCode == http.StatusOK && identity(resp.Header)
}

// readsAs says whether resp is a stream the feed reads (readable) in its own format, the first
// answer's: every later attempt, and every list an absorb takes, must answer in it.
func (f *feed) readsAs(resp *http.Response) bool {
	format, ok := readable(resp)
	return ok && format == f.format
}
