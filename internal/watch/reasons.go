package watch

import "strconv"

// EndReason is why a client's watch stream ended; its String is the stable value of
// watchsan_watch_stream_ends_total's reason label.
type EndReason uint8

const (
	endNone EndReason = iota // the stream goes on
	// EndClientGone: the client went away.
	EndClientGone
	// EndDeadline: the client's timeoutSeconds passed (ended cleanly, as the apiserver does).
	EndDeadline
	// EndShutdown: watchsan is shutting down (ended cleanly; the client re-watches elsewhere).
	EndShutdown
	// EndMalformed: the upstream sent garbage (ended cleanly).
	EndMalformed
	// EndResumeTimeout: resuming made no progress within the resume timeout (ended cleanly).
	EndResumeTimeout
	// EndResumeRefused: the upstream refused the resumed watch with a client error.
	EndResumeRefused
	// EndRelist: the resume point is gone (410); the client got an ERROR 410 and relists.
	EndRelist
	// EndNoResume: the upstream broke where no resume is possible (initial phase, resume
	// disabled, no resume point); ended cleanly.
	EndNoResume
	// EndUpstreamError: the upstream sent an ERROR event, passed on; the stream ends with it.
	EndUpstreamError
	// EndSlowClient: a write to the client did not complete within the write timeout (it
	// stopped reading, or reads slower than its watch delivers); the stream is cut there, and
	// its upstream watch closed.
	EndSlowClient
	// EndMaxLifetime: the stream reached its lifetime, Config.MaxLifetime randomized as the
	// apiserver's watch timeout (lifetime.go): its client gave no timeoutSeconds, or a longer
	// one. Ended cleanly; the client re-watches from its last resourceVersion.
	EndMaxLifetime
	// EndMemory: the memory budget refused what the watch needed (a frame's buffer): it held
	// more than its share while memory ran short (package budget). Ended cleanly; the client
	// re-watches from its last resourceVersion.
	EndMemory
	// EndRebalance: the server shed the client's connection to even out the replicas of a
	// frontend (Deps.Rebalance, docs/design.md section 10.12). Ended cleanly; the client
	// re-watches from its last resourceVersion, on another connection.
	EndRebalance

	numEndReasons
)

// endHandedOff: a private feed's watch-list moved onto a shared feed (handoff.go); its stream
// goes on there. Never a stream's end, so in no metric.
const endHandedOff = numEndReasons + 1

var endNames = [numEndReasons]string{
	endNone:          "none",
	EndClientGone:    "client-gone",
	EndDeadline:      "client-deadline",
	EndShutdown:      "shutdown",
	EndMalformed:     "upstream-malformed",
	EndResumeTimeout: "resume-timeout",
	EndResumeRefused: "resume-refused",
	EndRelist:        "relist-forced",
	EndNoResume:      "upstream-broke",
	EndUpstreamError: "upstream-error-event",
	EndSlowClient:    "slow-client",
	EndMaxLifetime:   "max-lifetime",
	EndMemory:        "memory-budget",
	EndRebalance:     "rebalance",
}

func (r EndReason) String() string {
	if r < numEndReasons {
		return endNames[r]
	}
	return "EndReason(" + strconv.Itoa(int(r)) + ")"
}

// EndReasons lists every reason a stream can end with (to initialise metric series).
func EndReasons() []EndReason {
	out := make([]EndReason, 0, numEndReasons-1)
	for r := EndClientGone; r < numEndReasons; r++ {
		out = append(out, r)
	}
	return out
}

// SlowClientReasons are the values of watchsan_watch_slow_clients_total's reason label: what
// the client did not take within the write timeout.
var SlowClientReasons = []string{
	// slowEvents: the events of a watch stream watchsan parses.
	slowEvents,
	// slowRelayed: a watch response relayed unparsed (an error status, a format or encoding
	// watchsan does not read).
	slowRelayed,
}

const (
	slowEvents  = "events"
	slowRelayed = "relayed"
)

// ResumeReason is why an upstream watch broke and was resumed; its String is the stable value
// of watchsan_watch_resumes_total's reason label.
type ResumeReason uint8

const (
	// ResumeEOF: the upstream ended the watch cleanly (its own timeout, a restart).
	ResumeEOF ResumeReason = iota
	// ResumeReset: the connection broke (reset, GOAWAY, a failed ping).
	ResumeReset
	// ResumeTruncated: the stream ended inside an event.
	ResumeTruncated
	// ResumeStall: the upstream sent nothing, not even a bookmark, for the stall timeout.
	ResumeStall
	// ResumeMoved: watchsan moved the watch to another upstream (upstream.MoveReason: the
	// upstream failed, lagged, left, or another one has fewer watches).
	ResumeMoved
	// ResumeGoneHere: the upstream answered the resume point with 410 ("too old resource
	// version") while another one may still serve it (docs/design.md section 10.1).
	ResumeGoneHere
	// ResumeGoneAbsorbed: the upstream answered the resume point with 410, and the feed
	// absorbed it with a list (docs/design.md section 12): resumed from the list's
	// resourceVersion.
	ResumeGoneAbsorbed

	numResumeReasons
)

var resumeNames = [numResumeReasons]string{
	ResumeEOF:          "eof",
	ResumeReset:        "reset",
	ResumeTruncated:    "truncated",
	ResumeStall:        "stall",
	ResumeMoved:        "moved",
	ResumeGoneHere:     "gone-here",
	ResumeGoneAbsorbed: "gone-absorbed",
}

func (r ResumeReason) String() string {
	if r < numResumeReasons {
		return resumeNames[r]
	}
	return "ResumeReason(" + strconv.Itoa(int(r)) + ")"
}

// ResumeReasons lists every resume reason (to initialise metric series).
func ResumeReasons() []ResumeReason {
	out := make([]ResumeReason, 0, numResumeReasons)
	for r := ResumeReason(0); r < numResumeReasons; r++ {
		out = append(out, r)
	}
	return out
}
