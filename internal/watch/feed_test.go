package watch

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// recordingSink is a sink that keeps the calls a feed made, its policy a real fix.Stream.
type recordingSink struct {
	*fix.Stream
	mu    sync.Mutex
	calls []string
}

func (r *recordingSink) note(s string) {
	r.mu.Lock()
	r.calls = append(r.calls, s)
	r.mu.Unlock()
}

func (r *recordingSink) decide(ev *stream.Event) fix.Decision {
	d := r.Decide(ev)
	r.note("decide " + ev.Type + " " + ev.RV + " " + d.Action.String())
	return d
}

func (r *recordingSink) decideGone(ev *stream.Event) fix.Decision {
	d := r.DecideAbsorbedDelete(ev)
	r.note("decide " + ev.Type + " " + ev.RV + " " + d.Action.String())
	return d
}

func (r *recordingSink) write(ev *stream.Event, d fix.Decision) error {
	r.note("write " + ev.Type + " " + ev.RV)
	return nil
}

func (r *recordingSink) flush() error               { r.note("flush"); return nil }
func (r *recordingSink) broken() (EndReason, error) { return endNone, nil }
func (r *recordingSink) gone() bool                 { return false }
func (r *recordingSink) relist(*metav1.Status)      { r.note("relist") }

// The feed keeps sink's contract: each event is decided, then written unless dropped, in the
// upstream's order; nothing is written after a drop of it; what was written is flushed before
// the feed waits for its upstream again and before it returns.
func TestFeedKeepsTheSinkContract(t *testing.T) {
	up := &upstreamScript{steps: []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
		send(w, obj("ADDED", "a", "10"), bookmark("11"))
		send(w, obj("MODIFIED", "a", "10")) // a replay: dropped
		send(w, obj("MODIFIED", "a", "12"))
	}}}
	f := newFixture(t, Config{DisableResume: true}, up)
	sink := &recordingSink{Stream: fix.NewStream(fix.Options{StartRV: "5"})}
	req := httptest.NewRequest("GET", "/api/v1/namespaces/d/configmaps?watch=true&resourceVersion=5", nil)
	fd := &feed{h: f.h, client: req, query: parseParams(req).query, ctx: context.Background(), log: newWatchLog(f.h.log, "", ""), sub: sink, format: stream.JSON,
		backoff: upstream.ResumeBackoff, scope: parseParams(req).scope, groupResource: "configmaps"}
	first, err := f.h.deps.Attempts.Do(fd.ctx, fd.requestFrom(true, ""), fd.plan(5))
	if err != nil {
		t.Fatal(err)
	}
	if end := fd.run(fd.source(first)); end != EndNoResume {
		t.Fatalf("ended %v, want %v (resume disabled)", end, EndNoResume)
	}
	calls := sink.calls
	var decided, written []string
	for i, c := range calls {
		switch {
		case strings.HasPrefix(c, "decide "):
			decided = append(decided, c)
			if strings.HasSuffix(c, " dropped") && i+1 < len(calls) && strings.HasPrefix(calls[i+1], "write ") {
				t.Fatalf("a dropped event was written: %q", calls)
			}
		case strings.HasPrefix(c, "write "):
			written = append(written, c)
			if i == 0 || !strings.HasPrefix(calls[i-1], "decide "+strings.TrimPrefix(c, "write ")+" ") {
				t.Fatalf("write %q not right after its decision: %q", c, calls)
			}
		}
	}
	if got, want := strings.Join(written, ", "), "write ADDED 10, write BOOKMARK 11, write MODIFIED 12"; got != want || len(decided) != 4 {
		t.Fatalf("written [%s], want [%s], after 4 decisions: %q", got, want, calls)
	}
	if calls[len(calls)-1] != "flush" {
		t.Fatalf("the feed returned with writes unflushed: %q", calls)
	}
	if sink.LastDelivered() != "12" {
		t.Fatalf("resume point %q, want 12", sink.LastDelivered())
	}
}
