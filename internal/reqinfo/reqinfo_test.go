package reqinfo

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestParse spells out the answers that matter most; oracle_test.go checks these and many more
// against the apiserver's own RequestInfoFactory.
func TestParse(t *testing.T) {
	type I = Info
	for _, tc := range []struct {
		method, target string
		want           Info
	}{
		{"GET", "/api/v1/namespaces/ns/pods", I{true, "list", "", "v1", "ns", "pods", "", ""}},
		{"GET", "/api/v1/namespaces/ns/pods?watch=1", I{true, "watch", "", "v1", "ns", "pods", "", ""}},
		{"GET", "/api/v1/watch/namespaces/ns/pods/p", I{true, "watch", "", "v1", "ns", "pods", "", "p"}},
		{"GET", "/api/v1/namespaces/ns/pods/p/log", I{true, "get", "", "v1", "ns", "pods", "log", "p"}},
		{"POST", "/apis/apps/v1/namespaces/ns/deployments", I{true, "create", "apps", "v1", "ns", "deployments", "", ""}},
		{"PATCH", "/apis/apps/v1/namespaces/ns/deployments/d/scale", I{true, "patch", "apps", "v1", "ns", "deployments", "scale", "d"}},
		{"DELETE", "/api/v1/namespaces/ns/configmaps", I{true, "deletecollection", "", "v1", "ns", "configmaps", "", ""}},
		{"GET", "/api/v1/nodes", I{true, "list", "", "v1", "", "nodes", "", ""}},
		{"GET", "/api/v1/proxy/namespaces/ns/pods/p/x/y", I{true, "proxy", "", "v1", "ns", "pods", "", "p"}},

		// Changed from the parser this one replaced, as the factory decides:
		// a namespace is an object in namespace "itself",
		{"GET", "/api/v1/namespaces/ns", I{true, "get", "", "v1", "ns", "namespaces", "", "ns"}},
		{"DELETE", "/api/v1/namespaces/ns", I{true, "delete", "", "v1", "ns", "namespaces", "", "ns"}},
		// status and finalize are its subresources,
		{"PUT", "/api/v1/namespaces/ns/finalize", I{true, "update", "", "v1", "ns", "namespaces", "finalize", "ns"}},
		{"GET", "/api/v1/namespaces/ns/status", I{true, "get", "", "v1", "ns", "namespaces", "status", "ns"}},
		// a list or watch by fieldSelector=metadata.name=X names X,
		{"GET", "/api/v1/namespaces/ns/pods?watch=1&fieldSelector=metadata.name%3Dp", I{true, "watch", "", "v1", "ns", "pods", "", "p"}},
		{"GET", "/api/v1/nodes?fieldSelector=metadata.name%3Dn1%2Cspec.unschedulable%3Dfalse", I{true, "list", "", "v1", "", "nodes", "", "n1"}},
		// unless the query does not decode as ListOptions, or the name is no path segment,
		{"GET", "/api/v1/nodes?fieldSelector=metadata.name%3Dn1&limit=x", I{true, "list", "", "v1", "", "nodes", "", ""}},
		{"GET", "/api/v1/nodes?fieldSelector=metadata.name%3Dn1&labelSelector=a%3D%3D%3D", I{true, "list", "", "v1", "", "nodes", "", ""}},
		{"GET", "/api/v1/nodes?fieldSelector=metadata.name%3D..", I{true, "list", "", "v1", "", "nodes", "", ""}},
		{"GET", "/api/v1/nodes?fieldSelector=metadata.name!%3Dn1", I{true, "list", "", "v1", "", "nodes", "", ""}},
		// a single-object watch on the legacy path keeps its subresource.
		{"GET", "/api/v1/watch/namespaces/ns/pods/p/status", I{true, "watch", "", "v1", "ns", "pods", "status", "p"}},

		// Non-resource requests: the lower-case method.
		{"GET", "/version", I{Verb: "get"}},
		{"GET", "/apis/apps/v1", I{Verb: "get"}},
		{"GET", "/openapi/v3/apis/apps/v1", I{Verb: "get"}},
		{"POST", "/healthz", I{Verb: "post"}},
		// The factory fails on a bare /watch or /proxy; Parse returns what it knows by then.
		{"GET", "/apis/apps/v1/watch", I{true, "get", "apps", "v1", "", "", "", ""}},

		// Where Parse differs from the factory on purpose: a watch is a GET.
		{"HEAD", "/api/v1/pods?watch=1", I{true, "head", "", "v1", "", "pods", "", ""}},
		{"POST", "/api/v1/watch/pods", I{true, "post", "", "v1", "", "pods", "", ""}},
		{"DELETE", "/api/v1/watch/namespaces/ns/pods/p", I{true, "delete", "", "v1", "ns", "pods", "", "p"}},
	} {
		r := httptest.NewRequest(tc.method, tc.target, nil)
		if got := Parse(r); got != tc.want {
			t.Errorf("%s %s:\n got %+v\nwant %+v", tc.method, tc.target, got, tc.want)
		}
	}
}

