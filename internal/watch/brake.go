package watch

import (
	"math/rand/v2"
	"time"
)

// The resume brake (docs/design.md section 5, "The resume brake"). The backoff paces resumes
// that deliver nothing; a resume that delivers an event resets it, so an upstream that ends
// every stream after one new event was asked again at once, for ever (about 270 requests a
// second for one feed on two cores). The brake paces a feed's resume requests by how young
// its streams end, whatever they delivered: after brakeFree streams in a row that lived less
// than brakeOld, each next resume request starts no sooner than an interval after the one
// before it started, the interval doubling from brakeInitial up to brakeMax (+-brakeJitter);
// one stream that lives brakeOld resets it. A stream that lived brakeOld costs at most one
// request per brakeOld by itself, the brake's own bound, so it needs none; healthy streams
// live the apiserver's 30-60 min (section 2) and never wait. It is client-go's reflector's
// backoff manager (tools/cache/reflector.go: 800 ms doubling to 30 s, reset once nothing backed
// off for 2 min) scaled to streams that do deliver: every event still reaches the client, one
// request per brakeMax at worst, and the brake never ends a stream.
const (
	// brakeFree young streams in a row resume at once: a resume onto a backend that restarts
	// just then, a move soon after (watchsan's own), are one-offs, not a loop.
	brakeFree = 2
	// brakeOld: a stream that lived this long was no loop's; the brake starts over.
	brakeOld     = brakeMax
	brakeInitial = 250 * time.Millisecond
	brakeMax     = 5 * time.Second
	brakeJitter  = 0.25
)

// resumeBrake is a feed's brake. The zero value has seen no stream.
type resumeBrake struct {
	// since is when the feed's current attempt became its own (receiving); zero: none yet.
	since time.Time
	// young counts the streams in a row that ended younger than brakeOld; 0: none.
	young int
	// old counts the streams that lived brakeOld, all told: each is a sign that the upstream
	// got past where the stream began (absorb pacing, absorb.go).
	old uint64
}

// started records that the feed's attempt became its own at now.
func (b *resumeBrake) started(now time.Time) { b.since = now }

// ended records that the feed's attempt ended at now, and returns how long the resume that
// follows must wait (0: none): what is left of the brake's interval since the attempt
// started.
func (b *resumeBrake) ended(now time.Time) time.Duration {
	lived := now.Sub(b.since)
	if b.since.IsZero() || lived >= brakeOld {
		if !b.since.IsZero() {
			b.old++
		}
		b.young = 0
		return 0
	}
	b.young++
	return max(0, brakeInterval(b.young)-lived)
}

// brakeInterval is the least time between the starts of two resume requests after young
// streams in a row ended young: 0 for the first brakeFree, then brakeInitial doubling up to
// brakeMax, each +-brakeJitter so that many feeds braked at once do not ask in step.
func brakeInterval(young int) time.Duration {
	if young <= brakeFree {
		return 0
	}
	d := brakeInitial
	for i := brakeFree + 1; i < young && d < brakeMax; i++ {
		d *= 2
	}
	d = min(d, brakeMax)
	spread := float64(d) * brakeJitter
	return time.Duration(float64(d) - spread + rand.Float64()*2*spread)
}
