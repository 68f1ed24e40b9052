package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/bench"
	"github.com/watchsan/watchsan/test/cluster"
)

// TestScaleFeeds is the bench's scale section (internal/bench/scale.go) at a size CI affords: 200
// watchers spread over 10 namespaces, then 50 writes round-robin over them, direct over HTTP/2
// and through watchsan both ways (node-local over HTTP/1.1 lending its identity; a frontend
// over HTTP/2 with TLS, the clients' one token passed on). Every watcher reads every write of
// its namespace exactly once, each write reaches its namespace's 20 watchers (1,000 deliveries),
// and through watchsan the apiserver holds one watch per namespace, not one per watcher. The
// latencies are logged, not judged: on a shared 2-core machine they measure the machine.
func TestScaleFeeds(t *testing.T) {
	const watchers, feeds, writes = 200, 10, 50
	c := newCluster(t, cluster.Options{})
	ctx := ctxT(t, 8*time.Minute)
	e, err := bench.NewScaleEnv(ctx, c, feeds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	for _, m := range []bench.ScaleMode{bench.ScaleDirect2, bench.ScaleWatchsan1, bench.ScaleWatchsan2} {
		target := bench.FanOutTarget{URL: c.APIServers[0].URL}
		if args := e.ScaleArgs(m); args != nil {
			p := startProxy(t, append(args, "--log-level=info")...)
			target.URL, target.PID, target.AdminURL = p.URL, p.cmd.Process.Pid, p.AdminURL
			if m == bench.ScaleWatchsan2 {
				target.URL = strings.Replace(p.URL, "http://", "https://", 1)
			}
			target.Stop = func() { _ = p.Stop() }
		}
		s := e.Measure(ctx, m, target, watchers, writes, 2*time.Minute)
		t.Logf("%s: %d watchers over %d feeds: upstream watches %v, delivered %d, latency p50 %v p99 %v max %v, CPU per event %.1f µs, watchsan %.1f KiB per subscriber",
			m, watchers, feeds, s.UpstreamWatches, s.Delivered, s.P50, s.P99, s.Max, s.CPUPerEventUs(), s.KiBPerSubscriber())
		if s.Err != "" {
			t.Fatalf("%s: %s", m, s.Err)
		}
		if want := writes * watchers / feeds; s.Delivered != want {
			t.Errorf("%s: %d deliveries, want %d (each write to its namespace's %d watchers)", m, s.Delivered, want, watchers/feeds)
		}
		if target.PID != 0 && s.UpstreamWatches > feeds+2 {
			t.Errorf("%s: the apiserver holds %v more watches, want at most one per namespace (%d) and 2 more", m, s.UpstreamWatches, feeds)
		}
		if target.PID == 0 && s.UpstreamWatches < watchers {
			t.Errorf("%s: the apiserver holds %v more watches, want one per watcher (%d)", m, s.UpstreamWatches, watchers)
		}
	}
}
