package watch

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/watchsan/watchsan/internal/testutil"
)

// An upstream that ends every stream after one new event (the audit's loop: about 270 requests
// a second for one feed, each resume delivering, so the backoff was reset every time) gets its
// resume requests paced by the brake: after brakeFree at once, at least brakeInitial apart,
// doubling to brakeMax (+-brakeJitter), and never more often than once per 3.75 s from then on.
// A stream that lives brakeOld resets it: the next brakeFree resumes go at once again. The
// client gets every event exactly once, in order, and its stream never ends. On a fake clock
// that passes every wait as soon as it is made: the times are the fake clock's, when each
// request reached the upstream.
func TestBrakeBoundsResumesThatDeliver(t *testing.T) {
	const (
		want   = 30 // events the client reads
		holdAt = 16 // this attempt's stream lives brakeOld (the reset)
	)
	clk := newStepClock()
	var (
		mu      sync.Mutex
		at      []time.Time // when each attempt reached the upstream (fake)
		release = make(chan struct{})
	)
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
		from, _ := strconv.Atoi(r.URL.Query().Get("resourceVersion"))
		mu.Lock()
		at = append(at, clk.Now())
		i := len(at)
		mu.Unlock()
		send(w, obj("ADDED", fmt.Sprint("o", from+1), fmt.Sprint(from+1))) // one new event, then EOF
		if i == holdAt {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	}}}
	f := newFixtureClock(t, Config{}, up, clk)
	waits := clk.stepTimers(t)
	go func() { // the held stream lives brakeOld, then ends
		if testutil.Until(10*time.Second, func() bool { return up.attempts() >= holdAt && f.seen.Load() >= holdAt }) {
			clk.Step(brakeOld + time.Second)
		}
		close(release)
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/api/v1/namespaces/d/configmaps?watch=true&resourceVersion=10", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for i := 1; i <= want; i++ {
		var ev struct {
			Type   string
			Object struct {
				Metadata struct{ ResourceVersion string }
			}
		}
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("event %d: %v (the stream must go on)", i, err)
		}
		if rv := fmt.Sprint(10 + i); ev.Type != "ADDED" || ev.Object.Metadata.ResourceVersion != rv {
			t.Fatalf("event %d: %s at %s, want ADDED at %s: every event exactly once, in order", i, ev.Type, ev.Object.Metadata.ResourceVersion, rv)
		}
		f.seen.Add(1)
	}

	mu.Lock()
	times := append([]time.Time(nil), at[:want]...)
	mu.Unlock()
	// The gap before attempt i+1 (0-based i+1), after a run of young streams.
	young := 0
	for i := 1; i < want; i++ {
		gap := times[i].Sub(times[i-1])
		if i == holdAt { // the held stream lived brakeOld: the brake starts over, no wait
			young = 0
			if gap < brakeOld {
				t.Fatalf("attempt %d came %v after the held one, want its life (%v)", i+1, gap, brakeOld)
			}
			if got := times[i+1].Sub(times[i]); got != 0 {
				t.Fatalf("the first resume after a stream that lived %v waited %v: the brake must have reset", brakeOld, got)
			}
			continue
		}
		young++
		lo := time.Duration(0)
		if young > brakeFree {
			lo = time.Duration(float64(min(brakeInitial<<(young-brakeFree-1), brakeMax)) * (1 - brakeJitter))
		}
		if gap < lo {
			t.Fatalf("attempt %d came %v after attempt %d, after %d young streams: want at least %v (gaps %v)", i+1, gap, i, young, lo, gaps(times))
		}
		if young > brakeFree && gap > 2*brakeMax {
			t.Fatalf("attempt %d waited %v: the brake is at most %v (+%v)", i+1, gap, brakeMax, brakeJitter)
		}
	}
	// Requests per (fake) second, over the loop's first 20 s (before the held stream): the
	// brake's bound is brakeFree+1 at once, then 250ms, 500ms, 1s, 2s, 4s (each -25% at
	// worst), then one per 3.75 s at most. Without it, all holdAt came at once.
	const window = 20 * time.Second
	n := 0
	for _, ti := range times[:holdAt] {
		if ti.Sub(times[0]) < window {
			n++
		}
	}
	if bound := brakeFree + 1 + 5 + int(window/(brakeMax*3/4)) + 1; n > bound {
		t.Fatalf("%d upstream requests in the loop's first fake %v, want at most %d", n, window, bound)
	}
	t.Logf("requests in the loop's first fake %v: %d (%.2f/s); gaps %v", window, n, float64(n)/window.Seconds(), gaps(times))

	// Every wait is the brake's, each one counted, once the watch has ended (the client
	// leaves; the feed may be in a wait then).
	cancel()
	testutil.Eventually(t, 10*time.Second, "the stream's end counted", func() bool {
		return promtest.ToFloat64(f.m.StreamEnds.WithLabelValues(EndClientGone.String())) == 1
	})
	w := waits()
	var h dto.Metric
	if err := f.m.ResumeBrake.Write(&h); err != nil {
		t.Fatal(err)
	}
	if c := h.GetHistogram().GetSampleCount(); c == 0 || int(c) != len(w) {
		t.Fatalf("watchsan_watch_resume_brake_seconds counted %d waits, the clock saw %d: %v", c, len(w), w)
	}
	if v := promtest.ToFloat64(f.m.Resumes.WithLabelValues("eof")); v < want-1 {
		t.Fatalf("resumes{eof} = %v, want at least %d", v, want-1)
	}
}

func gaps(times []time.Time) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(times); i++ {
		out = append(out, times[i].Sub(times[i-1]))
	}
	return out
}

// brakeInterval's schedule: free, then doubling from brakeInitial to brakeMax, within the
// jitter; a stream that lived brakeOld starts it over.
func TestBrakeSchedule(t *testing.T) {
	var b resumeBrake
	now := time.Unix(1000, 0)
	for young := 1; young <= 12; young++ {
		b.started(now)
		w := b.ended(now.Add(10 * time.Millisecond))
		want := time.Duration(0)
		if young > brakeFree {
			want = min(brakeInitial<<(young-brakeFree-1), brakeMax)
		}
		lo, hi := time.Duration(float64(want)*(1-brakeJitter))-10*time.Millisecond, time.Duration(float64(want)*(1+brakeJitter))
		if w < max(lo, 0) || w > hi {
			t.Fatalf("young stream %d: wait %v, want %v +-%v less the 10ms it lived", young, w, want, brakeJitter)
		}
	}
	b.started(now)
	if w := b.ended(now.Add(brakeOld)); w != 0 || b.young != 0 {
		t.Fatalf("a stream that lived %v: wait %v, young %d; want the brake reset", brakeOld, w, b.young)
	}
	b.started(now)
	if w := b.ended(now.Add(brakeInitial * 2)); w != 0 { // young again, but free
		t.Fatalf("after a reset the first young stream waited %v", w)
	}
}
