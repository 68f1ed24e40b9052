package demo

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/watchsan/watchsan/test/cluster"
)

func TestEmbeddedDemoShowsTheIncidentAndTheFix(t *testing.T) {
	before := runtime.NumGoroutine()
	begin := time.Now()
	res, err := Run(context.Background(), Options{Log: zaptest.NewLogger(t), Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, res)
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("the demo took %s; it should take a few seconds", d)
	}

	// Everything it started is gone: servers, watchsan, informers, watches.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before+2 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before the demo, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRealDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real control plane; skipped in -short mode")
	}
	if _, err := cluster.Binaries(); err != nil {
		t.Skipf("no cached control plane: %v", err)
	}
	res, err := Run(context.Background(), Options{Real: true, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, res)
}

// checkResult asserts the facts the report states.
func checkResult(t *testing.T, res *Result) {
	t.Helper()
	var report bytes.Buffer
	res.WriteReport(&report)
	defer func() {
		if t.Failed() {
			t.Logf("report:\n%s", report.String())
		}
	}()

	// The truth: a, the others, b's update, a's delete, the marker, each once.
	if len(res.Truth) != 3+3+1 || res.Truth[len(res.Truth)-1].Name != markerName {
		t.Fatalf("the apiserver's own stream: %v", res.Truth)
	}

	// Without watchsan the bug shows: replays, and a deleted a second time.
	d := &res.Direct
	if d.Replays < 1 {
		t.Errorf("direct informer: %d replayed events, want at least 1", d.Replays)
	}
	if n := d.Deletes("a"); n < 2 {
		t.Errorf("direct informer: OnDelete(a) %d times, want at least 2", n)
	}
	if d.WentBack < 1 {
		t.Errorf("direct informer: no delete went back in time")
	}

	// Through watchsan: exactly the truth.
	w := &res.Through
	if n := w.Deletes("a"); n != 1 {
		t.Errorf("through watchsan: OnDelete(a) %d times, want 1", n)
	}
	if w.Replays+w.DeletedAgain+w.Unexplained+w.WentBack != 0 {
		t.Errorf("through watchsan: %d replays, %d repeated deletes, %d unexplained, %d went back; want none",
			w.Replays, w.DeletedAgain, w.Unexplained, w.WentBack)
	}
	if len(w.Missing) != 0 {
		t.Errorf("through watchsan: missed %v", w.Missing)
	}
	if len(w.Calls) != len(res.Truth) {
		t.Errorf("through watchsan: %d handler calls for %d writes", len(w.Calls), len(res.Truth))
	}
	var last uint64
	for _, c := range w.Calls {
		rv, ok := parseRV(c.RV)
		if !ok || rv <= last {
			t.Errorf("through watchsan: %s %s rv %s after rv %d: resourceVersions must increase", c.Handler, c.Name, c.RV, last)
		}
		last = rv
	}
	if !w.StoreMatches {
		t.Errorf("through watchsan: store differs from a fresh list: %s", w.StoreDiff)
	}

	// watchsan says what it did.
	c := res.Counters
	if c.Action("DELETED", "rewritten") < 1 || c.Action("DELETED", "dropped") < 1 {
		t.Errorf("watchsan's counters: %v; want a rewritten and a dropped DELETED", c.Events)
	}
	if c.StreamsRegressed < 1 || c.RememberedDeletes < 1 {
		t.Errorf("watchsan's counters: %g streams regressed, %g remembered deletes; want at least 1 each", c.StreamsRegressed, c.RememberedDeletes)
	}
	// The fault layers really fired for both.
	for i, st := range res.Faults {
		if st.DeletesRewritten < 1 || st.EndedAfterDelete != 1 {
			t.Errorf("fault layer %d: %+v", i, st)
		}
	}

	if !res.OK() {
		t.Errorf("Problems: %v", res.Problems())
	}
	for _, want := range []string{"WITHOUT WATCHSAN", "THROUGH WATCHSAN", "<< DELETED AGAIN", "<< REPLAY", "watchsan_watch_events_total", "VERDICT: without watchsan"} {
		if !strings.Contains(report.String(), want) {
			t.Errorf("the report lacks %q", want)
		}
	}
}

// judge is the demo's oracle: it must tell a faithful sequence from a replaying one.
func TestJudge(t *testing.T) {
	truth := []Write{
		{"ADDED", "a", "2"}, {"ADDED", "b", "3"}, {"MODIFIED", "b", "4"}, {"DELETED", "a", "6"}, {"ADDED", "m", "7"},
	}
	rec := func(calls ...Call) *informer {
		r := &recorder{}
		for _, c := range calls {
			r.record(c)
		}
		return &informer{rec: r}
	}
	faithful := judge("", rec(
		Call{Handler: OnAdd, Name: "a", RV: "2"}, Call{Handler: OnAdd, Name: "b", RV: "3"},
		Call{Handler: OnUpdate, Name: "b", RV: "4", OldRV: "3"}, Call{Handler: OnDelete, Name: "a", RV: "5"},
		Call{Handler: OnAdd, Name: "m", RV: "7"},
	), truth)
	if faithful.Replays+faithful.DeletedAgain+faithful.Unexplained+faithful.WentBack != 0 || len(faithful.Missing) != 0 {
		t.Fatalf("faithful sequence judged %+v", faithful)
	}
	if !strings.Contains(faithful.Calls[3].Note, "rewrote the rv 2") {
		t.Errorf("rewritten delete's note: %q", faithful.Calls[3].Note)
	}

	buggy := judge("", rec(
		Call{Handler: OnAdd, Name: "a", RV: "2"}, Call{Handler: OnAdd, Name: "b", RV: "3"},
		Call{Handler: OnUpdate, Name: "b", RV: "4", OldRV: "3"}, Call{Handler: OnDelete, Name: "a", RV: "2"},
		Call{Handler: OnUpdate, Name: "b", RV: "3", OldRV: "4"}, Call{Handler: OnUpdate, Name: "b", RV: "4", OldRV: "3"},
		Call{Handler: OnDelete, Name: "a", RV: "2"}, Call{Handler: OnAdd, Name: "x", RV: "9"},
	), truth)
	if buggy.WentBack != 1 || buggy.Replays != 2 || buggy.DeletedAgain != 1 || buggy.Unexplained != 1 ||
		len(buggy.Missing) != 1 || buggy.Deletes("a") != 2 {
		t.Fatalf("buggy sequence judged %+v", buggy)
	}
	if got := buggy.Calls[4].Note; got != "REPLAY: b went back from rv 4" {
		t.Errorf("note %q", got)
	}
	res := &Result{Deleted: "a", Direct: buggy, Through: buggy}
	if res.OK() {
		t.Error("a buggy side through watchsan passed")
	}
}
