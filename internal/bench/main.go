package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/watchsan/watchsan/internal/stream"
)

// Main is the watchsan-bench command: `watchsan-bench [flags]` runs the bench and writes the
// report; `watchsan-bench proxy ...` is a baseline proxy (what the bench starts);
// `watchsan-bench profile ...` captures watchsan's CPU and heap profiles.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "proxy":
			return ChildMain(args[1:], stderr)
		case "profile":
			return profileMain(args[1:], stdout, stderr)
		case "report":
			return reportMain(args[1:], stdout, stderr)
		}
	}
	fs := flag.NewFlagSet("watchsan-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	watchsan := fs.String("watchsan", "bin/watchsan", "watchsan binary (make build)")
	out := fs.String("out", "docs/bench", "directory for README.md, results.json and the charts")
	short := fs.Bool("short", false, "a seconds-long run with tiny workloads (checks the harness, numbers meaningless)")
	haproxy := fs.String("haproxy", lookPath("haproxy"), "haproxy binary; empty: skip haproxy")
	paths := fs.String("paths", joinPaths(AllPaths), "paths to measure, comma-separated")
	reps := fs.Int("reps", 0, "repetitions of each saturation, latency, memory and fan-out run (0: default)")
	events := fs.Int("events", 0, "events per saturation run with one watch (0: default)")
	formats := fs.String("formats", "json,protobuf,cbor", "wire formats")
	idle := fs.String("idle-watches", "", "numbers of idle watches for the memory runs (default 5000,9900)")
	latDur := fs.Duration("latency-duration", 0, "length of one fixed-rate run (0: default)")
	phases := fs.String("phases", strings.Join(allPhases, ","), "what to measure, comma-separated; the sections of the others are kept from -out's results.json")
	fanClients := fs.String("fanout-clients", "", "numbers of identical watches for the fan-out runs on a real kube-apiserver (default 10,100,1000)")
	fanWrites := fs.Int("fanout-writes", 0, "configmaps written in each fan-out run (0: default)")
	stormClients := fs.Int("storm-clients", 0, "clients a wave of the relist storm runs on a real kube-apiserver (0: default, 200)")
	scaleWatchers := fs.String("scale-watchers", "", "numbers of watchers for the scale runs on a real kube-apiserver, spread over -scale-feeds namespaces (default 100,1000,10000)")
	scaleFeeds := fs.Int("scale-feeds", 0, "namespaces (feeds) the scale runs' watchers spread over (0: default, 100)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg := DefaultConfig()
	if *short {
		cfg = ShortConfig()
	}
	var err error
	if cfg.Paths, err = parsePaths(*paths); err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if cfg.Formats, err = parseFormats(*formats); err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	cfg.Phases = map[string]bool{}
	for _, p := range strings.Split(*phases, ",") {
		switch p = strings.TrimSpace(p); p {
		case "throughput", "latency", "ttfe", "memory", "fanout", "storm", "scale":
			cfg.Phases[p] = true
		default:
			fmt.Fprintf(stderr, "-phases: unknown phase %q\n", p)
			return 2
		}
	}
	if *reps > 0 {
		cfg.Reps, cfg.LatencyReps, cfg.MemoryReps, cfg.FanOutReps, cfg.StormReps = *reps, *reps, *reps, *reps, *reps
	}
	if *stormClients > 0 {
		cfg.StormClients = *stormClients
	}
	if *events > 0 {
		cfg.Events = *events
	}
	if *latDur > 0 {
		cfg.LatencyDuration = *latDur
	}
	if *idle != "" {
		if cfg.IdleWatches, err = parseCounts("-idle-watches", *idle); err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
	}
	if *fanClients != "" {
		if cfg.FanOutClients, err = parseCounts("-fanout-clients", *fanClients); err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
	}
	if *fanWrites > 0 {
		cfg.FanOutWrites = *fanWrites
	}
	if *scaleWatchers != "" {
		if cfg.ScaleWatchers, err = parseCounts("-scale-watchers", *scaleWatchers); err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
	}
	if *scaleFeeds > 0 {
		cfg.ScaleFeeds = *scaleFeeds
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if _, err := os.Stat(*watchsan); err != nil {
		fmt.Fprintf(stderr, "-watchsan %s: %v (run make build)\n", *watchsan, err)
		return 2
	}
	cfg.Launcher = Launcher{Baseline: []string{self, "proxy"}, Watchsan: []string{*watchsan}, HAProxy: *haproxy}
	cfg.Progress = stderr
	limit := RaiseFDLimit(1 << 16)
	if need := uint64(max(maxInt(cfg.IdleWatches), maxInt(cfg.FanOutClients))*2 + 1000); limit < need {
		fmt.Fprintf(stderr, "warning: file descriptor limit %d is below the %d the memory runs need\n", limit, need)
	}
	if *haproxy == "" {
		fmt.Fprintln(stderr, "haproxy is not installed: its path is skipped (apt-get install -y haproxy)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	res, err := Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	if kept := keepOthers(filepath.Join(*out, "results.json"), res, cfg.Phases); kept != "" {
		fmt.Fprintf(stdout, "kept %s from the previous %s/results.json\n", kept, *out)
	}
	if err := WriteReport(*out, res); err != nil {
		fmt.Fprintln(stderr, "report:", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s/README.md, results.json and charts in %v\n", *out, res.Env.Duration)
	if len(res.Errors) > 0 {
		fmt.Fprintf(stdout, "%d runs had errors (listed in the report)\n", len(res.Errors))
	}
	return 0
}

// allPhases are what -phases may name, in the order they run.
var allPhases = []string{"throughput", "latency", "ttfe", "memory", "fanout", "storm", "scale"}

// keepOthers fills res's sections of the phases this run did not measure from the results in
// file, when there are any, so that one phase can be run again alone (-phases fanout) without
// losing the others; it returns the kept phases' names, "" for none. (Throughput, latency and
// time to first event run together: keeping some of them beside a rerun of the others shows
// them under the rerun's header.)
func keepOthers(file string, res *Results, ran map[string]bool) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	var old Results
	if json.Unmarshal(b, &old) != nil {
		return ""
	}
	// An old reason a path was skipped stays only for a path this run did not measure: a
	// rerun that measured it (haproxy once the limit allowed it) must not keep saying why not.
	measured := map[PathName]bool{}
	for _, t := range res.Throughput {
		measured[t.Path] = true
	}
	for _, l := range res.Latency {
		measured[l.Path] = true
	}
	for _, t := range res.TTFE {
		measured[t.Path] = true
	}
	for _, m := range res.Memory {
		measured[m.Path] = true
	}
	var kept []string
	keep := func(phase string, has bool, copy func()) {
		if !ran[phase] && has {
			copy()
			kept = append(kept, phase)
		}
	}
	keep("throughput", len(old.Throughput) > 0, func() { res.Throughput = old.Throughput })
	keep("latency", len(old.Latency) > 0, func() { res.Latency = old.Latency })
	keep("ttfe", len(old.TTFE) > 0, func() { res.TTFE = old.TTFE })
	keep("memory", len(old.Memory) > 0, func() { res.Memory, res.MemoryEnv = old.Memory, old.MemoryEnv })
	keep("storm", old.Storm != nil, func() {
		res.Storm, res.StormAPIServer, res.StormEnv = old.Storm, old.StormAPIServer, old.StormEnv
		if res.StormEnv == nil {
			env := old.Env
			res.StormEnv = &env
		}
	})
	keep("scale", len(old.Scale) > 0, func() {
		res.Scale, res.ScaleAPIServer, res.ScaleEnv = old.Scale, old.ScaleAPIServer, old.ScaleEnv
		if res.ScaleEnv == nil {
			env := old.Env
			res.ScaleEnv = &env
		}
	})
	keep("fanout", len(old.FanOut) > 0, func() {
		res.FanOut, res.FanOutAPIServer, res.FanOutEnv = old.FanOut, old.FanOutAPIServer, old.FanOutEnv
		if res.FanOutEnv == nil {
			env := old.Env
			res.FanOutEnv = &env
		}
	})
	if len(kept) == 0 {
		return ""
	}
	// The report's header describes the throughput, latency and time-to-first-event runs;
	// memory and fan-out, when taken apart from them, say when they were taken. So the header
	// is the old one's only when it kept some of those three and ran none.
	keptMain := !ran["throughput"] && len(old.Throughput) > 0 || !ran["latency"] && len(old.Latency) > 0 || !ran["ttfe"] && len(old.TTFE) > 0
	if ran["throughput"] || ran["latency"] || ran["ttfe"] || !keptMain {
		if !ran["memory"] && len(res.Memory) > 0 && res.MemoryEnv == nil {
			env := old.Env
			res.MemoryEnv = &env
		}
	} else {
		if ran["fanout"] {
			env := res.Env
			res.FanOutEnv = &env
		}
		if ran["storm"] {
			env := res.Env
			res.StormEnv = &env
		}
		if ran["scale"] {
			env := res.Env
			res.ScaleEnv = &env
		}
		if ran["memory"] {
			env := res.Env
			res.MemoryEnv = &env
		}
		res.Env = old.Env
	}
	if !slices.ContainsFunc(kept, func(k string) bool { return k != "fanout" && k != "storm" && k != "scale" }) {
		return strings.Join(kept, ", ") // the fan-out, the storm and the scale runs have paths of their own: no skipped path of theirs to keep
	}
	for name, why := range old.Skipped {
		if res.Skipped[name] == "" && !measured[name] {
			res.Skipped[name] = why
		}
	}
	return strings.Join(kept, ", ")
}

// parseCounts parses a comma-separated list of positive numbers.
func parseCounts(flag, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%s: bad number %q", flag, f)
		}
		out = append(out, n)
	}
	return out, nil
}

// reportMain is `watchsan-bench report`: the report and charts again from a results.json.
func reportMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	in := fs.String("in", "docs/bench/results.json", "results of a run")
	out := fs.String("out", "docs/bench", "directory for README.md and the charts")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	b, err := os.ReadFile(*in)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	var res Results
	if err := json.Unmarshal(b, &res); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", *in, err)
		return 1
	}
	if err := WriteReport(*out, &res); err != nil {
		fmt.Fprintln(stderr, "report:", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s/README.md and charts\n", *out)
	return 0
}

// DefaultConfig is the full run of `make bench`.
func DefaultConfig() Config {
	return Config{
		Paths:             AllPaths,
		Formats:           []stream.Format{stream.JSON, stream.Protobuf, stream.CBOR},
		Sizes:             []int{1024, 8192},
		Concurrency:       []int{1, 100},
		Events:            20000,
		MinEventsPerWatch: 500,
		DeleteEvery:       1000,
		Reps:              5,
		MinRunDuration:    time.Second,
		RunTimeout:        4 * time.Second,
		Rates:             []float64{1000, 10000, 50000},
		LatencyWatches:    100,
		LatencyDuration:   4 * time.Second,
		LatencyReps:       3,
		TTFEWatches:       200,
		IdleWatches:       []int{5000, 9900},
		MemoryReps:        3,
		MemorySettle:      2 * time.Second,
		FanOutClients:     []int{10, 100, 1000},
		FanOutWrites:      300,
		FanOutReps:        3,
		StormClients:      200,
		StormObjects:      2000,
		StormObjectBytes:  2048,
		StormLimit:        500,
		StormReps:         1,
		ScaleWatchers:     []int{100, 1000, 10000},
		ScaleFeeds:        100,
		ScaleWrites:       1000,
	}
}

// ShortConfig is a seconds-long run with tiny workloads: it checks the harness.
func ShortConfig() Config {
	c := DefaultConfig()
	c.Sizes = []int{1024}
	c.Concurrency = []int{1, 3}
	c.Events, c.MinEventsPerWatch, c.DeleteEvery = 300, 100, 50
	c.Reps, c.LatencyReps = 1, 1
	c.MinRunDuration = 0
	c.RunTimeout = 10 * time.Second
	c.Rates = []float64{300}
	c.LatencyWatches = 3
	c.LatencyDuration = 500 * time.Millisecond
	c.TTFEWatches = 3
	c.IdleWatches = []int{20}
	c.MemoryReps = 1
	c.MemorySettle = 100 * time.Millisecond
	c.FanOutClients, c.FanOutWrites, c.FanOutReps = []int{3}, 10, 1
	c.StormClients, c.StormObjects, c.StormObjectBytes, c.StormLimit, c.StormReps = 4, 30, 256, 10, 1
	c.ScaleWatchers, c.ScaleFeeds, c.ScaleWrites = []int{6}, 3, 6
	return c
}

func maxInt(v []int) int {
	m := 0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func lookPath(name string) string {
	p, err := exec.LookPath(name)
	if err != nil {
		return ""
	}
	return p
}

func joinPaths(ps []PathName) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = string(p)
	}
	return strings.Join(s, ",")
}

func parsePaths(s string) ([]PathName, error) {
	var out []PathName
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		ok := false
		for _, k := range knownPaths {
			if string(k) == p {
				out, ok = append(out, k), true
			}
		}
		if !ok {
			return nil, fmt.Errorf("-paths: unknown path %q (known: %s)", p, joinPaths(knownPaths))
		}
	}
	return out, nil
}

func parseFormats(s string) ([]stream.Format, error) {
	var out []stream.Format
	for _, p := range strings.Split(s, ",") {
		switch strings.TrimSpace(p) {
		case "json":
			out = append(out, stream.JSON)
		case "protobuf":
			out = append(out, stream.Protobuf)
		case "cbor":
			out = append(out, stream.CBOR)
		default:
			return nil, fmt.Errorf("-formats: unknown format %q", p)
		}
	}
	return out, nil
}
