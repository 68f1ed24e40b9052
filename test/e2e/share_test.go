package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/bench"
	"github.com/watchsan/watchsan/test/cluster"
)

// TestShareFanOut is the fan-out measurement and its targets: 300 clients watch the
// same configmaps from the same resourceVersion, then 300 configmaps are written, in the same
// run directly (each client its own TLS connection and ServiceAccount token), through watchsan
// without sharing (own tokens), with --share-watches and each client's own token (admitted by a
// SelfSubjectAccessReview: pass-through) and with --share-watches lending its identity. With
// sharing the real kube-apiserver holds at most 3 watches of them in both modes, every client
// of every mode sees every write exactly once and in resourceVersion order, and the
// apiserver's CPU for the fan-out (over the writes, minus the same writes with no watcher)
// through a shared feed is at most 0.25x direct's (0.4x with watchsan built with -race, below), each
// mode judged by the median of three runs. The measurement is the bench's fan-out
// section's (internal/bench/fanout.go); a token without RBAC and a bad token while a feed is
// open are TestSharedFeedAccessReviewRealAPIServer's.
func TestShareFanOut(t *testing.T) {
	const clients, writes, maxShared, maxRatio, maxRatioRace, reps = 300, 300, 3, 0.25, 0.4, 3
	c := newCluster(t, cluster.Options{})
	ctx := ctxT(t, 10*time.Minute)
	e, err := bench.NewFanOutEnv(ctx, c, "fanout", clients)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	res := &bench.FanOutResult{Clients: clients, Writes: writes}
	// Each mode is measured reps times and judged by its median run, as make bench does: with
	// sharing the fan-out is a few ticks, well inside one run's noise (a baseline's runs here
	// ranged 19 to 55 ticks under -race), so one run alone failed 0.25x about as often as not.
	for rep := range reps {
		for _, m := range bench.FanOutModes {
			b, err := e.Baseline(ctx, writes)
			if err != nil {
				t.Fatal(err)
			}
			res.Baselines = append(res.Baselines, b)
			target := bench.FanOutTarget{Mode: m, URL: c.APIServers[0].URL}
			if m != bench.FanDirect {
				p := startProxy(t, append(e.FanOutArgs(m), "--log-level=info")...)
				target.URL, target.PID, target.AdminURL = p.URL, p.cmd.Process.Pid, p.AdminURL
				target.Stop = func() { _ = p.Stop() }
				target.WhileOpen = func() {
					t.Logf("%s: watchsan: shared feeds %v, subscribers %v, joins %v, private feeds %v, reviews allowed %v (coalesced %v), open watches %v",
						m, p.Metric("watchsan_shared_feeds", nil), p.Metric("watchsan_shared_feed_subscribers", nil),
						p.Metric("watchsan_shared_feed_joins_total", nil), p.Metric("watchsan_watch_private_feeds_total", nil),
						p.Metric("watchsan_shared_feed_access_reviews_total", map[string]string{"result": "allowed"}),
						p.Metric("watchsan_shared_feed_access_reviews_total", map[string]string{"result": "coalesced"}),
						p.Metric("watchsan_open_watches", nil))
					if m == bench.FanOwn {
						return
					}
					if feeds := debugFeeds(t, p); !strings.Contains(feeds, fmt.Sprintf(`"subscribers": %d`, clients)) {
						t.Errorf("%s: /debug/feeds lists no feed with %d subscribers: %s", m, clients, feeds)
					}
					if m == bench.FanReviewed {
						if got := p.Metric("watchsan_shared_feed_access_reviews_total", map[string]string{"result": "allowed"}); got != clients {
							t.Errorf("%s: %v reviews allowed, want one per client's token (%d)", m, got, clients)
						}
					}
				}
			}
			s := e.Measure(ctx, target, clients, writes, 2*time.Minute)
			res.AddRun(s)
			t.Logf("run %d, %s: %d clients: the apiserver holds %v more WATCH requests of configmaps; %d apiserver ticks from the first write until every client had all %d (after %v; opening took %v); watchsan CPU %.2fs, RSS %d -> %d KiB",
				rep+1, m, clients, s.UpstreamWatches, s.APIServerTicks, writes, s.Delivered.Round(time.Millisecond), s.Opened.Round(time.Millisecond),
				s.WatchsanCPU, s.WatchsanRSSBeforeKiB, s.WatchsanRSSKiB)
			if s.Err != "" {
				t.Errorf("%s: %s", m, s.Err)
			}
			switch m {
			case bench.FanDirect, bench.FanOwn:
				if s.UpstreamWatches < clients {
					t.Errorf("%s: the apiserver holds %v WATCH requests of configmaps for %d client watches, want one each", m, s.UpstreamWatches, clients)
				}
			default:
				if s.UpstreamWatches > maxShared {
					t.Errorf("%s: the apiserver holds %v WATCH requests of configmaps for %d identical client watches, want at most %d", m, s.UpstreamWatches, clients, maxShared)
				}
			}
		}
	}
	b, err := e.Baseline(ctx, writes)
	if err != nil {
		t.Fatal(err)
	}
	res.Baselines = append(res.Baselines, b)
	res.SetBaseline()
	direct := res.FanOutTicks(res.Of(bench.FanDirect))
	t.Logf("the same %d writes with no watcher: %v ticks (median of %v)", writes, res.BaselineTicks, res.Baselines)
	for _, m := range bench.FanOutModes {
		s := res.Of(m)
		f := res.FanOutTicks(s)
		t.Logf("%-24s median of %v: upstream watches %4.0f, apiserver CPU for the fan-out %4d ticks (%d over the writes), %.2fx direct; watchsan %.2f ms CPU and %.1f KiB per subscriber",
			m, res.RunTicks(m), s.UpstreamWatches, f, s.APIServerTicks, float64(f)/float64(max(direct, 1)), s.WatchsanCPUPerSubscriberMs(), s.WatchsanKiBPerSubscriber())
	}
	if direct <= 0 {
		t.Fatalf("direct: the apiserver's CPU for the fan-out is %d ticks: the baseline (%v) swallowed it", direct, res.Baselines)
	}
	// The 0.25x target is for watchsan as it runs in production. Built with -race (the
	// e2e default) its slower delivery stretches the window the apiserver's CPU is counted
	// over: measured here, the medians of three runs were 0.16x to 0.27x with -race and 0.17x
	// without, in the same hour on the same machine (direct 83 to 92 ticks). So with -race the
	// test only checks that the fan-out is a fraction of direct's, which a feed that stopped
	// sharing (own tokens: 0.88x to 1.77x) could not pass; WATCHSAN_E2E_RACE=0 checks 0.25x.
	limit := maxRatio
	if os.Getenv("WATCHSAN_E2E_RACE") != "0" {
		limit = maxRatioRace
	}
	for _, m := range []bench.FanOutMode{bench.FanReviewed, bench.FanLent} {
		if f := res.FanOutTicks(res.Of(m)); float64(f) > limit*float64(direct) {
			t.Errorf("%s: the apiserver's CPU for the fan-out is %d ticks, %.2fx direct's %d, want at most %.2fx", m, f, float64(f)/float64(direct), direct, limit)
		}
	}
}

// debugFeeds returns watchsan's /debug/feeds.
func debugFeeds(t *testing.T, p *proxy) string {
	t.Helper()
	resp, err := http.Get(p.AdminURL + "/debug/feeds")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/debug/feeds: %s %v", resp.Status, err)
	}
	return string(b)
}
