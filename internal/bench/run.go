package bench

import (
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/watchsan/watchsan/internal/stream"
)

// Config is one bench run.
type Config struct {
	Paths   []PathName
	Formats []stream.Format
	// Sizes are the target JSON event sizes, bytes.
	Sizes []int
	// Concurrency lists how many concurrent watches the saturation runs use.
	Concurrency []int
	// Events is how many events one watch receives in a saturation run with one watch; with
	// N watches each gets max(Events/N, MinEventsPerWatch).
	Events            int
	MinEventsPerWatch int
	// DeleteEvery makes every n-th event a regressing DELETED.
	DeleteEvery int
	// Reps repeats every saturation and latency run; medians are reported.
	Reps int
	// MinRunDuration: a saturation run repeats its watches (new ones each round) until it has
	// lasted this long, so that the proxy's CPU time, read in 10 ms ticks, is precise to 1%.
	MinRunDuration time.Duration
	// RunTimeout bounds one run (a path too slow for the workload is cut and marked).
	RunTimeout time.Duration

	// Rates are the total event rates of the latency runs, across LatencyWatches watches,
	// each run lasting LatencyDuration.
	Rates           []float64
	LatencyWatches  int
	LatencyDuration time.Duration
	// LatencyReps repeats every fixed-rate run.
	LatencyReps int

	// TTFEWatches is how many new watches measure the time to first event, one after another.
	TTFEWatches int

	// IdleWatches lists the numbers of idle watches of the memory runs; MemoryReps repeats
	// each (a fresh proxy process every time); MemorySettle is the pause before VmRSS is read.
	IdleWatches  []int
	MemoryReps   int
	MemorySettle time.Duration

	// FanOutClients lists the numbers of identical watches of the fan-out runs, each followed
	// by FanOutWrites writes, on a real kube-apiserver (fanout.go).
	FanOutClients []int
	FanOutWrites  int
	// FanOutReps repeats every fan-out run (a fresh watchsan each time); the median is reported.
	FanOutReps int

	// StormClients clients a wave sync StormObjects configmaps of StormObjectBytes each as
	// lists of StormLimit a page, in two waves, on a real kube-apiserver (storm.go); StormReps
	// repeats every mode (the median is reported).
	StormClients, StormObjects, StormObjectBytes, StormLimit, StormReps int

	// ScaleWatchers lists the numbers of watchers of the scale runs, spread over ScaleFeeds
	// namespaces, each followed by ScaleWrites writes, on a real kube-apiserver (scale.go).
	ScaleWatchers           []int
	ScaleFeeds, ScaleWrites int

	// Phases selects what to measure: "throughput", "latency", "ttfe", "memory", "fanout", "storm", "scale"; nil: all.
	Phases map[string]bool

	Launcher Launcher `json:"-"`
	// Progress gets one line per finished run; nil: none.
	Progress io.Writer `json:"-"`
}

// Env is what the numbers were taken on.
type Env struct {
	Date            string
	NumCPU          int
	CPUModel        string
	Kernel          string
	GoVersion       string // the bench's
	WatchsanVersion string
	WatchsanGo      string
	HAProxyVersion  string
	LoadBefore      string
	LoadAfter       string
	FDLimit         uint64
	Duration        time.Duration
}

// Results of one bench run.
type Results struct {
	Env        Env
	Config     Config
	Throughput []*ThroughputResult
	Latency    []*LatencyResult
	TTFE       []*TTFEResult
	Memory     []*MemoryResult
	// FanOut is the fan-out runs, one per number of clients, on a real kube-apiserver of
	// version FanOutAPIServer.
	FanOut          []*FanOutResult `json:",omitempty"`
	FanOutAPIServer string          `json:",omitempty"`
	// FanOutEnv is what the fan-out was taken on, when (-phases) it ran apart from the rest.
	FanOutEnv *Env `json:",omitempty"`
	// Storm is the relist storm runs (storm.go) on a kube-apiserver of version StormAPIServer;
	// StormEnv what they were taken on, when (-phases) they ran apart from the rest.
	Storm          *StormResult `json:",omitempty"`
	StormAPIServer string       `json:",omitempty"`
	StormEnv       *Env         `json:",omitempty"`
	// Scale is the scale runs (scale.go), one per number of watchers, on a kube-apiserver of
	// version ScaleAPIServer; ScaleEnv what they were taken on, when (-phases) they ran apart.
	Scale          []*ScaleResult `json:",omitempty"`
	ScaleAPIServer string         `json:",omitempty"`
	ScaleEnv       *Env           `json:",omitempty"`
	// MemoryEnv is what the memory runs were taken on, when (-phases memory) they ran apart.
	MemoryEnv *Env `json:",omitempty"`
	// Skipped says why a path was not measured.
	Skipped map[PathName]string
	Errors  []string
}

