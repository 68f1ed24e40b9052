package stream

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestIsWatchRequest(t *testing.T) {
	cases := []struct {
		method, target string
		want           bool
	}{
		{"GET", "/api/v1/pods?watch=1", true},
		{"GET", "/api/v1/pods?watch=true", true},
		{"GET", "/api/v1/pods?watch=True", true},
		{"GET", "/api/v1/pods?watch=", true}, // the apiserver: any value but 0/false
		{"GET", "/api/v1/pods?watch=yes", true},
		{"GET", "/api/v1/pods?watch", true},
		{"GET", "/api/v1/pods?watch=0", false},
		{"GET", "/api/v1/pods?watch=false", false},
		{"GET", "/api/v1/pods?watch=FALSE", false},
		{"GET", "/api/v1/pods?watch=false&watch=true", false}, // the first value counts
		{"GET", "/api/v1/pods", false},
		{"GET", "/api/v1/pods/?watch=1", true},
		{"GET", "/api/v1/namespaces/ns/pods?watch=1&resourceVersion=5&allowWatchBookmarks=true", true},
		{"GET", "/api/v1/namespaces/ns/pods/name?watch=1", false},        // a get
		{"GET", "/api/v1/namespaces/ns/pods/name/status?watch=1", false}, // a subresource
		{"GET", "/api/v1/namespaces?watch=1", true},
		{"GET", "/api/v1/namespaces/ns?watch=1", false},
		{"GET", "/api/v1/namespaces/ns/status?watch=1", false},
		{"GET", "/api/v1/namespaces/ns/finalize?watch=1", false},
		{"GET", "/apis/apps/v1/deployments?watch=1", true},
		{"GET", "/apis/apps/v1/namespaces/ns/deployments?watch=true", true},
		{"GET", "/apis/apps/v1/namespaces/ns/deployments/d?watch=true", false},
		{"GET", "/apis/example.com/v1alpha1/widgets?fieldSelector=metadata.name%3Dx&watch=1", true},
		{"GET", "/api/v1/watch/pods", true},
		{"GET", "/api/v1/watch/namespaces/ns/pods", true},
		{"GET", "/api/v1/watch/namespaces/ns/pods/name", true},
		{"GET", "/apis/apps/v1/watch/deployments", true},
		{"GET", "/apis/apps/v1/watch/namespaces/ns/deployments", true},
		{"GET", "/api/v1/watch", false},
		{"GET", "/apis/apps/v1/watch", false},
		{"GET", "/api/v1/proxy/namespaces/ns/pods/p?watch=1", false},
		{"GET", "/api/v1?watch=1", false},
		{"GET", "/apis/apps/v1?watch=1", false},
		{"GET", "/apis/apps?watch=1", false},
		{"GET", "/healthz?watch=1", false},
		{"GET", "/openapi/v2/x/y?watch=1", false},
		{"GET", "/", false},
		{"POST", "/api/v1/pods?watch=1", false},
		{"HEAD", "/api/v1/pods?watch=1", false},
		{"DELETE", "/api/v1/watch/pods", false},
	}
	for _, c := range cases {
		r := httptest.NewRequest(c.method, c.target, nil)
		if got := IsWatchRequest(r); got != c.want {
			t.Errorf("%s %s: got %v, want %v", c.method, c.target, got, c.want)
		}
	}
	if IsWatchRequest(&http.Request{Method: "GET"}) {
		t.Error("a request without a URL is a watch")
	}
}
