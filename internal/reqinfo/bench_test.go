package reqinfo

import (
	"net/http/httptest"
	"testing"
)

var benchRequests = []struct{ name, method, target string }{
	{"watch", "GET", "/apis/apps/v1/namespaces/kube-system/deployments?allowWatchBookmarks=true&resourceVersion=12345&timeoutSeconds=377&watch=true"},
	{"watchlist", "GET", "/api/v1/pods?allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&sendInitialEvents=true&timeoutSeconds=512&watch=true"},
	{"get", "GET", "/api/v1/namespaces/default/configmaps/kube-root-ca.crt"},
	{"list", "GET", "/api/v1/namespaces/default/pods?labelSelector=app%3Dweb&limit=500"},
	{"patch_subresource", "PATCH", "/apis/apps/v1/namespaces/ns/deployments/d/scale"},
	{"nonresource", "GET", "/openapi/v2"},
	// The one path that decodes the query as ListOptions (a kubelet's watch of its node).
	{"watch_by_name", "GET", "/api/v1/nodes?allowWatchBookmarks=true&fieldSelector=metadata.name%3Dnode-1&resourceVersion=5&timeoutSeconds=300&watch=true"},
}

func BenchmarkParse(b *testing.B) {
	for _, c := range benchRequests {
		r := httptest.NewRequest(c.method, c.target, nil)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = Parse(r)
			}
		})
	}
}

var sink string

// BenchmarkFullResource is the label the server derives once per request.
func BenchmarkFullResource(b *testing.B) {
	for _, c := range benchRequests[:5] {
		i := Parse(httptest.NewRequest(c.method, c.target, nil))
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sink = i.FullResource()
			}
		})
	}
}

// BenchmarkOracle is the apiserver's RequestInfoFactory on the same requests, for scale.
func BenchmarkOracle(b *testing.B) {
	for _, c := range benchRequests {
		r := httptest.NewRequest(c.method, c.target, nil)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = factory.NewRequestInfo(r)
			}
		})
	}
}
