package watch

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
	"k8s.io/client-go/rest"

	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/metrics"
	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/testutil"
	"github.com/watchsan/watchsan/internal/upstream"
)

// A shared feed's policy decides once for all its subscribers: a regressed delete is
// rewritten and a replay dropped in every subscriber's stream, each counted once (not once
// per subscriber), and the feed's end notes the repairs as a private watch's does.
func TestSharedFeedPolicyDecidesOnce(t *testing.T) {
	joined := make(chan struct{})
	up := &upstreamScript{}
	up.steps = []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, r *http.Request) {
		send(w, obj("ADDED", "a", "10"), obj("ADDED", "b", "11"))
		select {
		case <-joined:
		case <-r.Context().Done():
			return
		}
		send(w, obj("DELETED", "a", "10"), obj("MODIFIED", "b", "11"), obj("ADDED", "c", "13")) // the delete regressed, b replayed
		<-r.Context().Done()
	}}
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	u, _ := url.Parse(upSrv.URL)
	log := zaptest.NewLogger(t)
	pool, err := upstream.NewPool([]*url.URL{u}, upstream.PoolOptions{Logger: log,
		Transport: upstream.TransportOptions{Credentials: &rest.Config{BearerToken: "lent"}, Lend: true}})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		notes []string
	)
	m := metrics.New(nil)
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	h, err := New(Config{Share: true, DisableResume: true}, Deps{Attempts: upstream.NewAttempter(pool, upstream.AttempterOptions{}), Metrics: m,
		Memory: fix.NewDeleteMemory(0, 0, nil), Logger: log, Done: done,
		Note: func(kind string, _ *upstream.Backend, path, detail string) {
			mu.Lock()
			notes = append(notes, kind+" "+path+": "+detail)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	waitServed(t, h)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, cred := reqinfo.Parse(r), upstream.Decide(r.Header, r.TLS, true, upstream.IdentityOff)
		h.Serve(w, r, &info, &cred, "")
	}))
	t.Cleanup(srv.Close)

	first := watchAt(t, srv.URL, "resourceVersion=5", nil, true)
	first.waitFor(t, "the first subscriber", 2)
	second := watchAt(t, srv.URL, "resourceVersion=5", nil, true) // joins: the ring covers 5
	testutil.Eventually(t, 10*time.Second, "the second subscriber joined", func() bool { return promtest.ToFloat64(m.SharedJoins) == 1 })
	close(joined)
	want := "ADDED a 10, ADDED b 11, DELETED a 12, ADDED c 13"
	for _, c := range []*client{first, second} {
		if got := strings.Join(c.waitFor(t, "a subscriber", 4), ", "); got != want {
			t.Errorf("a subscriber got [%s], want [%s]", got, want)
		}
	}
	if n := up.attempts(); n != 1 {
		t.Errorf("%d upstream watches, want 1", n)
	}
	for _, c := range []struct {
		typ, action string
		want        float64
	}{{"ADDED", "passed", 3}, {"DELETED", "rewritten", 1}, {"MODIFIED", "dropped", 1}} {
		if v := promtest.ToFloat64(m.WatchEvents.WithLabelValues("configmaps", c.typ, c.action)); v != c.want {
			t.Errorf("events{%s,%s} = %v, want %v: counted once for the feed", c.typ, c.action, v, c.want)
		}
	}
	if v := promtest.ToFloat64(m.WatchRegressed.WithLabelValues("configmaps")); v != 1 {
		t.Errorf("regressed watches %v, want 1", v)
	}
	first.cancel()
	second.cancel()
	testutil.Eventually(t, 10*time.Second, "the feed's end noted its repairs", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(notes) == 1 && notes[0] == "rewrite /api/v1/namespaces/d/configmaps: 5 events, 1 rewritten, 1 dropped (repair)"
	})
}
