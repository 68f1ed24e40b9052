package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// WriteReport writes README.md, results.json and the charts into dir.
func WriteReport(dir string, res *Results) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	for name, draw := range map[string]func(string, *Results) error{
		"throughput.png": throughputChart, "latency.png": latencyChart, "memory.png": memoryChart,
		"fanout.png": fanOutChart, "scale.png": scaleChart,
	} {
		if err := draw(filepath.Join(dir, name), res); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	f, err := os.Create(filepath.Join(dir, "README.md"))
	if err != nil {
		return err
	}
	writeMarkdown(f, res)
	return f.Close()
}

// Targets are the goals set for watchsan's repair mode (docs/bench/NOTES.md).
const (
	targetVsPass       = 1.0 // throughput ≥ 1.0x the pass-through
	targetVsDirect     = 0.5 // throughput ≥ 0.5x direct
	targetCPUVsPass    = 1.0 // CPU per event ≤ 1.0x the pass-through's
	targetAddedP99     = time.Millisecond
	targetAddedP99Rate = 10000
	targetMemVsPass    = 0.75 // idle-watch memory ≤ 0.75x the pass-through
	// 9,900, not 10,000: watchsan fits --max-connections to its open-file limit (two per
	// client, config.FitConnections), and machines here have a hard limit of 20,000 that root
	// cannot raise (no CAP_SYS_RESOURCE): 9,936 connections at most.
	targetMemWatches = 9900
	// identical idle watches sharing one feed (watchsan-share), at 5,000.
	targetShareMemVsPass  = 0.5
	targetShareMemWatches = 5000
)

// Target is one goal and whether this run met it.
type Target struct {
	Goal, Measured string
	Pass           bool
	Known          bool // false: not measured in this run
}

func (r *Results) throughputOf(p PathName, key string) *ThroughputResult {
	for _, t := range r.Throughput {
		if t.Path == p && t.Key() == key {
			return t
		}
	}
	return nil
}

func (r *Results) latencyOf(p PathName, rate float64) *LatencyResult {
	for _, l := range r.Latency {
		if l.Path == p && l.Rate == rate {
			return l
		}
	}
	return nil
}

func (r *Results) memoryOf(p PathName, n int) *MemoryResult {
	for _, m := range r.Memory {
		if m.Path == p && m.Watches == n {
			return m
		}
	}
	return nil
}

