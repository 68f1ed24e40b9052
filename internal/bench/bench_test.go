package bench

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/cli"
	"github.com/watchsan/watchsan/internal/stream"
)

// childEnv makes the test binary act as a child process: watchsan itself (the same code as
// cmd/watchsan) or a baseline proxy, so the smoke test needs no build step.
const childEnv = "WATCHSAN_BENCH_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "watchsan":
		os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
	case "proxy":
		os.Exit(ChildMain(os.Args[1:], os.Stderr))
	}
	os.Exit(m.Run())
}

func testLauncher(t *testing.T) Launcher {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Launcher{
		// Under -race a process sleeps a second at exit unless told not to.
		Baseline: []string{self}, BaselineEnv: []string{childEnv + "=proxy", "GORACE=atexit_sleep_ms=0"},
		Watchsan: []string{self}, WatchsanEnv: []string{childEnv + "=watchsan", "GORACE=atexit_sleep_ms=0"},
		HAProxy: lookPath("haproxy"),
	}
}

// TestBenchSmoke runs every path for a moment with tiny workloads and checks the harness
// itself: every path delivered every event in order, the rewrite of the regressing deletes is
// visible through watchsan's repair mode and through no other path, and the report renders.
func TestBenchSmoke(t *testing.T) {
	cfg := ShortConfig()
	cfg.Launcher = testLauncher(t)
	cfg.FanOutClients = nil // a real kube-apiserver's: TestShareFanOut (test/e2e) runs that code
	if cfg.Launcher.HAProxy == "" {
		t.Log("haproxy is not installed: its path is skipped")
	}
	RaiseFDLimit(4096)
	var progress bytes.Buffer
	cfg.Progress = &progress
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := time.Now()
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ran in %v:\n%s", time.Since(start).Round(time.Millisecond), progress.String())
	for _, e := range res.Errors {
		t.Errorf("run error: %s", e)
	}
	for name, why := range res.Skipped {
		if name != HAProxy || cfg.Launcher.HAProxy != "" {
			t.Errorf("%s skipped: %s", name, why)
		}
	}
	measured := map[PathName]bool{}
	for _, tr := range res.Throughput {
		measured[tr.Path] = true
		for _, s := range tr.Samples {
			want := tr.PerWatch * tr.Watches
			if s.Err != "" || s.Cut || s.Events != want {
				t.Errorf("%s %s: %d of %d events, cut=%v, err=%q", tr.Path, tr.Key(), s.Events, want, s.Cut, s.Err)
			}
			wantRW := 0
			if tr.Path == WatchsanRepair {
				wantRW = tr.Watches * tr.PerWatch / cfg.DeleteEvery
			}
			if s.Rewritten != wantRW {
				t.Errorf("%s %s: %d events arrived with a rewritten resourceVersion, want %d", tr.Path, tr.Key(), s.Rewritten, wantRW)
			}
			// Only the re-encoding proxy may change bytes; everything else relays them as sent.
			if tr.Path != Decode && s.Parsed != 0 {
				t.Errorf("%s %s: %d events differed in bytes from what was sent", tr.Path, tr.Key(), s.Parsed)
			}
		}
	}
	for _, p := range cfg.Paths {
		if !measured[p] && (p != HAProxy || cfg.Launcher.HAProxy != "") {
			t.Errorf("%s: no throughput result", p)
		}
	}
	for _, l := range res.Latency {
		if !l.Complete || l.P50 <= 0 || l.Samples[0].Samples == 0 {
			t.Errorf("latency %s: complete=%v p50=%v samples=%d err=%q", l.Path, l.Complete, l.P50, l.Samples[0].Samples, l.Samples[0].Err)
		}
	}
	for _, f := range res.TTFE {
		if f.Err != "" || f.N != cfg.TTFEWatches || f.P50 <= 0 {
			t.Errorf("time to first event %s: n=%d p50=%v err=%q", f.Path, f.N, f.P50, f.Err)
		}
	}
	if len(res.Memory) == 0 {
		t.Error("no memory result")
	}
	for _, m := range res.Memory {
		for _, s := range m.Samples {
			if s.Err != "" || s.RSSAfterKiB <= 0 {
				t.Errorf("memory %s at %d watches: rss=%d err=%q", m.Path, m.Watches, s.RSSAfterKiB, s.Err)
			}
		}
	}

	dir := t.TempDir()
	if err := WriteReport(dir, res); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Targets", "## Throughput at saturation", "| json/1KiB/1w | watchsan-repair |", "load average"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("README.md lacks %q", want)
		}
	}
	for _, name := range []string{"throughput.png", "latency.png", "memory.png"} {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := png.Decode(f); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		f.Close()
	}
}