// ThroughputSample is one saturation run.
type ThroughputSample struct {
	Events       int
	Bytes        int64
	Elapsed      time.Duration
	EventsPerSec float64
	MBPerSec     float64
	// CPUPerM is the proxy process's CPU seconds per million events (0 for direct).
	CPUPerM float64
	// Rounds is how many times the watches ran; Cut says RunTimeout ended the run first.
	Rounds int
	// FDs is the proxy's open file descriptors after the run: a number that grows from run to
	// run means the proxy keeps connections of watches whose client left.
	FDs       int
	Cut       bool
	Exact     int
	Parsed    int
	Rewritten int
	Err       string
}

// ThroughputResult is the saturation runs of one path and workload.
type ThroughputResult struct {
	Path     PathName
	Format   string
	Size     int
	Watches  int
	PerWatch int
	Samples  []ThroughputSample
	// Medians over the samples.
	EventsPerSec, MBPerSec, CPUPerM float64
	// Complete: every sample delivered every event, checked.
	Complete bool
}

// Key identifies the workload.
func (t *ThroughputResult) Key() string {
	return fmt.Sprintf("%s/%s/%dw", t.Format, sizeName(t.Size), t.Watches)
}

// LatencySample is one fixed-rate run.
type LatencySample struct {
	P50, P99, P999 time.Duration
	Samples        int
	DeliveredRate  float64
	// Cut: the path could not keep up and the run was ended at its time limit; the
	// percentiles are of the events delivered by then.
	Cut bool
	Err string
}

// LatencyResult is the fixed-rate runs of one path at one rate.
type LatencyResult struct {
	Path    PathName
	Rate    float64
	Watches int
	Samples []LatencySample
	// Medians over the samples.
	P50, P99, P999 time.Duration
	DeliveredRate  float64
	Complete       bool
}

// TTFEResult is the time from a new watch's request to its first event.
type TTFEResult struct {
	Path     PathName
	N        int
	P50, P99 time.Duration
	Err      string
}

// MemorySample is one memory run on a fresh proxy process.
type MemorySample struct {
	RSSBeforeKiB, RSSAfterKiB int64
	PerWatchKiB               float64
	FDs                       int
	// UpstreamWatches is how many watches the upstream served with the idle ones open (the
	// first watch's included): one per watch, except where watches share one.
	UpstreamWatches int64
	Err             string
}

// MemoryResult is the memory runs of one path at one number of idle watches.
type MemoryResult struct {
	Path        PathName
	Watches     int
	Samples     []MemorySample
	PerWatchKiB float64 // median
}

// Run runs the bench.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	t0 := time.Now()
	dir, err := os.MkdirTemp("", "watchsan-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cfg.Launcher.Dir = dir
	res := &Results{Config: cfg, Skipped: map[PathName]string{}}
	res.Env = environment(cfg)

	r := &runner{cfg: cfg, res: res, t0: t0}
	if cfg.phase("throughput") || cfg.phase("latency") || cfg.phase("ttfe") || cfg.phase("memory") {
		if err := r.synthetic(ctx); err != nil {
			return nil, err
		}
	}
	if cfg.phase("fanout") && len(cfg.FanOutClients) > 0 {
		r.fanout(ctx)
	}
	if cfg.phase("storm") && cfg.StormClients > 0 {
		r.storm(ctx)
	}
	if cfg.phase("scale") && len(cfg.ScaleWatchers) > 0 && cfg.ScaleFeeds > 0 {
		r.scale(ctx)
	}

	res.Env.LoadAfter = loadAvg()
	res.Env.Duration = time.Since(t0).Round(time.Second)
	return res, ctx.Err()
}

