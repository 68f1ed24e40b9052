package absorb

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/stream"
)

// BenchmarkFeedState is what keeping a feed's state (State) costs per delivered event,
// against reading the same event, measured in the same run: a JSON stream of 1 KiB ConfigMap
// MODIFIED events cycling over 1,000 objects, read by the stream package's Reader (the
// baseline: what every feed does with an event) and, on the same bytes, also observed into a
// state (a copy of the frame, a map update, the budget's accounting). "state-x" is the cost of
// read plus observe over the cost of read alone.
func BenchmarkFeedState(b *testing.B) {
	const objects, perRun = 1000, 4000
	pad := strings.Repeat("x", 900)
	var buf bytes.Buffer
	for i := range perRun {
		fmt.Fprintf(&buf, `{"type":"MODIFIED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm-%d","namespace":"bench","uid":"uid-%d","resourceVersion":"%d"},"data":{"v":%q}}}`+"\n",
			i%objects, i%objects, 1000+i, pad)
	}
	stream1 := buf.Bytes()
	read := func(observe func(*stream.Event)) time.Duration {
		start := time.Now()
		r := stream.NewReader(stream.JSON, bytes.NewReader(stream1), 1<<20)
		for {
			ev, err := r.Next()
			if err != nil {
				break
			}
			if observe != nil {
				observe(ev)
			}
		}
		return time.Since(start)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(stream1)))
	var base, with time.Duration
	for b.Loop() {
		s := NewState(NewBudget(DefaultStateBytes, DefaultTotalBytes, nil, nil), stream.JSON)
		base += read(nil)
		with += read(func(ev *stream.Event) {
			if !s.Observe(ev) {
				b.Fatalf("the state was dropped: %s", s.dropped)
			}
		})
		if len(s.objs) != objects {
			b.Fatalf("the state holds %d objects, want %d", len(s.objs), objects)
		}
		s.Free()
	}
	n := float64(b.N) * perRun
	b.ReportMetric(float64(base.Nanoseconds())/n, "ns/event-read")
	b.ReportMetric(float64((with-base).Nanoseconds())/n, "ns/event-state")
	b.ReportMetric(float64(with)/float64(base), "state-x")
}