// TestClientChecksEvents holds the client's checks to account: a path that rewrites nothing
// fails a watch that expects the repair, a stream that loses an event fails, and a stream
// re-encoded into different bytes is still checked, parsed.
func TestClientChecksEvents(t *testing.T) {
	set, err := NewEventSet(Workload{Format: stream.JSON, ObjectSize: 1024, Events: 40, DeleteEvery: 10, BaseRV: 1000})
	if err != nil {
		t.Fatal(err)
	}
	up := NewUpstream()
	up.Set("ok", &Scenario{Set: set, Count: 40})
	srv := httptest.NewServer(up)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hc := newClient(32 << 10)
	defer hc.CloseIdleConnections()
	sc := &Scenario{Set: set, Count: 40}

	if r := runWatch(ctx, hc, watchOpts{base: srv.URL, ns: "ok", sc: sc}); r.err != nil || r.events != 40 || r.exact != 40 || r.rewritten != 0 {
		t.Errorf("direct: %+v", r)
	}
	if r := runWatch(ctx, hc, watchOpts{base: srv.URL, ns: "ok", sc: sc, repaired: true}); r.err == nil || r.events != 9 {
		t.Errorf("a path without repair passed a check for repaired events: events=%d err=%v", r.events, r.err)
	}

	// A proxy that loses the 5th event.
	lossy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		for i, ev := range set.events {
			if i != 4 {
				_, _ = w.Write(ev.frame)
			}
		}
	}))
	defer lossy.Close()
	if r := runWatch(ctx, hc, watchOpts{base: lossy.URL, ns: "ok", sc: sc}); r.err == nil || r.events != 4 {
		t.Errorf("a lost event went unnoticed: events=%d err=%v", r.events, r.err)
	}

	// The decode/re-encode baseline, in process: every event must arrive, checked, however
	// it was re-encoded; with repair expected it must fail on the first regressing delete.
	u, _ := url.Parse(srv.URL)
	dec := httptest.NewServer(NewDecodeProxy(u, upstreamTransport(nil)))
	defer dec.Close()
	if r := runWatch(ctx, hc, watchOpts{base: dec.URL, ns: "ok", sc: sc}); r.err != nil || r.events != 40 || r.rewritten != 0 {
		t.Errorf("decode proxy: %+v", r)
	}
	if r := runWatch(ctx, hc, watchOpts{base: dec.URL, ns: "ok", sc: sc, repaired: true}); r.err == nil || r.events != 9 {
		t.Errorf("decode proxy passed a check for repaired events: events=%d err=%v", r.events, r.err)
	}
}

