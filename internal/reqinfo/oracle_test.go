package reqinfo

// The apiserver's RequestInfoFactory is the oracle. k8s.io/apiserver is imported here, in tests
// only: the proxy binary does not link it (go list -deps ./cmd/watchsan | grep apiserver is empty).

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/klog/v2"
)

var factory = &request.RequestInfoFactory{
	APIPrefixes:          sets.NewString("api", "apis"),
	GrouplessAPIPrefixes: sets.NewString("api"),
}

func init() {
	// The factory logs every query that does not decode as ListOptions; the tests make many.
	klog.SetLogger(logr.Discard())
}

// oracle is the factory's answer for r, in Info's terms, with Parse's one deliberate difference
// applied: where the factory calls a request with a method other than GET a watch (HEAD with
// ?watch=1, any method on a /watch/ path), Parse reports the lower-case method, so that the
// request is relayed to the apiserver (which refuses it) instead of being served as a watch.
// Everything else, including what the factory returns alongside an error (a bare /watch or
// /proxy path), must match exactly.
func oracle(t testing.TB, r *http.Request) Info {
	ri, _ := factory.NewRequestInfo(r)
	want := Info{
		IsResourceRequest: ri.IsResourceRequest,
		Verb:              ri.Verb,
		APIGroup:          ri.APIGroup,
		APIVersion:        ri.APIVersion,
		Namespace:         ri.Namespace,
		Resource:          ri.Resource,
		Subresource:       ri.Subresource,
		Name:              ri.Name,
	}
	if want.Verb == "watch" && r.Method != http.MethodGet {
		want.Verb = strings.ToLower(r.Method) // deliberate difference: a watch is a GET
	}
	return want
}

var oracleMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "get", "PROPFIND"}

var oraclePaths = []string{
	// non-resource
	"", "/", "/healthz", "/healthz/etcd", "/livez", "/readyz", "/version", "/metrics",
	"/openapi/v2", "/openapi/v3", "/openapi/v3/apis/apps/v1", "/api", "/api/", "/api/v1",
	"/apis", "/apis/apps", "/apis/apps/v1", "/apis/apps/v1/", "/logs/x", "/.well-known/openid-configuration",
	"/apiz/v1/pods", "/API/v1/pods", "/foo/v1/pods/x",
	// core, cluster-scoped and namespaced
	"/api/v1/pods", "/api/v1/pods/", "/api/v1/nodes", "/api/v1/nodes/n1", "/api/v1/nodes/n1/status",
	"/api/v1/nodes/n1/proxy/metrics", "/api/v1/namespaces", "/api/v1/namespaces/",
	"/api/v1/namespaces/ns", "/api/v1/namespaces/ns/", "/api/v1/namespaces/ns/status",
	"/api/v1/namespaces/ns/finalize", "/api/v1/namespaces/ns/pods", "/api/v1/namespaces/ns/pods/p",
	"/api/v1/namespaces/ns/pods/p/status", "/api/v1/namespaces/ns/pods/p/log",
	"/api/v1/namespaces/ns/pods/p/exec", "/api/v1/namespaces/ns/pods/p/proxy/a/b/c",
	"/api/v1/namespaces/ns/serviceaccounts/sa/token", "/api/v1/namespaces/ns/status/x",
	"/api/v1/namespaces/status", "/api/v1/namespaces/finalize/pods",
	"/api/v1/namespaces/namespaces/namespaces/namespaces",
	// groups
	"/apis/apps/v1/deployments", "/apis/apps/v1/namespaces/ns/deployments",
	"/apis/apps/v1/namespaces/ns/deployments/d", "/apis/apps/v1/namespaces/ns/deployments/d/scale",
	"/apis/example.com/v1alpha1/widgets", "/apis/example.com/v1alpha1/namespaces/ns/widgets/w/status",
	"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l",
	"/apis/apps/v1/namespaces", "/apis/apps/v1/namespaces/ns",
	// legacy verbs in the path
	"/api/v1/watch", "/api/v1/watch/", "/api/v1/watch/pods", "/api/v1/watch/pods/p",
	"/api/v1/watch/namespaces", "/api/v1/watch/namespaces/ns", "/api/v1/watch/namespaces/ns/pods",
	"/api/v1/watch/namespaces/ns/pods/p", "/api/v1/watch/namespaces/ns/pods/p/status",
	"/api/v1/watch/namespaces/ns/status", "/apis/apps/v1/watch", "/apis/apps/v1/watch/deployments",
	"/apis/apps/v1/watch/namespaces/ns/deployments/d", "/api/v1/watch/watch/pods",
	"/api/v1/proxy", "/api/v1/proxy/nodes/n1", "/api/v1/proxy/nodes/n1/a/b",
	"/api/v1/proxy/namespaces/ns/pods/p/a", "/api/v1/proxy/namespaces/ns/services/s:80/x",
	"/api/v1/namespaces/ns/watch/pods", "/api/v1/pods/watch",
	// odd slashes
	"//api/v1/pods", "/api/v1/pods//", "/api//v1/pods", "/api/v1//pods", "/api/v1/namespaces//pods",
	"/api/v1/namespaces/ns//p", "/api/v1/namespaces/ns/pods//status", "///", "/apis//v1/x",
	"/apis/apps//deployments", "/api/v1/watch//pods", "/api/v1/namespaces///",
	// characters that arrive decoded (the factory reads URL.Path, not RawPath)
	"/api/v1/namespaces/n%2Fs/pods", "/api/v1/namespaces/ns/pods/p%20q", "/api/v1/namespaces/ns/pods/%2E%2E",
	"/api/v1/namespaces/ns/pods/%", "/api/v1/w%61tch/pods", "/api/v1/pods/p%3Fwatch=1",
}

