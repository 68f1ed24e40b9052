package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	wtestutil "github.com/watchsan/watchsan/internal/testutil"
)

// TestAttackMetricsCardinality: methods a client makes up do not grow /metrics (20000 random
// 200-character methods made it 71 MB: the verb label was the method as sent).
func TestAttackMetricsCardinality(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "{}") }))
	defer up.Close()
	s, _ := newTestServer(t, up.URL)
	front := httptest.NewServer(s.Handler())
	defer front.Close()
	for i := 0; i < 300; i++ {
		b := make([]byte, 100)
		_, _ = rand.Read(b)
		method := strings.ToUpper(hex.EncodeToString(b))
		for _, path := range []string{"/version", "/api/v1/namespaces/default/configmaps"} {
			req, _ := http.NewRequest(method, front.URL+path, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
	}
	if n := testutil.CollectAndCount(s.Metrics().Requests); n > 4 {
		t.Fatalf("600 requests with made-up methods made %d request series, want a few", n)
	}
	// A request is counted after its response is written: wait for the last one.
	wtestutil.Eventually(t, 5*time.Second, `requests{verb="other",resource=""} to reach 300`, func() bool {
		return testutil.ToFloat64(s.Metrics().Requests.WithLabelValues("other", "", "200")) == 300
	})
	if n := testutil.CollectAndCount(s.Metrics().RequestSeconds); n > 4 {
		t.Fatalf("%d duration series", n)
	}
}

// TestAttackCancelledCountedAsTheirOwn: requests the client cancelled before
// any answer were counted as code 200 (19,456 in a rapid-reset run, 8,126 of which had reached
// the upstream). They are counted, and logged, as 499.
func TestAttackCancelledCountedAsTheirOwn(t *testing.T) {
	arrived := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done() // never answers
	}))
	defer up.Close()
	s, logs := newTestServer(t, up.URL)
	front := httptest.NewServer(s.Handler())
	defer front.Close()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front.URL+"/api/v1/namespaces/d/configmaps/a", nil)
	go func() { <-arrived; cancel() }()
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("the cancelled request got an answer")
	}
	wtestutil.Eventually(t, 5*time.Second, "the cancelled request counted", func() bool {
		return testutil.ToFloat64(s.Metrics().Requests.WithLabelValues("get", "configmaps", "499")) == 1
	})
	if n := testutil.ToFloat64(s.Metrics().Requests.WithLabelValues("get", "configmaps", "200")); n != 0 {
		t.Fatalf("the cancelled request counted as 200 (%v)", n)
	}
	// The metric and the access-log line are written one after the other, after the handler
	// returns: wait for the line too.
	wtestutil.Eventually(t, 5*time.Second, "the cancelled request logged", func() bool {
		return logs.FilterMessage("request").Len() > 0
	})
	if l := logs.FilterMessage("request").All(); len(l) != 1 || l[0].ContextMap()["code"] != int64(499) {
		t.Fatalf("access log: %+v", l)
	}
}

// TestAttackResourceLabelsJunk: the resource label took the first 500
// distinct resources requested, so junk sent after a restart pushed real resources into
// "other". Junk (answered 404) takes only the 100 places of resources never served; a
// resource the upstream served keeps a label of its own.
func TestAttackResourceLabelsJunk(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/junk") {
			http.NotFound(w, r) // as the apiserver answers a resource it does not have
			return
		}
		_, _ = io.WriteString(w, "{}")
	}))
	defer up.Close()
	s, _ := newTestServer(t, up.URL)
	front := httptest.NewServer(s.Handler())
	defer front.Close()
	get := func(path string) {
		resp, err := http.Get(front.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for i := 0; i < 600; i++ {
		get(fmt.Sprintf("/api/v1/namespaces/d/junk%d", i))
	}
	get("/api/v1/namespaces/d/configmaps")
	get("/apis/apps/v1/namespaces/d/deployments")
	wtestutil.Eventually(t, 5*time.Second, "the real resources counted under their names", func() bool {
		m := s.Metrics().Requests
		return testutil.ToFloat64(m.WithLabelValues("list", "configmaps", "200")) == 1 && testutil.ToFloat64(m.WithLabelValues("list", "apps/deployments", "200")) == 1
	})
	if n := testutil.ToFloat64(s.Metrics().Requests.WithLabelValues("list", "other", "404")); n != 500 {
		t.Fatalf("junk counted %v times under other, want 500 (600 less the first 100)", n)
	}
	if n := testutil.CollectAndCount(s.Metrics().Requests); n > 103 {
		t.Fatalf("%d request series after 600 junk resources, want at most 103", n)
	}
}