// TestRepairedFramesAreWhatWatchsanWrites: the expected repaired event differs from the sent
// one only in its resourceVersion, which is the event's position in the history.
func TestRepairedFramesAreWhatWatchsanWrites(t *testing.T) {
	for _, f := range []stream.Format{stream.JSON, stream.Protobuf, stream.CBOR} {
		set, err := NewEventSet(Workload{Format: f, ObjectSize: 1024, Events: 20, DeleteEvery: 10, BaseRV: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if got := set.Regressed(20); got != 2 {
			t.Fatalf("%s: %d regressing events, want 2", f, got)
		}
		for i, ev := range set.events {
			if !ev.regressed() {
				continue
			}
			for _, b := range [][]byte{ev.frame, ev.repaired} {
				e, err := stream.NewReader(f, bytes.NewReader(b), 0).Next()
				if err != nil {
					t.Fatalf("%s event %d: %v", f, i, err)
				}
				if e.Type != stream.Deleted || e.Name != ev.name {
					t.Errorf("%s event %d: %s %s", f, i, e.Type, e.Name)
				}
			}
			e, _ := stream.NewReader(f, bytes.NewReader(ev.repaired), 0).Next()
			if e.RV != fmt.Sprint(1000+i+1) || ev.wireRV >= ev.fixedRV {
				t.Errorf("%s event %d: repaired rv %s (wire %s), want %d", f, i, e.RV, ev.wireRV, 1000+i+1)
			}
		}
	}
}

// cpuNanos is the CPU time this process has used (user and system, all threads).
func cpuNanos() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// flushDiscard is a ResponseWriter that keeps nothing.
type flushDiscard struct {
	h http.Header
	n int64
}

func (d *flushDiscard) Header() http.Header         { return d.h }
func (d *flushDiscard) Write(b []byte) (int, error) { d.n += int64(len(b)); return len(b), nil }
func (d *flushDiscard) WriteHeader(int)             {}
func (d *flushDiscard) Flush()                      {}

// frameBody is an upstream body of n events cycled from set, delivered in reads of at most
// 32 KiB as a network would.
type frameBody struct {
	set  *EventSet
	left int
	i    int
	cur  []byte
}

func (b *frameBody) Read(p []byte) (int, error) {
	n := 0
	p = p[:min(len(p), 32<<10)]
	for n < len(p) {
		if len(b.cur) == 0 {
			if b.left == 0 {
				break
			}
			b.cur = b.set.events[b.i%len(b.set.events)].frame
			b.i++
			b.left--
		}
		k := copy(p[n:], b.cur)
		b.cur = b.cur[k:]
		n += k
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

func (b *frameBody) Close() error { return nil }

type bodyTransport struct {
	set *EventSet
	n   int
}

func (t bodyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	h := http.Header{}
	h.Set("Content-Type", t.set.W.Format.ContentType())
	return &http.Response{StatusCode: 200, Header: h, Body: &frameBody{set: t.set, left: t.n}, ContentLength: -1, Request: r,
		ProtoMajor: 1, ProtoMinor: 1}, nil
}

// BenchmarkInProcessProxy is the per-event cost of each baseline proxy's handler alone: an
// upstream body from memory, a client that discards. One op is one event; allocations are
// the proxy's. (watchsan's own per-event cost is in internal/stream's and internal/fix's
// benchmarks, and as a process in `make bench`.)
func BenchmarkInProcessProxy(b *testing.B) {
	u, _ := url.Parse("http://upstream.invalid")
	for _, mode := range []string{"pass", "decode"} {
		for _, f := range []stream.Format{stream.JSON, stream.Protobuf, stream.CBOR} {
			for _, size := range []int{1024, 8192} {
				b.Run(fmt.Sprintf("%s/%s/%s", mode, f, sizeName(size)), func(b *testing.B) {
					set, err := NewEventSet(Workload{Format: f, ObjectSize: size, Events: 100, BaseRV: 1000})
					if err != nil {
						b.Fatal(err)
					}
					rt := bodyTransport{set: set, n: b.N}
					var h http.Handler
					if mode == "pass" {
						h = NewPassProxy(u, rt)
					} else {
						h = NewDecodeProxy(u, rt)
					}
					req := httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/bench/configmaps?watch=1&resourceVersion=1000", nil)
					req.Header.Set("Accept", acceptHeader(f))
					w := &flushDiscard{h: http.Header{}}
					b.SetBytes(set.wireBytes(100) / 100)
					b.ReportAllocs()
					b.ResetTimer()
					cpu0 := cpuNanos()
					h.ServeHTTP(w, req)
					b.StopTimer()
					// CPU time per event: on a shared machine the steadier figure than wall time.
					b.ReportMetric(float64(cpuNanos()-cpu0)/float64(b.N), "cpu-ns/op")
					if w.n == 0 {
						b.Fatal("nothing written")
					}
				})
			}
		}
	}
}

// TestTargetsCPU: the CPU-per-event target compares watchsan's repair mode with the
// pass-through of the same workload, for JSON and protobuf only.
func TestTargetsCPU(t *testing.T) {
	tr := func(p PathName, format string, evs, cpu float64) *ThroughputResult {
		return &ThroughputResult{Path: p, Format: format, Size: 1024, Watches: 1, EventsPerSec: evs, CPUPerM: cpu}
	}
	r := &Results{Throughput: []*ThroughputResult{
		tr(Direct, "json", 1000, 0), tr(Pass, "json", 500, 1.0), tr(WatchsanRepair, "json", 600, 0.9),
		tr(Direct, "protobuf", 1000, 0), tr(Pass, "protobuf", 500, 1.0), tr(WatchsanRepair, "protobuf", 400, 1.5),
		tr(Pass, "cbor", 500, 1.0), tr(WatchsanRepair, "cbor", 400, 3.0),
	}}
	got := map[string]bool{}
	for _, x := range r.Targets() {
		if strings.Contains(x.Goal, "CPU") {
			got[x.Goal] = x.Pass
		}
	}
	want := map[string]bool{
		"repair CPU per event json/1KiB/1w ≤ 1.0x pass-through":     true,
		"repair CPU per event protobuf/1KiB/1w ≤ 1.0x pass-through": false,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("CPU targets %v, want %v", got, want)
	}
}

// TestBaselinePprof: the pass-through started for `watchsan-bench profile -path pass` serves
// its CPU profile on its admin listener, and proxies as before on its main one.
func TestBaselinePprof(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	up, err := startUpstream(NewUpstream(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	l := testLauncher(t)
	l.BaselinePprof = true
	p, err := l.start(ctx, Pass, upstreamSpec{url: up.plainURL})
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop()
	if p.admin == "" || p.admin == p.url {
		t.Fatalf("admin listener %q, main %q: want a listener of its own", p.admin, p.url)
	}
	for _, u := range []string{p.admin + "/debug/pprof/", p.url + "/readyz"} {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", u, resp.StatusCode)
		}
	}
}

// TestSharePath: watchsan-share lends its kubeconfig's token to clients that send none and
// serves identical idle watches from one upstream watch, where the pass-through opens one per
// client; its throughput runs deliver every event, repaired as watchsan-repair's are.
func TestSharePath(t *testing.T) {
	cfg := ShortConfig()
	cfg.Launcher = testLauncher(t)
	cfg.Paths = []PathName{Pass, WatchsanShare}
	cfg.Phases = map[string]bool{"throughput": true, "memory": true}
	RaiseFDLimit(4096)
	var progress bytes.Buffer
	cfg.Progress = &progress
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("progress:\n%s", progress.String())
	for _, e := range res.Errors {
		t.Errorf("run error: %s", e)
	}
	for name, why := range res.Skipped {
		t.Errorf("%s skipped: %s", name, why)
	}
	shared := false
	for _, tr := range res.Throughput {
		if tr.Path != WatchsanShare {
			continue
		}
		shared = true
		for _, s := range tr.Samples {
			if want := tr.PerWatch * tr.Watches; s.Err != "" || s.Cut || s.Events != want {
				t.Errorf("%s: %d of %d events, cut=%v, err=%q", tr.Key(), s.Events, want, s.Cut, s.Err)
			}
			if want := tr.Watches * tr.PerWatch / cfg.DeleteEvery; s.Rewritten != want {
				t.Errorf("%s: %d events arrived repaired, want %d", tr.Key(), s.Rewritten, want)
			}
		}
	}
	if !shared {
		t.Error("no throughput result for watchsan-share")
	}
	want := map[PathName]int64{Pass: int64(cfg.IdleWatches[0]) + 1, WatchsanShare: 1}
	for _, m := range res.Memory {
		for _, s := range m.Samples {
			if s.Err != "" || s.UpstreamWatches != want[m.Path] {
				t.Errorf("memory %s, %d idle watches: %d upstream watches, want %d (err %q)", m.Path, m.Watches, s.UpstreamWatches, want[m.Path], s.Err)
			}
		}
	}
	if len(res.Memory) != 2 {
		t.Errorf("memory results for %d paths, want 2", len(res.Memory))
	}
}

// TestFanOutReport renders the fan-out section and chart from made-up runs, and checks that a
// run of the fan-out alone keeps the other sections of the previous results.json.
func TestFanOutReport(t *testing.T) {
	dir := t.TempDir()
	old := &Results{Skipped: map[PathName]string{}, Memory: []*MemoryResult{{Path: Pass, Watches: 10, PerWatchKiB: 42}}}
	if err := WriteReport(dir, old); err != nil {
		t.Fatal(err)
	}
	fr := &FanOutResult{Clients: 300, Writes: 300, Baselines: []int64{20, 30, 26}}
	for i, m := range FanOutModes {
		up := 300.0
		if m == FanReviewed || m == FanLent {
			up = 1
		}
		for rep := range 3 {
			fr.Runs = append(fr.Runs, FanOutSample{Mode: m, Clients: 300, Writes: 300, UpstreamWatches: up,
				APIServerTicks: int64(100 - i*25 + rep), WatchsanCPU: float64(i) / 10, WatchsanRSSBeforeKiB: 100, WatchsanRSSKiB: 100 + 300*int64(i)})
		}
	}
	fr.pickSamples()
	fr.SetBaseline()
	if got := fr.Of(FanLent); got == nil || got.APIServerTicks != 26 {
		t.Fatalf("the lent row: %+v, want the median run (26 ticks)", got)
	}
	res := &Results{Skipped: map[PathName]string{}, FanOut: []*FanOutResult{fr}, FanOutAPIServer: "v1.37.2"}
	if kept := keepOthers(filepath.Join(dir, "results.json"), res, map[string]bool{"fanout": true}); kept != "memory" {
		t.Errorf("kept %q, want memory", kept)
	}
	if err := WriteReport(dir, res); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Fan-out", "| 300 | watchsan-share-lent | 1 | 26 | 0 | ≤0x", "| 300 | direct | 300 | 101 | 75 | 1.00x", "## Resident memory per idle watch"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("README.md lacks %q:\n%s", want, b)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "fanout.png")); err != nil {
		t.Error(err)
	}
}

// A rerun of one phase keeps an old reason a path was skipped only for a path it did not
// measure: haproxy skipped at 10,000 idle watches, then measured by a memory rerun at 9,900,
// is no longer reported skipped; decode, not measured by the rerun, keeps its reason; and the
// memory section, taken apart, says when.
func TestKeepOthersDropsSkipsOfMeasuredPaths(t *testing.T) {
	dir := t.TempDir()
	old := &Results{Skipped: map[PathName]string{HAProxy: "haproxy at 10000 idle watches", Decode: "not wanted"},
		Throughput: []*ThroughputResult{{Path: Pass}}}
	if err := WriteReport(dir, old); err != nil {
		t.Fatal(err)
	}
	res := &Results{Skipped: map[PathName]string{}, Memory: []*MemoryResult{{Path: HAProxy, Watches: 9900, PerWatchKiB: 4}}}
	if kept := keepOthers(filepath.Join(dir, "results.json"), res, map[string]bool{"memory": true}); kept != "throughput" {
		t.Errorf("kept %q, want throughput", kept)
	}
	if why := res.Skipped[HAProxy]; why != "" {
		t.Errorf("haproxy, measured by the rerun, still skipped: %q", why)
	}
	if why := res.Skipped[Decode]; why != "not wanted" {
		t.Errorf("decode's reason %q, want the old one kept", why)
	}
	if res.MemoryEnv == nil {
		t.Error("the memory runs, taken apart, do not say when")
	}
}

// TestProcSyscalls: procSyscalls counts this process's reads and writes, which is what the
// profile's "system calls per thousand events" line is made of.
func TestProcSyscalls(t *testing.T) {
	r0, w0, err := procSyscalls(os.Getpid())
	if err != nil {
		t.Skipf("no /proc/PID/io here: %v", err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	const n = 50
	buf := make([]byte, 1)
	for range n {
		if _, err := pw.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := pr.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	r1, w1, err := procSyscalls(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Other threads of the process may read and write too: at least n each, then.
	if r1-r0 < n || w1-w0 < n {
		t.Fatalf("after %d reads and writes: %d reads, %d writes counted", n, r1-r0, w1-w0)
	}
}

// TestKeepOthersHeaderFollowsThroughput: the report's header is the environment of the
// throughput runs. A rerun of throughput beside kept memory runs shows its own machine
// state there, and the kept memory runs say when they were taken; a rerun of memory alone
// keeps the old header and dates its own section.
func TestKeepOthersHeaderFollowsThroughput(t *testing.T) {
	oldEnv, newEnv := Env{Date: "old"}, Env{Date: "new"}
	dir := t.TempDir()
	old := &Results{Env: oldEnv, Throughput: []*ThroughputResult{{Path: Pass}}, Memory: []*MemoryResult{{Path: Pass, Watches: 10}}}
	if err := WriteReport(dir, old); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "results.json")

	res := &Results{Env: newEnv, Skipped: map[PathName]string{}, Throughput: []*ThroughputResult{{Path: Pass}}}
	if kept := keepOthers(file, res, map[string]bool{"throughput": true}); kept != "memory" {
		t.Fatalf("kept %q, want memory", kept)
	}
	if res.Env.Date != "new" {
		t.Errorf("throughput rerun: header from %q, want this run's", res.Env.Date)
	}
	if res.MemoryEnv == nil || res.MemoryEnv.Date != "old" {
		t.Errorf("kept memory runs dated %+v, want the old run's", res.MemoryEnv)
	}

	res = &Results{Env: newEnv, Skipped: map[PathName]string{}, Memory: []*MemoryResult{{Path: Pass, Watches: 10}}}
	if kept := keepOthers(file, res, map[string]bool{"memory": true}); kept != "throughput" {
		t.Fatalf("kept %q, want throughput", kept)
	}
	if res.Env.Date != "old" {
		t.Errorf("memory rerun: header from %q, want the kept throughput's", res.Env.Date)
	}
	if res.MemoryEnv == nil || res.MemoryEnv.Date != "new" {
		t.Errorf("rerun memory dated %+v, want this run's", res.MemoryEnv)
	}
}

// TestFramesProxyRelaysEveryEvent: the frames baseline reads every event with stream.Reader and
// relays it byte for byte, and holds none back once the upstream goes quiet (the stream stays
// open after the last event, so a batch not flushed before the read that waits would never
// arrive and the watch would time out short).
func TestFramesProxyRelaysEveryEvent(t *testing.T) {
	for _, f := range []stream.Format{stream.JSON, stream.Protobuf, stream.CBOR} {
		t.Run(f.String(), func(t *testing.T) {
			set, err := NewEventSet(Workload{Format: f, ObjectSize: 1024, Events: 300, DeleteEvery: 10, BaseRV: 1000})
			if err != nil {
				t.Fatal(err)
			}
			up := NewUpstream()
			up.Set("ok", &Scenario{Set: set, Count: 300})
			srv := httptest.NewServer(up)
			defer srv.Close()
			u, _ := url.Parse(srv.URL)
			fr := httptest.NewServer(NewFramesProxy(u, upstreamTransport(nil)))
			defer fr.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			hc := newClient(32 << 10)
			defer hc.CloseIdleConnections()
			sc := &Scenario{Set: set, Count: 300}
			if r := runWatch(ctx, hc, watchOpts{base: fr.URL, ns: "ok", sc: sc}); r.err != nil || r.events != 300 || r.exact != 300 || r.rewritten != 0 {
				t.Errorf("frames proxy: events=%d exact=%d rewritten=%d err=%v", r.events, r.exact, r.rewritten, r.err)
			}
		})
	}
}

// TestFramesProxyReadsFrames: the frames baseline reads the stream, not only copies it. Three
// events and then a line that is no JSON object: it relays the three and ends the response
// where stream.Reader fails (a pass-through would relay the line too, and the bench would be
// measuring a copy).
func TestFramesProxyReadsFrames(t *testing.T) {
	set, err := NewEventSet(Workload{Format: stream.JSON, ObjectSize: 1024, Events: 3, DeleteEvery: 10, BaseRV: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	for _, ev := range set.events {
		want = append(want, ev.frame...)
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(want)
		_, _ = w.Write([]byte("not a watch event\n"))
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	fr := httptest.NewServer(NewFramesProxy(u, upstreamTransport(nil)))
	defer fr.Close()
	resp, err := http.Get(fr.URL + "/api/v1/namespaces/ok/configmaps?watch=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("frames proxy relayed %d bytes, want the %d of the three events and nothing after:\n%q", len(got), len(want), got)
	}
}

// TestEveryPathHasAColor: a path -paths may name is drawn in the charts (a path without a
// color was left out of them, its legend entry blank).
func TestEveryPathHasAColor(t *testing.T) {
	for _, p := range knownPaths {
		if _, ok := pathColor[p]; !ok {
			t.Errorf("%s has no chart color", p)
		}
	}
}

// The scale section reports each mode's row with its latencies, CPU per event and memory per
// subscriber, and draws its chart; a rerun of another phase keeps it.
func TestScaleReport(t *testing.T) {
	dir := t.TempDir()
	var rs []*ScaleResult
	for _, n := range []int{100, 1000} {
		sr := &ScaleResult{Watchers: n, Feeds: 100, Writes: 1000}
		for i, m := range ScaleModes {
			s := ScaleSample{Mode: m, Watchers: n, Feeds: 100, Writes: 1000, Delivered: 1000 * n / 100,
				P50: time.Duration(i+1) * 10 * time.Millisecond, P99: time.Duration(i+1) * 30 * time.Millisecond, Max: time.Second,
				APIServerTicks: 300, BaselineTicks: 200, UpstreamWatches: float64(n)}
			if m == ScaleWatchsan1 || m == ScaleWatchsan2 {
				s.UpstreamWatches, s.WatchsanCPU, s.WatchsanRSSBeforeKiB, s.WatchsanRSSKiB = 100, 0.5, 1000, 1000+int64(8*n)
			}
			sr.Samples = append(sr.Samples, s)
		}
		rs = append(rs, sr)
	}
	res := &Results{Skipped: map[PathName]string{}, Scale: rs, ScaleAPIServer: "v1.37.2"}
	if err := WriteReport(dir, res); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	// direct: (300-200) ticks = 1 s over 10,000 deliveries = 100 µs; watchsan: 0.5 s = 50 µs.
	for _, want := range []string{"## Scale", "| 1000 | direct-http1 | 1000 | 10000 | 10.00 ms | 30.00 ms | 1.00 s | 100.0 µs | — |",
		"| 1000 | watchsan-http2 | 100 | 10000 | 40.00 ms | 120.00 ms | 1.00 s | 50.0 µs | 8.0 KiB |"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("README.md lacks %q:\n%s", want, b)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "scale.png")); err != nil {
		t.Error(err)
	}
	again := &Results{Skipped: map[PathName]string{}}
	if kept := keepOthers(filepath.Join(dir, "results.json"), again, map[string]bool{"fanout": true}); kept != "scale" || len(again.Scale) != 2 {
		t.Errorf("kept %q and %d scale results, want scale and 2", kept, len(again.Scale))
	}
}