// TestIsWatch is the routing decision: which requests the watch pipeline serves. (These cases
// tested stream.IsWatchRequest, which Parse replaced.)
func TestIsWatch(t *testing.T) {
	cases := []struct {
		method, target string
		want           bool
	}{
		{"GET", "/api/v1/pods?watch=1", true},
		{"GET", "/api/v1/pods?watch=true", true},
		{"GET", "/api/v1/pods?watch=True", true},
		{"GET", "/api/v1/pods?watch=TRUE", true},
		{"GET", "/api/v1/pods?watch=", true}, // the apiserver: any value but 0/false
		{"GET", "/api/v1/pods?watch=yes", true},
		{"GET", "/api/v1/pods?watch", true},
		{"GET", "/api/v1/pods?watch=+", true}, // a space
		{"GET", "/api/v1/pods?watch=0", false},
		{"GET", "/api/v1/pods?watch=false", false},
		{"GET", "/api/v1/pods?watch=FALSE", false},
		{"GET", "/api/v1/pods?watch=fal%73e", false},
		{"GET", "/api/v1/pods?w%61tch=1", true},
		{"GET", "/api/v1/pods?watch=false&watch=true", false}, // the first value counts
		{"GET", "/api/v1/pods?watch=%zz&watch=0", false},      // a bad escape drops its pair
		{"GET", "/api/v1/pods?watch=0;&watch=1", true},        // and so does a semicolon
		{"GET", "/api/v1/pods", false},
		{"GET", "/api/v1/pods/?watch=1", true},
		{"GET", "/api/v1/namespaces/ns/pods?watch=1&resourceVersion=5&allowWatchBookmarks=true", true},
		{"GET", "/api/v1/namespaces/ns/pods?watch=1&labelSelector=%3D%3D%3D", true}, // a bad selector: still a watch
		{"GET", "/api/v1/namespaces/ns/pods/name?watch=1", false},                   // a get
		{"GET", "/api/v1/namespaces/ns/pods/name/status?watch=1", false},            // a subresource
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
		if got := Parse(r).IsWatch(); got != c.want {
			t.Errorf("%s %s: got %v, want %v", c.method, c.target, got, c.want)
		}
	}
	if Parse(&http.Request{Method: "GET"}).IsWatch() {
		t.Error("a request without a URL is a watch")
	}
}

func TestResourceForms(t *testing.T) {
	for _, tc := range []struct {
		target, group, full string
	}{
		{"/api/v1/namespaces/ns/pods", "pods", "pods"},
		{"/api/v1/namespaces/ns/pods/p/log", "pods", "pods/log"},
		{"/apis/apps/v1/namespaces/ns/deployments", "apps/deployments", "apps/deployments"},
		{"/apis/apps/v1/namespaces/ns/deployments/d/scale", "apps/deployments", "apps/deployments/scale"},
		{"/version", "", ""},
		{"/apis/apps/v1", "", ""},
	} {
		i := Parse(httptest.NewRequest("GET", tc.target, nil))
		if g, f := i.GroupResource(), i.FullResource(); g != tc.group || f != tc.full {
			t.Errorf("%s: GroupResource %q FullResource %q, want %q %q", tc.target, g, f, tc.group, tc.full)
		}
	}
}

// TestManyParams: url.Query drops every parameter of a query with more than 10000; so does Parse.
func TestManyParams(t *testing.T) {
	long := "watch=1" + strings.Repeat("&a=b", 10000)
	if Parse(httptest.NewRequest("GET", "/api/v1/pods?"+long, nil)).IsWatch() {
		t.Error("a watch parameter in a query url.Query rejects counts")
	}
	long = "watch=1" + strings.Repeat("&a=b", 2000)
	if !Parse(httptest.NewRequest("GET", "/api/v1/pods?"+long, nil)).IsWatch() {
		t.Error("a long query's watch parameter is lost")
	}
}

// --fix-exempt-resource takes a resource as kubectl names it and matches
// requests exactly, whatever the spelling.
func TestParseGroupResource(t *testing.T) {
	for in, want := range map[string]string{
		"pods": "pods", "Pods": "pods", " PODS ": "pods", "v1/pods": "pods", "pods.v1": "pods",
		"deployments.apps": "apps/deployments", "apps/deployments": "apps/deployments",
		"Deployments.Apps": "apps/deployments", "deployments.v1.apps": "apps/deployments",
		"certificatesigningrequests.certificates.k8s.io":         "certificates.k8s.io/certificatesigningrequests",
		"certificatesigningrequests.v1beta1.certificates.k8s.io": "certificates.k8s.io/certificatesigningrequests",
		"widgets.example.com":                                    "example.com/widgets",
	} {
		got, err := ParseGroupResource(in)
		if err != nil || got != want {
			t.Errorf("ParseGroupResource(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "apps/v1/deployments", "apps/deployments/scale", "pods!", "v1", "apps/", "deployments.apps..", "a_b"} {
		if got, err := ParseGroupResource(in); err == nil || !strings.Contains(err.Error(), "want") {
			t.Errorf("ParseGroupResource(%q) = %q, %v; want an error with a hint", in, got, err)
		}
	}
	// Every accepted spelling of a resource matches its requests' GroupResource.
	for _, tc := range []struct{ spelling, path string }{
		{"Pods", "/api/v1/namespaces/a/pods?watch=1"},
		{"deployments.apps", "/apis/apps/v1/deployments?watch=1"},
		{"deployments.v1.apps", "/apis/apps/v1/namespaces/a/deployments?watch=1"},
	} {
		gr, _ := ParseGroupResource(tc.spelling)
		r := httptest.NewRequest("GET", tc.path, nil)
		if info := Parse(r); info.GroupResource() != gr {
			t.Errorf("%q: request %s has GroupResource %q, the flag gives %q", tc.spelling, tc.path, info.GroupResource(), gr)
		}
	}
}