// Targets evaluates the goals on this run.
func (r *Results) Targets() []Target {
	var vsPass, vsDirect, cpu []Target
	for _, t := range r.Throughput {
		if t.Path != WatchsanRepair || (t.Format != "json" && t.Format != "protobuf") {
			continue
		}
		if p := r.throughputOf(Pass, t.Key()); p != nil && p.EventsPerSec > 0 {
			x := t.EventsPerSec / p.EventsPerSec
			vsPass = append(vsPass, Target{Goal: fmt.Sprintf("repair throughput %s ≥ %.1fx pass-through", t.Key(), targetVsPass),
				Measured: fmt.Sprintf("%.2fx", x), Pass: x >= targetVsPass, Known: true})
			if p.CPUPerM > 0 && t.CPUPerM > 0 {
				c := t.CPUPerM / p.CPUPerM
				cpu = append(cpu, Target{Goal: fmt.Sprintf("repair CPU per event %s ≤ %.1fx pass-through", t.Key(), targetCPUVsPass),
					Measured: fmt.Sprintf("%.2fx (%.2f vs %.2f s/M)", c, t.CPUPerM, p.CPUPerM), Pass: c <= targetCPUVsPass, Known: true})
			}
		}
		if d := r.throughputOf(Direct, t.Key()); d != nil && d.EventsPerSec > 0 {
			x := t.EventsPerSec / d.EventsPerSec
			vsDirect = append(vsDirect, Target{Goal: fmt.Sprintf("repair throughput %s ≥ %.1fx direct", t.Key(), targetVsDirect),
				Measured: fmt.Sprintf("%.2fx", x), Pass: x >= targetVsDirect, Known: true})
		}
	}
	out := append(append(vsPass, vsDirect...), cpu...)
	lat := Target{Goal: fmt.Sprintf("repair added p99 latency at %s events/s ≤ %v", si(targetAddedP99Rate), targetAddedP99)}
	if w, d := r.latencyOf(WatchsanRepair, targetAddedP99Rate), r.latencyOf(Direct, targetAddedP99Rate); w != nil && d != nil {
		added := w.P99 - d.P99
		lat.Measured, lat.Pass, lat.Known = fmtDur(added), added <= targetAddedP99, true
	}
	out = append(out, lat)
	mem := Target{Goal: fmt.Sprintf("repair memory per idle watch at %d watches ≤ %.2fx pass-through", targetMemWatches, targetMemVsPass)}
	if w, p := r.memoryOf(WatchsanRepair, targetMemWatches), r.memoryOf(Pass, targetMemWatches); w != nil && p != nil && w.PerWatchKiB > 0 && p.PerWatchKiB > 0 {
		x := w.PerWatchKiB / p.PerWatchKiB
		mem.Measured, mem.Pass, mem.Known = fmt.Sprintf("%.2fx (%.1f vs %.1f KiB)", x, w.PerWatchKiB, p.PerWatchKiB), x <= targetMemVsPass, true
	}
	out = append(out, mem)
	if r.memoryOf(WatchsanShare, targetShareMemWatches) != nil {
		sm := Target{Goal: fmt.Sprintf("shared-feed memory per identical idle watch at %d watches ≤ %.2fx pass-through", targetShareMemWatches, targetShareMemVsPass)}
		if w, p := r.memoryOf(WatchsanShare, targetShareMemWatches), r.memoryOf(Pass, targetShareMemWatches); p != nil && w.PerWatchKiB > 0 && p.PerWatchKiB > 0 {
			x := w.PerWatchKiB / p.PerWatchKiB
			sm.Measured, sm.Pass, sm.Known = fmt.Sprintf("%.2fx (%.1f vs %.1f KiB)", x, w.PerWatchKiB, p.PerWatchKiB), x <= targetShareMemVsPass, true
		}
		out = append(out, sm)
	}
	return out
}

func fmtDur(d time.Duration) string {
	sign := ""
	if d < 0 {
		sign, d = "-", -d
	}
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%s%.2f s", sign, d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%s%.2f ms", sign, float64(d)/1e6)
	}
	return fmt.Sprintf("%s%.0f µs", sign, float64(d)/1e3)
}