// synthetic runs the phases against the bench's own upstream.
func (r *runner) synthetic(ctx context.Context) error {
	cfg := r.cfg
	dir := cfg.Launcher.Dir
	up, err := startUpstream(NewUpstream(), dir)
	if err != nil {
		return err
	}
	defer up.Close()
	r.up = up

	sets, err := r.buildSets()
	if err != nil {
		return err
	}
	r.progress("events encoded")
	procs := r.startAll(ctx, upstreamSpec{url: up.plainURL})
	r.progress("proxies started")
	if cfg.phase("throughput") {
		r.throughput(ctx, procs, sets)
	}
	if cfg.phase("latency") {
		r.latency(ctx, procs, sets)
	}
	if cfg.phase("ttfe") {
		r.ttfe(ctx, procs, sets)
	}
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() { defer wg.Done(); p.proc.stop() }()
	}
	wg.Wait()
	if cfg.phase("memory") {
		r.memory(ctx, sets, upstreamSpec{url: up.tlsURL, caFile: up.caFile})
	}

	return nil
}

func (c *Config) phase(name string) bool { return c.Phases == nil || c.Phases[name] }

type runner struct {
	t0  time.Time
	cfg Config
	res *Results
	up  *upstreamServer
}

// target is a path as the client reaches it.
type target struct {
	name PathName
	base string
	proc *proc // nil for direct
}

func (r *runner) progress(format string, args ...any) {
	if r.cfg.Progress != nil {
		fmt.Fprintf(r.cfg.Progress, "[%6.1fs] "+format+"\n", append([]any{time.Since(r.t0).Seconds()}, args...)...)
	}
}

func (r *runner) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.res.Errors = append(r.res.Errors, msg)
	r.progress("ERROR %s", msg)
}

type setKey struct {
	f    stream.Format
	size int
}

func (r *runner) perWatch(watches int) int {
	if watches <= 1 {
		return r.cfg.Events
	}
	return max(r.cfg.Events/watches, r.cfg.MinEventsPerWatch)
}

func (r *runner) buildSets() (map[setKey]*EventSet, error) {
	n := 1
	for _, c := range r.cfg.Concurrency {
		n = max(n, r.perWatch(c))
	}
	var latencyNeed int
	for _, rate := range r.cfg.Rates {
		latencyNeed = max(latencyNeed, latencyCount(rate, r.cfg.LatencyWatches, r.cfg.LatencyDuration))
	}
	sets := map[setKey]*EventSet{}
	build := func(f stream.Format, size, events int) error {
		k := setKey{f, size}
		if s := sets[k]; s != nil && len(s.events) >= events {
			return nil
		}
		s, err := NewEventSet(Workload{Format: f, ObjectSize: size, Events: events, DeleteEvery: r.cfg.DeleteEvery, BaseRV: 1_000_000})
		if err != nil {
			return err
		}
		sets[k] = s
		return nil
	}
	for _, f := range r.cfg.Formats {
		for _, size := range r.cfg.Sizes {
			if err := build(f, size, n); err != nil {
				return nil, err
			}
		}
	}
	// Latency, time to first event and idle watches use JSON events of the first size.
	if err := build(stream.JSON, r.cfg.Sizes[0], max(latencyNeed, 1)); err != nil {
		return nil, err
	}
	return sets, nil
}

func latencyCount(rate float64, watches int, d time.Duration) int {
	return max(1, int(rate/float64(max(watches, 1))*d.Seconds()))
}

// startAll starts every path's proxy against up; a path that cannot start is skipped.
func (r *runner) startAll(ctx context.Context, up upstreamSpec) []*target {
	var out []*target
	for _, name := range r.cfg.Paths {
		if name == Direct {
			out = append(out, &target{name: Direct, base: up.url})
			continue
		}
		if name == HAProxy && r.cfg.Launcher.HAProxy == "" {
			r.res.Skipped[HAProxy] = "haproxy is not installed (apt-get install -y haproxy)"
			r.progress("haproxy is not installed: skipped")
			continue
		}
		p, err := r.cfg.Launcher.start(ctx, name, up)
		if err != nil {
			r.res.Skipped[name] = err.Error()
			r.fail("%s: %v", name, err)
			continue
		}
		out = append(out, &target{name: name, base: p.url, proc: p})
	}
	return out
}

// rotate returns ts rotated by k, so that no path always runs right after the same other.
func rotate(ts []*target, k int) []*target {
	if len(ts) == 0 {
		return ts
	}
	k %= len(ts)
	return append(append([]*target{}, ts[k:]...), ts[:k]...)
}

