package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/watchsan/watchsan/internal/stream"
)

// profileMain is `watchsan-bench profile`: watchsan (repair mode, --enable-pprof) under the
// saturation workload while its CPU profile is taken, then a fresh watchsan holding idle
// watches while its heap profile is taken. With -path pass or frames the CPU profile is that
// baseline's instead, under the same workload (and -idle 0 skips the heap part). It writes
// cpu.pprof and heap.pprof into -out and prints `go tool pprof -top` of both when the go
// command is at hand.
func profileMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("profile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	watchsan := fs.String("watchsan", "bin/watchsan", "watchsan binary")
	out := fs.String("out", "bench-profiles", "directory for cpu.pprof and heap.pprof")
	seconds := fs.Int("seconds", 10, "length of the CPU profile")
	format := fs.String("format", "json", "wire format of the saturation workload")
	size := fs.Int("size", 1024, "JSON event size of the saturation workload, bytes")
	watches := fs.Int("watches", 1, "concurrent watches of the saturation workload")
	idle := fs.Int("idle", 5000, "idle watches held for the heap profile")
	top := fs.Int("top", 15, "entries of go tool pprof -top")
	path := fs.String("path", string(WatchsanRepair), "whose CPU profile: watchsan-repair, watchsan-share (the heap of idle watches sharing one feed too), pass (the httputil.ReverseProxy baseline) or frames (watchsan's stream.Reader alone)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	switch PathName(*path) {
	case WatchsanRepair, WatchsanShare, Pass, Frames:
	default:
		fmt.Fprintln(stderr, "-path: watchsan-repair, watchsan-share, pass or frames")
		return 2
	}
	formats, err := parseFormats(*format)
	if err != nil || len(formats) != 1 {
		fmt.Fprintln(stderr, "-format: one of json, protobuf, cbor")
		return 2
	}
	RaiseFDLimit(1 << 16)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	p := profiler{watchsan: *watchsan, self: self, path: PathName(*path), out: *out, stdout: stdout, stderr: stderr, top: *top}
	if err := p.run(ctx, formats[0], *size, *watches, *seconds, *idle); err != nil {
		fmt.Fprintln(stderr, "profile:", err)
		return 1
	}
	return 0
}

type profiler struct {
	watchsan, out  string
	self           string   // this binary: the baseline proxies' "proxy" subcommand
	path           PathName // whose CPU profile
	stdout, stderr io.Writer
	top            int
}

