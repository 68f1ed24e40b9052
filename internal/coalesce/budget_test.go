package coalesce

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/watchsan/watchsan/internal/budget"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/internal/upstream"
)

// blockedWriter is a client that takes the status line and then no byte until released.
type blockedWriter struct {
	header  http.Header
	release chan struct{}
}

func (w *blockedWriter) Header() http.Header { return w.header }
func (w *blockedWriter) WriteHeader(int)     {}
func (w *blockedWriter) Flush()              {}
func (w *blockedWriter) Write(p []byte) (int, error) {
	<-w.release
	return len(p), nil
}

// flushRecorder is a client that reads everything at once.
type flushRecorder struct{ *httptest.ResponseRecorder }

func (w flushRecorder) Flush() {}

func testMetrics() Metrics {
	return Metrics{
		Coalesced:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"kind"}),
		UpstreamReads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "u"}, []string{"kind"}),
		Members:       prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "m"}, []string{"kind"}),
		Lagging:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "l"}, []string{"kind"}),
		Bypassed:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "b"}, []string{"reason"}),
	}
}

// What coalesced reads buffer is counted in the memory budget and given back when they end,
// and while the budget is short a member that stops reading is ended after a few chunks, not
// after --coalesce-lag-bytes: what one stalled client pins is bounded by what the process may
// hold in all (docs/design.md section 15), not by the reads' own total alone.
func TestReadsGiveWayWhileTheBudgetIsShort(t *testing.T) {
	for _, short := range []bool{false, true} {
		mem := budget.New(8 << 20) // high mark 7 MiB
		if short {
			mem.Charge(budget.States, 7<<20+1) // held elsewhere in the process
		}
		bodies := make(chan *io.PipeWriter, 2)
		first := make(chan struct{})
		var sends atomic.Int32
		send := func(ctx context.Context, r *http.Request, cred upstream.Credentials) (*http.Response, func(), error) {
			pr, pw := io.Pipe()
			bodies <- pw
			if sends.Add(1) == 1 {
				<-first // the first read stays in flight until the others joined the next
			}
			return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: pr}, func() {}, nil
		}
		m := testMetrics()
		c := New(Config{Budget: mem}, send, m, zap.NewNop())
		r := httptest.NewRequest("GET", "/api/v1/configmaps", nil)
		r.Header.Set("Authorization", "Bearer x")
		info := reqinfo.Parse(r)
		cred := upstream.Decide(r.Header, nil, false, upstream.IdentityOff)
		key, kind, ok := Classify(r, &info, cred)
		if !ok {
			t.Fatal("not coalescable")
		}
		var wg sync.WaitGroup
		serve := func(w http.ResponseWriter) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() {
					if p := recover(); p != nil && !errors.Is(p.(error), http.ErrAbortHandler) {
						panic(p)
					}
				}()
				c.Serve(w, r.Clone(context.Background()), key, kind, cred)
			}()
		}
		serve(flushRecorder{httptest.NewRecorder()}) // the first read, alone
		testutil.Eventually(t, 5*time.Second, "the first read sent", func() bool { return sends.Load() == 1 })
		stalled := &blockedWriter{header: http.Header{}, release: make(chan struct{})}
		reader := flushRecorder{httptest.NewRecorder()}
		serve(stalled) // these two share the next read
		testutil.Eventually(t, 5*time.Second, "the lead of the next read joined", func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.slots[key] != nil && c.slots[key].next != nil
		})
		serve(reader)
		testutil.Eventually(t, 5*time.Second, "a member joined the next read", func() bool {
			return promtest.ToFloat64(m.Coalesced.WithLabelValues(kind)) == 1
		})
		close(first)
		(<-bodies).Close()
		pw := <-bodies
		chunk := make([]byte, chunkSize)
		for i := 0; i < 16; i++ { // 512 KiB
			if _, err := pw.Write(chunk); err != nil {
				t.Fatal(err)
			}
		}
		lagging := promtest.ToFloat64(m.Lagging.WithLabelValues(kind))
		held := mem.Used()
		if short {
			held -= 7<<20 + 1
		}
		switch {
		case short && lagging != 1:
			t.Errorf("budget short: %v members ended for lagging, want the stalled one", lagging)
		case !short && lagging != 0:
			t.Errorf("budget roomy: %v members ended for lagging, want none within --coalesce-lag-bytes", lagging)
		case short && held > 5*chunkSize:
			t.Errorf("budget short: the read holds %d bytes for a stalled member, want at most 5 chunks", held)
		case !short && held < 15*chunkSize:
			t.Errorf("budget roomy: the read holds %d bytes, want what the stalled member has not read counted", held)
		}
		pw.Close()
		close(stalled.release)
		wg.Wait()
		if short {
			mem.Charge(budget.States, -(7<<20 + 1))
		}
		if got := mem.Used(); got != 0 {
			t.Errorf("short %v: %d bytes of the budget still held after every read ended", short, got)
		}
		if got := reader.Body.Len(); got != 16*chunkSize {
			t.Errorf("short %v: the reading member got %d bytes, want all %d", short, got, 16*chunkSize)
		}
	}
}