func (r *runner) throughput(ctx context.Context, ts []*target, sets map[setKey]*EventSet) {
	results := map[string]*ThroughputResult{}
	hc := newClient(64 << 10)
	defer hc.CloseIdleConnections()
	for rep := 0; rep < r.cfg.Reps; rep++ {
		for _, f := range r.cfg.Formats {
			for _, size := range r.cfg.Sizes {
				for _, c := range r.cfg.Concurrency {
					set := sets[setKey{f, size}]
					sc := &Scenario{Set: set, Count: r.perWatch(c)}
					ns := fmt.Sprintf("tp-%s-%d-%d", f, size, c)
					r.up.Set(ns, sc)
					for _, t := range rotate(ts, rep) {
						if ctx.Err() != nil {
							return
						}
						key := fmt.Sprintf("%s|%s", t.name, ns)
						tr := results[key]
						if tr == nil {
							tr = &ThroughputResult{Path: t.name, Format: f.String(), Size: size, Watches: c, PerWatch: sc.Count}
							results[key] = tr
							r.res.Throughput = append(r.res.Throughput, tr)
						}
						s := r.saturate(ctx, hc, t, ns, sc, c)
						cut := ""
						if s.Cut {
							cut = fmt.Sprintf("(cut at %v)", r.cfg.RunTimeout)
						}
						fds := ""
						if t.proc != nil {
							s.FDs = procFDs(t.proc.pid)
							fds = fmt.Sprintf("fds %d ", s.FDs)
						}
						tr.Samples = append(tr.Samples, s)
						r.progress("throughput %-16s %-16s rep %d: %9.0f ev/s %7.1f MB/s cpu %6.2f s/Mev x%d %s%s%s",
							t.name, tr.Key(), rep+1, s.EventsPerSec, s.MBPerSec, s.CPUPerM, s.Rounds, fds, cut, s.Err)
					}
				}
			}
		}
	}
	for _, tr := range r.res.Throughput {
		tr.Complete = true
		var evs, mbs, cpus []float64
		for _, s := range tr.Samples {
			evs, mbs, cpus = append(evs, s.EventsPerSec), append(mbs, s.MBPerSec), append(cpus, s.CPUPerM)
			if s.Err != "" {
				tr.Complete = false
			}
		}
		tr.EventsPerSec, tr.MBPerSec, tr.CPUPerM = median(evs), median(mbs), median(cpus)
	}
}

// saturate runs `watches` watches of sc at once through t, in rounds until MinRunDuration has
// passed, and measures the whole.
func (r *runner) saturate(ctx context.Context, hc *http.Client, t *target, ns string, sc *Scenario, watches int) ThroughputSample {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RunTimeout)
	defer cancel()
	var s ThroughputSample
	var errs []string
	cpu0 := t.cpu()
	start := time.Now()
	for s.Rounds == 0 || time.Since(start) < r.cfg.MinRunDuration {
		s.Rounds++
		out := make([]watchResult, watches)
		var wg sync.WaitGroup
		for i := range watches {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out[i] = runWatch(ctx, hc, watchOpts{base: t.base, ns: ns, sc: sc, repaired: t.name.repairs(), lent: t.name.lends(), readBuf: 256 << 10})
			}()
		}
		wg.Wait()
		if ctx.Err() != nil {
			s.Cut = true
		}
		events, rewritten := 0, 0
		for _, w := range out {
			events += w.events
			rewritten += w.rewritten
			s.Bytes += w.bytes
			s.Exact += w.exact
			s.Parsed += w.parsed
			if w.err != nil && !s.Cut {
				errs = append(errs, w.err.Error())
			}
		}
		s.Events += events
		s.Rewritten += rewritten
		if s.Cut || len(errs) > 0 {
			break
		}
		if want := sc.Count * watches; events != want {
			errs = append(errs, fmt.Sprintf("%d of %d events", events, want))
		}
		if wantRW := sc.Set.Regressed(sc.Count) * watches; t.name.repairs() && rewritten != wantRW {
			errs = append(errs, fmt.Sprintf("%d rewritten events, want %d", rewritten, wantRW))
		}
		if !t.name.repairs() && rewritten != 0 {
			errs = append(errs, fmt.Sprintf("%d rewritten events through a path that must not rewrite", rewritten))
		}
		if len(errs) > 0 {
			break
		}
	}
	elapsed := time.Since(start)
	cpu1 := t.cpu()
	s.Elapsed = elapsed
	if len(errs) > 0 {
		s.Err = summarize(errs)
	}
	if sec := elapsed.Seconds(); sec > 0 {
		s.EventsPerSec = float64(s.Events) / sec
		s.MBPerSec = float64(s.Bytes) / sec / 1e6
	}
	if t.proc != nil && s.Events > 0 && cpu0 >= 0 && cpu1 >= 0 {
		s.CPUPerM = (cpu1 - cpu0) / float64(s.Events) * 1e6
	}
	return s
}

