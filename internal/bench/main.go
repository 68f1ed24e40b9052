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
	reps := fs.Int("reps", 0, "repetitions of each saturation and latency run (0: default)")
	events := fs.Int("events", 0, "events per saturation run with one watch (0: default)")
	formats := fs.String("formats", "json,protobuf,cbor", "wire formats")
	idle := fs.String("idle-watches", "", "numbers of idle watches for the memory runs (default 1000,10000)")
	latDur := fs.Duration("latency-duration", 0, "length of one fixed-rate run (0: default)")
	phases := fs.String("phases", "throughput,latency,ttfe,memory", "what to measure, comma-separated")
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
		case "throughput", "latency", "ttfe", "memory":
			cfg.Phases[p] = true
		default:
			fmt.Fprintf(stderr, "-phases: unknown phase %q\n", p)
			return 2
		}
	}
	if *reps > 0 {
		cfg.Reps, cfg.LatencyReps, cfg.MemoryReps = *reps, *reps, *reps
	}
	if *events > 0 {
		cfg.Events = *events
	}
	if *latDur > 0 {
		cfg.LatencyDuration = *latDur
	}
	if *idle != "" {
		cfg.IdleWatches = nil
		for _, s := range strings.Split(*idle, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n <= 0 {
				fmt.Fprintf(stderr, "-idle-watches: bad number %q\n", s)
				return 2
			}
			cfg.IdleWatches = append(cfg.IdleWatches, n)
		}
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
	if need := uint64(maxInt(cfg.IdleWatches)*2 + 1000); limit < need {
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
		IdleWatches:       []int{1000, 10000},
		MemoryReps:        3,
		MemorySettle:      2 * time.Second,
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
