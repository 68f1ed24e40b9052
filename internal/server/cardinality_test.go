package server

import (
	"crypto/rand"
	"encoding/hex"
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