func (t *target) cpu() float64 {
	if t.proc == nil {
		return -1
	}
	c, err := procCPU(t.proc.pid)
	if err != nil {
		return -1
	}
	return c
}

func summarize(errs []string) string {
	sort.Strings(errs)
	errs = slices.Compact(errs)
	if len(errs) > 3 {
		return strings.Join(errs[:3], "; ") + fmt.Sprintf("; and %d more", len(errs)-3)
	}
	return strings.Join(errs, "; ")
}

func (r *runner) latency(ctx context.Context, ts []*target, sets map[setKey]*EventSet) {
	if len(r.cfg.Rates) == 0 {
		return
	}
	set := sets[setKey{stream.JSON, r.cfg.Sizes[0]}]
	results := map[string]*LatencyResult{}
	hc := newClient(32 << 10)
	defer hc.CloseIdleConnections()
	w := r.cfg.LatencyWatches
	for rep := 0; rep < r.cfg.LatencyReps; rep++ {
		for _, rate := range r.cfg.Rates {
			sc := &Scenario{Set: set, Count: latencyCount(rate, w, r.cfg.LatencyDuration), Rate: rate / float64(w), Stamp: true}
			ns := fmt.Sprintf("lat-%.0f", rate)
			r.up.Set(ns, sc)
			for _, t := range rotate(ts, rep) {
				if ctx.Err() != nil {
					return
				}
				key := fmt.Sprintf("%s|%s", t.name, ns)
				lr := results[key]
				if lr == nil {
					lr = &LatencyResult{Path: t.name, Rate: rate, Watches: w}
					results[key] = lr
					r.res.Latency = append(r.res.Latency, lr)
				}
				s := r.paced(ctx, hc, t, ns, sc, w)
				lr.Samples = append(lr.Samples, s)
				cut := ""
				if s.Cut {
					cut = "(cut: could not keep up) "
				}
				r.progress("latency    %-16s %6.0f ev/s rep %d: p50 %v p99 %v p999 %v delivered %.0f ev/s %s%s",
					t.name, rate, rep+1, s.P50, s.P99, s.P999, s.DeliveredRate, cut, s.Err)
			}
		}
	}
	for _, lr := range r.res.Latency {
		lr.Complete = true
		var p50, p99, p999, dr []float64
		for _, s := range lr.Samples {
			p50, p99, p999 = append(p50, float64(s.P50)), append(p99, float64(s.P99)), append(p999, float64(s.P999))
			dr = append(dr, s.DeliveredRate)
			if s.Err != "" {
				lr.Complete = false
			}
		}
		lr.P50, lr.P99, lr.P999 = time.Duration(median(p50)), time.Duration(median(p99)), time.Duration(median(p999))
		lr.DeliveredRate = median(dr)
	}
}

// paced runs `watches` stamped, paced watches of sc through t.
func (r *runner) paced(ctx context.Context, hc *http.Client, t *target, ns string, sc *Scenario, watches int) LatencySample {
	timeout := 2*r.cfg.LatencyDuration + 5*time.Second
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out := make([]watchResult, watches)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range watches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = runWatch(ctx, hc, watchOpts{base: t.base, ns: ns, sc: sc, repaired: t.name.repairs(), lent: t.name.lends(), latency: true,
				skipLatency: min(5, sc.Count/10), readBuf: 32 << 10})
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []int64
	var errs []string
	events := 0
	var s LatencySample
	s.Cut = ctx.Err() != nil
	for _, w := range out {
		all = append(all, w.latencies...)
		events += w.events
		if w.err != nil && !s.Cut {
			errs = append(errs, w.err.Error())
		}
	}
	if events != sc.Count*watches && len(errs) == 0 && !s.Cut {
		errs = append(errs, fmt.Sprintf("%d of %d events", events, sc.Count*watches))
	}
	if len(errs) > 0 {
		s.Err = summarize(errs)
	}
	s.Samples = len(all)
	s.DeliveredRate = float64(events) / elapsed.Seconds()
	slices.Sort(all)
	s.P50, s.P99, s.P999 = time.Duration(pct(all, 0.50)), time.Duration(pct(all, 0.99)), time.Duration(pct(all, 0.999))
	return s
}

