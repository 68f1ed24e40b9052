package upstream

import (
	"math/rand/v2"
	"time"
)

// Backoff is exponential backoff with jitter, the one used by every loop that talks to an
// upstream: request retries, watch resumes and the health checker's probes of a down backend.
// Next returns Initial, then doubles up to Max; each delay is drawn uniformly from
// [d*(1-Jitter), d*(1+Jitter)] so that many waiters do not retry in step. The zero value is not
// useful; copy one of the presets. A Backoff is not safe for concurrent use.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
	// Jitter is the relative spread, 0 to 1.
	Jitter float64

	n int // delays handed out since the last Reset
}

// The presets.
var (
	// RequestBackoff paces the retries of one request: it must answer in seconds.
	RequestBackoff = Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.25}
	// ResumeBackoff paces the resumes of one watch that make no progress; client-go's reflector
	// backs off its own re-watches from 800ms to 30s, and a proxy must be no more eager.
	ResumeBackoff = Backoff{Initial: 800 * time.Millisecond, Max: 30 * time.Second, Jitter: 0.25}
)

// Next returns the next delay.
func (b *Backoff) Next() time.Duration {
	d := b.Initial
	for i := 0; i < b.n && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	b.n++
	if b.Jitter <= 0 || d <= 0 {
		return d
	}
	spread := float64(d) * min(b.Jitter, 1)
	return time.Duration(float64(d) - spread + rand.Float64()*2*spread)
}

// Reset starts over from Initial (after progress).
func (b *Backoff) Reset() { b.n = 0 }

// Failures reports how many delays were handed out since the last Reset.
func (b *Backoff) Failures() int { return b.n }