func ratio(a, b float64) string {
	if a <= 0 || b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

func passFail(t Target) string {
	switch {
	case !t.Known:
		return "not measured"
	case t.Pass:
		return "**pass**"
	}
	return "**FAIL**"
}

func writeMarkdown(w io.Writer, r *Results) {
	e, c := r.Env, r.Config
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("# watchsan benchmark")
	p("")
	p("Generated by `make bench` (`cmd/watchsan-bench`, code in `internal/bench`) on %s in %v.", e.Date, e.Duration)
	p("")
	p("> **Taken on a busy machine.** Other engineers were compiling and running tests on the same %d cores",
		e.NumCPU)
	p("> during this run: load average (1, 5, 15 min) %s before and %s after. Absolute numbers are noisy;", e.LoadBefore, e.LoadAfter)
	p("> the ratios compare paths measured in the same run, interleaved, and are the figures to read.")
	p("")
	p("| | |")
	p("|---|---|")
	p("| machine | %d CPUs, %s, Linux %s |", e.NumCPU, e.CPUModel, e.Kernel)
	p("| Go | %s (bench), %s (watchsan binary) |", e.GoVersion, orDash(e.WatchsanGo))
	p("| watchsan | %s |", orDash(e.WatchsanVersion))
	p("| haproxy | %s |", orDash(e.HAProxyVersion))
	p("| file descriptor limit | %d (hard limit of this machine) |", e.FDLimit)
	p("")

	p("## Targets (watchsan --fix-mode repair)")
	p("")
	p("| target | measured | |")
	p("|---|---|---|")
	for _, t := range r.Targets() {
		p("| %s | %s | %s |", t.Goal, orDash(t.Measured), passFail(t))
	}
	p("")

	p("## How it was measured")
	p("")
	p("Paths, each reached by the same client:")
	p("")
	for _, name := range c.Paths {
		note := ""
		if why := r.Skipped[name]; why != "" {
			note = " — **skipped**: " + oneLine(why)
		}
		p("- `%s`: %s%s", name, pathDescription[name], note)
	}
	p("")
	p("- **Upstream**: a synthetic apiserver in the bench process. It answers `/readyz`; serves")
	p("  `GET /api/v1/namespaces/NS/configmaps?watch=1&resourceVersion=N` with the events after N in")
	p("  resourceVersion order, then keeps the stream open; answers in the format `Accept` asks for")
	p("  (JSON, protobuf `;stream=watch`, CBOR `application/cbor-seq`) and never gzips. Events are")
	p("  ConfigMaps (labels, annotations, managedFields, data) encoded once, beforehand, with")
	p("  apimachinery's serializers and framers exactly as the apiserver encodes them; sizes are the")
	p("  JSON event size (%s), protobuf and CBOR events of the same object are smaller.", sizesList(c.Sizes))
	p("  At saturation it writes 64 KiB batches and flushes each; at a fixed rate it writes and flushes")
	p("  each event on its own schedule. `direct` shows what the upstream and the client can do together.")
	if c.DeleteEvery > 0 {
		p("- **Regressions**: every %d-th event is a DELETED whose resourceVersion goes back (the", c.DeleteEvery)
		p("  Kubernetes 1.7-1.9 bug), so watchsan's rewrite path runs; repair mode must rewrite each one,")
		p("  every other path must pass it unchanged, and the client checks that it did.")
	}
	p("- **Client**: in the bench process, Go's HTTP/1.1 client over plain TCP on loopback, one connection")
	p("  per watch, for every path (watchsan's main listener serves plain HTTP/1.1 unless given TLS files,")
	p("  so no path is given HTTP/2 by the client). It checks every event: count, order, type, name and")
	p("  resourceVersion, byte for byte against the expected frame, or parsed where a proxy re-encodes.")
	p("- **Proxy to upstream**: plain HTTP/1.1 (a connection per watch) for throughput, latency and time to")
	p("  first event; HTTPS with HTTP/2 (at most %d streams per connection, kube-apiserver's default) for", maxStreamsPerConn)
	p("  the memory runs, as against a real apiserver. watchsan runs as its real binary (`make build`):")
	p("  `--upstream URL --no-credentials --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --fix-mode MODE")
	p("  --log-level error`. The baselines run as `watchsan-bench proxy --mode pass|decode`, so each proxy")
	p("  is a process of its own and its CPU and memory are read the same way.")
	p("- **Throughput**: %d events for one watch; with N watches, max(%d/N, %d) events each, all at", c.Events, c.Events, c.MinEventsPerWatch)
	p("  once. A run repeats its watches until it has lasted %v (cut at %v); events/s and MB/s are", c.MinRunDuration, c.RunTimeout)
	p("  counted at the client from the first request to the last event. CPU is the proxy process's")
	p("  `utime+stime` from `/proc/PID/stat` over the run, per million events delivered.")
	p("- **Latency**: %d watches, paced by the upstream to the total rate, %v per run. Each event carries", c.LatencyWatches, c.LatencyDuration)
	p("  its send time in an annotation (written into the pre-encoded bytes as it is sent); the client")
	p("  subtracts it from the time it has read the whole event. *Added* latency is the path's")
	p("  percentile minus direct's from the same run. A path that cannot keep up is cut at %v.", 2*c.LatencyDuration+5*time.Second)
	p("- **Time to first event**: %d new watches one after another (a new client connection each), from", c.TTFEWatches)
	p("  the request to the first event read.")
	p("- **Memory**: a fresh proxy process per run; one watch is opened first, then VmRSS is read; N more")
	p("  idle watches (one event each, then quiet) are opened, and after %v VmRSS is read again:", c.MemorySettle)
	p("  (after - before) / N. `fds` is the process's open file descriptors with the N watches open.")
	p("- **Repetitions**: %d of each throughput run and %d of each latency run, paths interleaved (their", c.Reps, c.LatencyReps)
	p("  order rotates each repetition); %d of each memory run. Tables show medians.", c.MemoryReps)
	p("")

	p("## Throughput at saturation")
	p("")
	p("![events per second by path](throughput.png)")
	p("")
	p("| workload | path | events/s | MB/s | vs direct | vs pass | CPU s / M events | CPU vs pass | checked |")
	p("|---|---|---:|---:|---:|---:|---:|---:|---|")
	for _, t := range r.Throughput {
		d, ps := r.throughputOf(Direct, t.Key()), r.throughputOf(Pass, t.Key())
		var dv, pv, pcpu float64
		if d != nil {
			dv = d.EventsPerSec
		}
		if ps != nil {
			pv, pcpu = ps.EventsPerSec, ps.CPUPerM
		}
		cpu, cpuX := "-", "-"
		if t.Path != Direct {
			cpu, cpuX = fmt.Sprintf("%.2f", t.CPUPerM), ratio(t.CPUPerM, pcpu)
		}
		p("| %s | %s | %s | %.1f | %s | %s | %s | %s | %s |", t.Key(), t.Path, si(t.EventsPerSec), t.MBPerSec,
			ratio(t.EventsPerSec, dv), ratio(t.EventsPerSec, pv), cpu, cpuX, checked(t))
	}
	p("")

	if len(r.Latency) > 0 {
		p("## Latency per event at fixed rates")
		p("")
		p("![latency percentiles by rate](latency.png)")
		p("")
		p("| rate (all watches) | path | p50 | p99 | p99.9 | added p50 | added p99 | added p99.9 | p99 vs direct | added p99 vs pass | delivered ev/s | checked |")
		p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
		for _, l := range r.Latency {
			d := r.latencyOf(Direct, l.Rate)
			add := func(v, dv time.Duration) string {
				if d == nil || l.Path == Direct {
					return "-"
				}
				return fmtDur(v - dv)
			}
			var d50, d99, d999 time.Duration
			if d != nil {
				d50, d99, d999 = d.P50, d.P99, d.P999
			}
			passAdded := "-"
			if ps := r.latencyOf(Pass, l.Rate); ps != nil && d != nil && l.Path != Direct {
				passAdded = ratio(float64(l.P99-d99), float64(ps.P99-d99))
			}
			ok := "all events"
			cut := 0
			for _, s := range l.Samples {
				if s.Cut {
					cut++
				}
			}
			switch {
			case !l.Complete:
				ok = "**errors**: " + latencyErr(l)
			case cut > 0:
				ok = fmt.Sprintf("could not keep up: cut in %d of %d runs", cut, len(l.Samples))
			}
			p("| %s/s × %d watches | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.0f | %s |", si(l.Rate), l.Watches, l.Path,
				fmtDur(l.P50), fmtDur(l.P99), fmtDur(l.P999), add(l.P50, d50), add(l.P99, d99), add(l.P999, d999),
				ratio(float64(l.P99), float64(d99)), passAdded, l.DeliveredRate, ok)
		}
		p("")
	}

	if len(r.TTFE) > 0 {
		p("## Time to first event of a new watch")
		p("")
		p("| path | watches | p50 | p99 | p50 vs direct | p50 vs pass |")
		p("|---|---:|---:|---:|---:|---:|")
		var d, ps float64
		for _, t := range r.TTFE {
			switch t.Path {
			case Direct:
				d = float64(t.P50)
			case Pass:
				ps = float64(t.P50)
			}
		}
		for _, t := range r.TTFE {
			errNote := ""
			if t.Err != "" {
				errNote = " (error: " + oneLine(t.Err) + ")"
			}
			p("| %s | %d | %s | %s | %s | %s |%s", t.Path, t.N, fmtDur(t.P50), fmtDur(t.P99), ratio(float64(t.P50), d), ratio(float64(t.P50), ps), errNote)
		}
		p("")
	}

	if len(r.Memory) > 0 {
		p("## Resident memory per idle watch")
		p("")
		if e := r.MemoryEnv; e != nil {
			p("%s", takenApart("memory", e))
			p("")
		}
		p("![memory per idle watch](memory.png)")
		p("")
		p("| idle watches | path | KiB per watch | vs pass | RSS before → after (KiB) | fds | upstream watches | runs |")
		p("|---:|---|---:|---:|---|---:|---:|---|")
		for _, m := range r.Memory {
			var pv float64
			if ps := r.memoryOf(Pass, m.Watches); ps != nil {
				pv = ps.PerWatchKiB
			}
			var runs []string
			before, after, fds, ups := "", "", 0, int64(0)
			for _, s := range m.Samples {
				if s.Err != "" {
					runs = append(runs, "error: "+oneLine(s.Err))
					continue
				}
				runs = append(runs, fmt.Sprintf("%.1f", s.PerWatchKiB))
				before, after, fds, ups = fmt.Sprint(s.RSSBeforeKiB), fmt.Sprint(s.RSSAfterKiB), s.FDs, s.UpstreamWatches
			}
			// Every measured path holds at least one upstream watch with the idle ones open,
			// so 0 is a run from before the count existed (or one that failed): not measured.
			upsCell := "not measured"
			if ups > 0 {
				upsCell = fmt.Sprint(ups)
			}
			p("| %d | %s | %.1f | %s | %s → %s | %d | %s | %s |", m.Watches, m.Path, m.PerWatchKiB, ratio(m.PerWatchKiB, pv), before, after, fds, upsCell, strings.Join(runs, ", "))
		}
		p("")
	}
	if len(r.FanOut) > 0 {
		writeFanOut(p, r)
	}
	if r.Storm != nil && len(r.Storm.Samples) > 0 {
		writeStorm(p, r)
	}
	if len(r.Scale) > 0 {
		writeScale(p, r)
	}
	if len(r.Skipped) > 0 {
		p("## Skipped")
		p("")
		for _, name := range knownPaths {
			if why := r.Skipped[name]; why != "" {
				p("- `%s`: %s", name, oneLine(why))
			}
		}
		p("")
	}
	if len(r.Errors) > 0 {
		p("## Errors")
		p("")
		for _, e := range r.Errors {
			p("- %s", oneLine(e))
		}
		p("")
	}
	p("Raw numbers of every run: [results.json](results.json). Regenerate with `make bench`;")
	p("`make bench BENCHFLAGS=\"-short -out /tmp/bench-short\"` checks the harness in seconds, and")
	p("`bin/watchsan-bench profile` takes watchsan's CPU profile at saturation and heap profile with")
	p("5,000 idle watches (`-path pass -idle 0`: the pass-through's CPU profile under the same load).")
}

func checked(t *ThroughputResult) string {
	var errs []string
	cut := 0
	for _, s := range t.Samples {
		if s.Err != "" {
			errs = append(errs, s.Err)
		}
		if s.Cut {
			cut++
		}
	}
	switch {
	case len(errs) > 0:
		return "**errors**: " + oneLine(summarize(errs))
	case cut > 0:
		return fmt.Sprintf("cut in %d of %d runs (too slow to finish)", cut, len(t.Samples))
	}
	return "all events"
}

func latencyErr(l *LatencyResult) string {
	var errs []string
	for _, s := range l.Samples {
		if s.Err != "" {
			errs = append(errs, s.Err)
		}
	}
	return oneLine(summarize(errs))
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	s = strings.ReplaceAll(s, "|", "\\|")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// takenApart says when and on what a section that ran alone (-phases phase) was measured.
func takenApart(phase string, e *Env) string {
	return fmt.Sprintf("Taken apart from the sections above (`-phases %s`) on %s in %v, watchsan %s, %d CPUs (%s), load %s before and %s after.",
		phase, e.Date, e.Duration, orDash(e.WatchsanVersion), e.NumCPU, orDash(e.CPUModel), e.LoadBefore, e.LoadAfter)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func sizesList(sizes []int) string {
	var s []string
	for _, n := range sizes {
		s = append(s, "~"+sizeName(n))
	}
	return strings.Join(s, " and ")
}

// writeFanOut is the fan-out section.
func writeFanOut(p func(string, ...any), r *Results) {
	p("## Fan-out: N identical watches on a real kube-apiserver")
	p("")
	p("N clients watch the same namespace's configmaps from the same resourceVersion, then %d configmaps are", r.FanOut[0].Writes)
	p("written (10 writers) on a kube-apiserver %s and etcd of their own (test/cluster). Upstream watches are", orDash(r.FanOutAPIServer))
	p("the apiserver's `apiserver_longrunning_requests{verb=\"WATCH\",resource=\"configmaps\"}` with the")
	p("clients open, minus before. The apiserver's CPU for the fan-out is its CPU (10 ms ticks of")
	p("/proc/PID/stat) from the first write until every client had every write, minus the same writes")
	p("with no watcher (the median of one such run before each run of every row). Each row is the run")
	p("with the median apiserver CPU of its repetitions, each with a fresh watchsan. watchsan's CPU per subscriber is")
	p("its CPU over the same span per client watch; its memory per subscriber is its VmRSS growth from")
	p("before the clients opened their watches, per watch (at small N mostly the feed's own). Every")
	p("client must see every write exactly once and in resourceVersion order (checked).")
	p("The apiserver settles (at most 2 ticks in half a second) before every measured span.")
	if e := r.FanOutEnv; e != nil {
		p("%s", takenApart("fanout", e))
	}
	p("")
	p("![fan-out](fanout.png)")
	p("")
	for _, m := range FanOutModes {
		p("- `%s`: %s", m, fanOutDescription[m])
	}
	p("")
	p("| clients | path | upstream watches | apiserver CPU over the writes (ticks) | for the fan-out (minus %s) | vs direct | watchsan CPU per subscriber | watchsan memory per subscriber | delivered | checked | runs, ticks over the writes |", "baseline")
	p("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
	for _, fr := range r.FanOut {
		var direct float64
		if d := fr.Of(FanDirect); d != nil {
			direct = float64(fr.FanOutTicks(d))
		}
		for i := range fr.Samples {
			s := &fr.Samples[i]
			cpu, mem := "—", "—"
			if s.Mode != FanDirect {
				cpu = fmt.Sprintf("%.2f ms", s.WatchsanCPUPerSubscriberMs())
				mem = fmt.Sprintf("%.1f KiB", s.WatchsanKiBPerSubscriber())
			}
			check := "every write once, in order"
			if s.Err != "" {
				check = "error: " + oneLine(s.Err)
			}
			p("| %d | %s | %.0f | %d | %d | %s | %s | %s | %s | %s | %s |", fr.Clients, s.Mode, s.UpstreamWatches, s.APIServerTicks,
				fr.FanOutTicks(s), fanOutRatio(float64(fr.FanOutTicks(s)), direct), cpu, mem, fmtDur(s.Delivered), check, joinInts(fr.RunTicks(s.Mode)))
		}
	}
	p("")
	var base []string
	for _, fr := range r.FanOut {
		base = append(base, fmt.Sprintf("%d clients: %d (%s)", fr.Clients, fr.BaselineTicks, joinInts(fr.Baselines)))
	}
	p("Baselines, ticks for the writes with no watcher: %s.", strings.Join(base, "; "))
	p("")
}

func joinInts(v []int64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}

// fanOutRatio is ratio, with a fan-out at or below the baseline's noise shown as such.
func fanOutRatio(a, direct float64) string {
	if a <= 0 && direct > 0 {
		return "≤0x (within the baseline's noise)"
	}
	return ratio(a, direct)
}