func (r *runner) ttfe(ctx context.Context, ts []*target, sets map[setKey]*EventSet) {
	if r.cfg.TTFEWatches <= 0 {
		return
	}
	sc := &Scenario{Set: sets[setKey{stream.JSON, r.cfg.Sizes[0]}], Count: 1}
	r.up.Set("ttfe", sc)
	hc := newClient(16 << 10)
	defer hc.CloseIdleConnections()
	for _, t := range ts {
		tr := &TTFEResult{Path: t.name}
		var firsts []int64
		for range r.cfg.TTFEWatches {
			if ctx.Err() != nil {
				return
			}
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			w := runWatch(wctx, hc, watchOpts{base: t.base, ns: "ttfe", sc: sc, repaired: t.name.repairs(), lent: t.name.lends(), readBuf: 16 << 10})
			cancel()
			if w.err != nil {
				tr.Err = w.err.Error()
				break
			}
			firsts = append(firsts, int64(w.first))
		}
		slices.Sort(firsts)
		tr.N = len(firsts)
		tr.P50, tr.P99 = time.Duration(pct(firsts, 0.5)), time.Duration(pct(firsts, 0.99))
		r.res.TTFE = append(r.res.TTFE, tr)
		r.progress("ttfe       %-16s n=%d p50 %v p99 %v %s", t.name, tr.N, tr.P50, tr.P99, tr.Err)
	}
}

// memory measures, for each path on a fresh process behind the HTTP/2 (TLS) upstream, the
// resident memory that N idle watches add, per watch.
func (r *runner) memory(ctx context.Context, sets map[setKey]*EventSet, up upstreamSpec) {
	sc := &Scenario{Set: sets[setKey{stream.JSON, r.cfg.Sizes[0]}], Count: 1}
	r.up.Set("idle", sc)
	for _, n := range r.cfg.IdleWatches {
		for rep := 0; rep < r.cfg.MemoryReps; rep++ {
			for _, name := range r.cfg.Paths {
				if name == Direct || r.res.Skipped[name] != "" {
					continue
				}
				if name == HAProxy && n > haproxyMaxConn() {
					if rep == 0 {
						r.res.Skipped[HAProxy] = fmt.Sprintf("haproxy at %d idle watches: it needs two file descriptors per connection "+
							"it may accept and refuses to start with maxconn above %d under this machine's hard limit of %d", n, haproxyMaxConn(), RaiseFDLimit(0))
						r.progress("memory     haproxy skipped at %d watches (fd limit)", n)
					}
					continue
				}
				if ctx.Err() != nil {
					return
				}
				var tooMany string
				if name.isWatchsan() && n+1 > watchsanMaxConn() {
					tooMany = fmt.Sprintf("watchsan serves at most %d connections under this machine's hard limit of %d open files "+
						"(--max-connections is fitted to the limit: a client connection may need an upstream one too); %d watches need %d",
						watchsanMaxConn(), RaiseFDLimit(0), n, n+1)
				}
				var mr *MemoryResult
				for _, m := range r.res.Memory {
					if m.Path == name && m.Watches == n {
						mr = m
					}
				}
				if mr == nil {
					mr = &MemoryResult{Path: name, Watches: n}
					r.res.Memory = append(r.res.Memory, mr)
				}
				var s MemorySample
				if tooMany != "" {
					s.Err = tooMany // not started: it could only time out
				} else {
					s = r.idle(ctx, name, up, sc, n)
				}
				mr.Samples = append(mr.Samples, s)
				r.progress("memory     %-16s %5d watches rep %d: %7.1f KiB/watch (RSS %d -> %d KiB, %d fds) %s",
					name, n, rep+1, s.PerWatchKiB, s.RSSBeforeKiB, s.RSSAfterKiB, s.FDs, s.Err)
			}
		}
	}
	for _, mr := range r.res.Memory {
		var v []float64
		for _, s := range mr.Samples {
			if s.Err == "" {
				v = append(v, s.PerWatchKiB)
			}
		}
		mr.PerWatchKiB = median(v)
	}
}