func (p *profiler) run(ctx context.Context, f stream.Format, size, watches, seconds, idle int) error {
	dir, err := os.MkdirTemp("", "watchsan-profile-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	up, err := startUpstream(NewUpstream(), dir)
	if err != nil {
		return err
	}
	defer up.Close()
	l := Launcher{Watchsan: []string{p.watchsan}, WatchsanExtra: []string{"--enable-pprof"}, Dir: dir,
		Baseline: []string{p.self, "proxy"}, BaselinePprof: true}

	set, err := NewEventSet(Workload{Format: f, ObjectSize: size, Events: 20000, DeleteEvery: 1000, BaseRV: 1_000_000})
	if err != nil {
		return err
	}
	perWatch := 20000
	if watches > 1 {
		perWatch = max(20000/watches, 500)
	}
	sc := &Scenario{Set: set, Count: perWatch}
	up.Set("sat", sc)
	w, err := l.start(ctx, p.path, upstreamSpec{url: up.plainURL})
	if err != nil {
		return err
	}
	cpuFile := filepath.Join(p.out, "cpu.pprof")
	fmt.Fprintf(p.stderr, "CPU profile of %s, %s/%s, %d watch(es) at saturation, %d s\n", p.path, f, sizeName(size), watches, seconds)
	pctx, cancel := context.WithCancel(ctx)
	var events int64
	var mu sync.Mutex
	start := time.Now()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		hc := newClient(64 << 10)
		defer hc.CloseIdleConnections()
		for pctx.Err() == nil {
			var rw sync.WaitGroup
			for range watches {
				rw.Add(1)
				go func() {
					defer rw.Done()
					r := runWatch(pctx, hc, watchOpts{base: w.url, ns: "sat", sc: sc, repaired: p.path.repairs(), lent: p.path.lends(), readBuf: 256 << 10})
					mu.Lock()
					events += int64(r.events)
					mu.Unlock()
				}()
			}
			rw.Wait()
		}
	}()
	user0, sys0, _ := procTimes(w.pid)
	r0, w0, ioErr := procSyscalls(w.pid)
	err = fetch(ctx, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", w.admin, seconds), cpuFile, time.Duration(seconds+30)*time.Second)
	user1, sys1, _ := procTimes(w.pid)
	r1, w1, ioErr1 := procSyscalls(w.pid)
	cancel()
	wg.Wait()
	elapsed := time.Since(start)
	w.stop()
	if err != nil {
		return err
	}
	perM := func(s float64) float64 { return s / float64(max(events, 1)) * 1e6 }
	fmt.Fprintf(p.stdout, "== CPU: %d events in %v (%.0f events/s) while profiling, %.2f CPU s per million events (user %.2f, kernel %.2f); %s\n",
		events, elapsed.Round(time.Millisecond), float64(events)/elapsed.Seconds(),
		perM(user1-user0+sys1-sys0), perM(user1-user0), perM(sys1-sys0), cpuFile)
	if ioErr == nil && ioErr1 == nil {
		// The events counted span a little more than the profile (the watches run until
		// cancel): close enough to say how many system calls an event costs.
		fmt.Fprintf(p.stdout, "== system calls per thousand events: %.1f reads, %.1f writes\n",
			float64(r1-r0)*1000/float64(max(events, 1)), float64(w1-w0)*1000/float64(max(events, 1)))
	}
	bin := p.watchsan
	if p.path == Pass || p.path == Frames {
		bin = p.self
	}
	p.pprofTop(bin, cpuFile)
	if idle <= 0 {
		return nil
	}

	isc := &Scenario{Set: set, Count: 1}
	up.Set("idle", isc)
	heapOf := WatchsanRepair
	if p.path == WatchsanShare {
		heapOf = WatchsanShare
	}
	w, err = l.start(ctx, heapOf, upstreamSpec{url: up.tlsURL, caFile: up.caFile})
	if err != nil {
		return err
	}
	defer w.stop()
	hc := newClient(4 << 10)
	defer hc.CloseIdleConnections()
	ictx, icancel := context.WithTimeout(ctx, 5*time.Minute)
	defer icancel()
	var iwg sync.WaitGroup
	defer iwg.Wait()
	defer icancel()
	if err := openIdle(ictx, &iwg, hc, w.url, heapOf, isc, idle); err != nil {
		return err
	}
	sleepCtx(ctx, 2*time.Second)
	rss, _ := procStatus(w.pid, "VmRSS")
	heapFile := filepath.Join(p.out, "heap.pprof")
	if err := fetch(ctx, w.admin+"/debug/pprof/heap?gc=1", heapFile, time.Minute); err != nil {
		return err
	}
	goroutines := ""
	if err := fetch(ctx, w.admin+"/debug/pprof/goroutine?debug=1", filepath.Join(p.out, "goroutine.txt"), time.Minute); err == nil {
		if b, err := os.ReadFile(filepath.Join(p.out, "goroutine.txt")); err == nil {
			goroutines, _, _ = strings.Cut(string(b), "\n")
		}
	}
	fmt.Fprintf(p.stdout, "\n== heap: %d idle watches over HTTP/2 upstream; VmRSS %d KiB, %d fds, %s; %s\n", idle, rss, procFDs(w.pid), goroutines, heapFile)
	// The runtime's own account (heap?debug=1 ends with MemStats): how the RSS splits into
	// heap, goroutine stacks and the rest, per idle watch.
	statsFile := filepath.Join(p.out, "memstats.txt")
	if err := fetch(ctx, w.admin+"/debug/pprof/heap?debug=1", statsFile, time.Minute); err == nil {
		if b, err := os.ReadFile(statsFile); err == nil {
			_, stats, _ := strings.Cut(string(b), "\n# runtime.MemStats\n")
			for _, line := range strings.Split(stats, "\n") {
				var name string
				var v int64
				if _, err := fmt.Sscanf(line, "# %s = %d", &name, &v); err != nil {
					continue
				}
				switch name {
				case "HeapInuse", "HeapIdle", "HeapReleased", "Stack", "MSpan", "GCSys", "OtherSys", "Sys": // Stack and MSpan: "in use / sys"
					fmt.Fprintf(p.stdout, "%-12s %9d KiB  %6.1f KiB per idle watch\n", name, v>>10, float64(v)/1024/float64(idle))
				}
			}
		}
	}
	p.pprofTop(p.watchsan, heapFile, "-sample_index=inuse_space")
	return nil
}

func (p *profiler) pprofTop(bin, file string, extra ...string) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		fmt.Fprintf(p.stdout, "(go not found: run go tool pprof -top %s %s)\n", bin, file)
		return
	}
	args := append([]string{"tool", "pprof", "-top", fmt.Sprintf("-nodecount=%d", p.top)}, extra...)
	args = append(args, bin, file)
	cmd := exec.Command(goBin, args...)
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	_ = cmd.Run()
}

func fetch(ctx context.Context, url, file string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