var oracleQueries = []string{
	"", "watch=1", "watch=true", "watch=TRUE", "watch=True", "watch=yes", "watch=", "watch",
	"watch=0", "watch=false", "watch=FALSE", "watch=fAlSe", "watch=00", "watch=+", "watch=%30",
	"watch=false&watch=true", "watch=1&watch=0", "w%61tch=1", "Watch=1", "watch=%zz&watch=0",
	"watch=0;&watch=1", "watch=1;x=y", ";watch=1", "&&watch=1&&", "watch=1&resourceVersion=5&allowWatchBookmarks=true",
	"watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
	"watch=1&timeoutSeconds=x", "watch=1&limit=x", "watch=1&labelSelector=a%3D%3D%3D", "watch=1&sendInitialEvents=maybe",
	"fieldSelector=metadata.name%3Dp", "fieldSelector=metadata.name%3D%3Dp", "fieldSelector=metadata.name!%3Dp",
	"watch=1&fieldSelector=metadata.name%3Dp", "watch=true&fieldSelector=metadata.name=p",
	"fieldSelector=metadata.name%3Dp%2Cmetadata.namespace%3Dns", "fieldSelector=spec.nodeName%3Dn%2Cmetadata.name%3Dp",
	"fieldSelector=metadata.name%3Da%2Cmetadata.name%3Db", "fieldSelector=metadata.name%3Dp&fieldSelector=metadata.name%3Dq",
	"fieldSelector=metadata.name%3D..", "fieldSelector=metadata.name%3D.", "fieldSelector=metadata.name%3Da%2Fb",
	"fieldSelector=metadata.name%3Da%25b", "fieldSelector=metadata.name%3D", "fieldSelector=metadata.name%3Da%5C%2Cb",
	"fieldSelector=metadata.name", "fieldSelector=metadata.name%3Dp&limit=x", "fieldSelector=metadata.name%3Dp&timeoutSeconds=1",
	"fieldSelector=metadata.name%3Dp&labelSelector=a%20in%20(x", "fieldSelector=metadata.name%3Dp&labelSelector=app%3Dx",
	"fieldSelector=metadata.name%3Dp&watch=0", "fieldSelector=metadata.name+%3Dp", "f%69eldSelector=metadata.name%3Dp",
	"fieldSelector=metadata.name%3Dp;", "fieldSelector=metadata.name%3D%zz&fieldSelector=metadata.name%3Dq",
	"labelSelector=app%3Dx", "limit=500", "resourceVersion=0", "resourceVersionMatch=NotOlderThan&resourceVersion=5",
}

func oracleRequest(method, path, query string) *http.Request {
	return &http.Request{Method: method, URL: &url.URL{Path: path, RawQuery: query}}
}

// TestParseMatchesRequestInfoFactory compares Parse with the factory on every method x path x
// query of the tables above. Paths are given as they arrive on the wire: percent escapes are
// decoded into URL.Path, as net/http does.
func TestParseMatchesRequestInfoFactory(t *testing.T) {
	n := 0
	for _, p := range oraclePaths {
		path := p
		if u, err := url.Parse(p); err == nil {
			path = u.Path
		}
		for _, q := range oracleQueries {
			for _, m := range oracleMethods {
				r := oracleRequest(m, path, q)
				want := oracle(t, r)
				if got := Parse(r); got != want {
					t.Errorf("%s %q ? %q:\n got %+v\nwant %+v", m, path, q, got, want)
				}
				n++
			}
		}
	}
	t.Logf("%d requests agree with the factory", n)
}

// FuzzParseMatchesRequestInfoFactory compares Parse with the factory on arbitrary method, path
// (as net/http leaves it in URL.Path: decoded) and raw query. The seeds are the tables above
// plus testdata/fuzz/FuzzParseMatchesRequestInfoFactory.
func FuzzParseMatchesRequestInfoFactory(f *testing.F) {
	for i, p := range oraclePaths {
		for j, q := range oracleQueries {
			if (i+j)%7 != 0 { // a sample is enough to seed; the table test runs them all
				continue
			}
			f.Add(oracleMethods[(i+j)%len(oracleMethods)], p, q)
		}
	}
	f.Fuzz(func(t *testing.T, method, path, query string) {
		r := oracleRequest(method, path, query)
		want := oracle(t, r)
		if got := Parse(r); got != want {
			t.Errorf("%q %q ? %q:\n got %+v\nwant %+v", method, path, query, got, want)
		}
	})
}
