package watch

import (
	"math/rand/v2"
	"time"
)

// DefaultMaxLifetime is Config.MaxLifetime's default: the apiserver's --min-request-timeout
// default (1800 s), with which it ends a watch that has no timeoutSeconds.
const DefaultMaxLifetime = 30 * time.Minute

// No client watch lives for ever (docs/design.md section 2, "timeoutSeconds"). The apiserver
// ends a watch without timeoutSeconds at its --min-request-timeout times a random factor in
// [1, 2) (k8s.io/apiserver endpoints/handlers/get.go, ListResource: "timeout =
// time.Duration(float64(minRequestTimeout) * (rand.Float64() + 1.0))"); watchsan, which
// resumes the upstream watch the apiserver ends, would otherwise keep such a stream for ever.
// So every client stream, private or a shared feed's subscriber, lives at most a lifetime drawn
// the same way from Config.MaxLifetime, or its own timeoutSeconds when that is shorter, and
// then ends cleanly, as the apiserver's does: the client re-watches from its last
// resourceVersion (through a feed, missing nothing), is authorized again by the apiserver or,
// for a reviewed subscriber, by a new access review (package review), and lands on a backend picked
// afresh. Spread over [max, 2*max), the re-watches of clients that came at once (a restart)
// do not come back at once.

// bound applies the rule to the watch's parameters p: p.timeout becomes the drawn lifetime
// when the client gave none, or a longer one, and p.maxLifetime says so. A timeoutSeconds
// already over (negative) is the client's and stays.
func (h *Handler) bound(p params) params {
	if p.timeout < 0 {
		return p
	}
	d := time.Duration(float64(h.cfg.MaxLifetime) * (rand.Float64() + 1))
	if p.timeout > 0 && p.timeout <= d {
		return p
	}
	p.timeout, p.maxLifetime = d, true
	return p
}

// deadlineEnd is how a stream of the watch p ends at its deadline (p.timeout): EndMaxLifetime
// when the deadline is watchsan's, else EndDeadline, the client's own.
func (p params) deadlineEnd() EndReason {
	if p.maxLifetime {
		return EndMaxLifetime
	}
	return EndDeadline
}