func (r *runner) idle(ctx context.Context, name PathName, up upstreamSpec, sc *Scenario, n int) (s MemorySample) {
	p, err := r.cfg.Launcher.start(ctx, name, up)
	if err != nil {
		s.Err = err.Error()
		return
	}
	defer p.stop()
	hc := newClient(4 << 10)
	defer hc.CloseIdleConnections()
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second+time.Duration(n)*5*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// One watch first, so that what every process sets up on its first watch is not counted.
	if err := openIdle(wctx, &wg, hc, p.url, name, sc, 1); err != nil {
		s.Err = err.Error()
		return
	}
	sleepCtx(ctx, r.cfg.MemorySettle)
	s.RSSBeforeKiB, _ = procStatus(p.pid, "VmRSS")
	if err := openIdle(wctx, &wg, hc, p.url, name, sc, n); err != nil {
		s.Err = err.Error()
		return
	}
	sleepCtx(ctx, r.cfg.MemorySettle)
	if !p.alive() {
		s.Err = "process exited: " + p.tail.String()
		return
	}
	s.RSSAfterKiB, _ = procStatus(p.pid, "VmRSS")
	s.FDs = procFDs(p.pid)
	s.UpstreamWatches = r.up.Watches.Load()
	s.PerWatchKiB = float64(s.RSSAfterKiB-s.RSSBeforeKiB) / float64(n)
	return
}

// openIdle opens k watches of sc on base that stay open until ctx ends, at most 64 waiting for
// their first event at a time, and returns once every one has had its first event.
func openIdle(ctx context.Context, wg *sync.WaitGroup, hc *http.Client, base string, path PathName, sc *Scenario, k int) error {
	firsts := make(chan struct{}, k)
	errc := make(chan error, k)
	sem := make(chan struct{}, 64)
	for range k {
		select {
		case sem <- struct{}{}:
		case err := <-errc:
			return err
		case <-ctx.Done():
			return fmt.Errorf("opening idle watches: %w", ctx.Err())
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := false
			res := runWatch(ctx, hc, watchOpts{base: base, ns: "idle", sc: sc, repaired: path.repairs(), lent: path.lends(), hold: true, readBuf: 4 << 10,
				onFirst: func(time.Duration) { first = true; <-sem; firsts <- struct{}{} }})
			if !first {
				<-sem
			}
			if res.err != nil && ctx.Err() == nil {
				errc <- res.err
			}
		}()
	}
	for range k {
		select {
		case <-firsts:
		case err := <-errc:
			return err
		case <-ctx.Done():
			return fmt.Errorf("opening idle watches: %w", ctx.Err())
		}
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// pct is the q-quantile of sorted s (nearest rank).
func pct(s []int64, q float64) int64 {
	if len(s) == 0 {
		return 0
	}
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func numCPU() int { return runtime.NumCPU() }

func environment(cfg Config) Env {
	e := Env{Date: time.Now().UTC().Format("2006-01-02 15:04 UTC"), NumCPU: runtime.NumCPU(), GoVersion: runtime.Version(),
		LoadBefore: loadAvg(), FDLimit: RaiseFDLimit(0)}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				e.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		e.Kernel = strings.TrimSpace(string(b))
	}
	if len(cfg.Launcher.Watchsan) > 0 {
		cmd := exec.Command(cfg.Launcher.Watchsan[0], append(cfg.Launcher.Watchsan[1:], "version")...)
		cmd.Env = append(os.Environ(), cfg.Launcher.WatchsanEnv...)
		if out, err := cmd.Output(); err == nil {
			e.WatchsanVersion = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "watchsan"))
		}
		if bi, err := buildinfo.ReadFile(cfg.Launcher.Watchsan[0]); err == nil {
			e.WatchsanGo = bi.GoVersion
		}
	}
	if cfg.Launcher.HAProxy != "" {
		e.HAProxyVersion = haproxyVersion(cfg.Launcher.HAProxy)
	}
	return e
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// ErrNoPaths is returned when no path could be measured.
var ErrNoPaths = errors.New("no path to measure")
