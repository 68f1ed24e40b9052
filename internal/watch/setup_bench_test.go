package watch

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"k8s.io/utils/clock"

	"github.com/watchsan/watchsan/internal/upstream"
)

// BenchmarkWatchSetup is the garbage a watch makes before its first event: the template of
// each upstream attempt (requestFrom; the Attempter clones it again for the backend), and the
// upstream's response headers copied into the client's response (upstream.CopyEndToEnd, in
// subscriber.start), which that response holds for the watch's life.
func BenchmarkWatchSetup(b *testing.B) {
	r := httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=1000&allowWatchBookmarks=true", nil)
	r.RemoteAddr = "10.0.0.1:34567"
	r.Header.Set("Accept", "application/json, */*")
	r.Header.Set("User-Agent", "kube-controller-manager/v1.31.0 (linux/amd64) kubernetes/9a1b2c3/shared-informers")
	r.Header.Set("Authorization", "Bearer a-token-of-about-this-length-0123456789abcdef0123456789abcdef")
	r.Header.Set("Accept-Encoding", "gzip")
	f := &feed{h: &Handler{clk: clock.RealClock{}}, client: r, query: parseParams(r).query, ctx: context.Background()}
	b.Run("request", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = f.requestFrom(true, "")
		}
	})
	// What an apiserver answers a watch with.
	resp := http.Header{
		"Audit-Id":                          {"2d1f6d0e-5c1b-4a7e-9d53-0f6f1b9e8a11"},
		"Cache-Control":                     {"no-cache, private"},
		"Content-Type":                      {"application/json"},
		"Date":                              {"Wed, 02 Dec 2026 06:30:00 GMT"},
		"X-Kubernetes-Pf-Flowschema-Uid":    {"6b4a8d52-1f3e-4d8a-b1c2-8f2e7a9d0c31"},
		"X-Kubernetes-Pf-Prioritylevel-Uid": {"0c5e2a9b-7d41-4f6a-9e3b-2a1d8c7f6e52"},
	}
	b.Run("response-header", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			h := make(http.Header, 8)
			h["X-Request-Id"] = []string{"id"}
			upstream.CopyEndToEnd(h, resp)
		}
	})
}
