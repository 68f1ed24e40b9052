package coalesce

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/upstream"
)

func classify(t testing.TB, method, target string, h http.Header, lend bool) (Key, string, bool) {
	r := httptest.NewRequest(method, target, nil)
	for k, v := range h {
		r.Header[k] = v
	}
	info := reqinfo.Parse(r)
	return Classify(r, &info, upstream.Decide(r.Header, (*tls.ConnectionState)(nil), lend, upstream.IdentityOff))
}

func tok(t string) http.Header { return http.Header{"Authorization": {"Bearer " + t}} }

// What may coalesce: lists at "" or 0 and continue pages, discovery and OpenAPI documents, of
// a principal; nothing else.
func TestClassify(t *testing.T) {
	for _, c := range []struct {
		method, target string
		h              http.Header
		lend           bool
		kind           string // "": not coalesced
	}{
		{"GET", "/api/v1/namespaces/a/configmaps", tok("x"), false, KindList},
		{"GET", "/api/v1/namespaces/a/configmaps?limit=500", tok("x"), false, KindList},
		{"GET", "/api/v1/configmaps?resourceVersion=0", tok("x"), false, KindList},
		{"GET", "/api/v1/configmaps?resourceVersion=0&resourceVersionMatch=NotOlderThan", tok("x"), false, KindList},
		{"GET", "/api/v1/configmaps?limit=500&continue=abc", tok("x"), false, KindList},
		{"GET", "/apis/apps/v1/deployments?labelSelector=a%3Db", nil, true, KindList},
		{"GET", "/api", tok("x"), false, KindDiscovery},
		{"GET", "/apis", tok("x"), false, KindDiscovery},
		{"GET", "/apis/apps/v1", tok("x"), false, KindDiscovery},
		{"GET", "/api/v1", tok("x"), false, KindDiscovery},
		{"GET", "/openapi/v2", tok("x"), false, KindOpenAPI},
		{"GET", "/openapi/v3/apis/apps/v1?hash=abc", tok("x"), false, KindOpenAPI},
		// not coalesced
		{"GET", "/api/v1/configmaps", nil, false, ""},                        // anonymous
		{"GET", "/api/v1/configmaps?resourceVersion=5", tok("x"), false, ""}, // an exact or older state
		{"GET", "/api/v1/configmaps?resourceVersion=5&resourceVersionMatch=NotOlderThan", tok("x"), false, ""},
		{"GET", "/api/v1/configmaps?resourceVersion=0&continue=abc", tok("x"), false, ""},
		{"GET", "/api/v1/configmaps?watch=1", tok("x"), false, ""},     // a watch
		{"GET", "/api/v1/configmaps?watch=false", tok("x"), false, ""}, // unrecognised parameter
		{"GET", "/api/v1/configmaps?sendInitialEvents=true", tok("x"), false, ""},
		{"GET", "/api/v1/configmaps?limit=1&limit=2", tok("x"), false, ""},
		{"GET", "/api/v1/namespaces/a/configmaps/b", tok("x"), false, ""}, // a single object
		{"GET", "/api/v1/namespaces/a/pods/b/log", tok("x"), false, ""},
		{"POST", "/api/v1/namespaces/a/configmaps", tok("x"), false, ""}, // a write
		{"DELETE", "/api/v1/namespaces/a/configmaps", tok("x"), false, ""},
		{"GET", "/api/v1/configmaps", http.Header{"Authorization": {"Bearer x"}, "X-Custom": {"1"}}, false, ""}, // unrecognised header
		{"GET", "/version", tok("x"), false, ""},
		{"GET", "/apis/a/b/namespaces/n/c/d/status", tok("x"), false, ""}, // a subresource
		{"GET", "/openapi/v2?hash=1", tok("x"), false, ""},
		{"GET", "/api?x=1", tok("x"), false, ""},
		{"GET", "/healthz", tok("x"), false, ""},
	} {
		_, kind, ok := classify(t, c.method, c.target, c.h, c.lend)
		if kind != c.kind || ok != (c.kind != "") {
			t.Errorf("%s %s %v: kind %q ok %v, want %q", c.method, c.target, c.h, kind, ok, c.kind)
		}
	}
}

// The key separates principals (tokens, impersonations) and whatever shapes the answer, and
// ignores what does not (the user agent, the request id, the order of the query).
func TestClassifyKey(t *testing.T) {
	key := func(target string, h http.Header) Key {
		k, _, ok := classify(t, "GET", target, h, true)
		if !ok {
			t.Fatalf("%s %v not coalescable", target, h)
		}
		return k
	}
	base := key("/api/v1/configmaps?limit=5&labelSelector=a", tok("x"))
	same := []http.Header{
		{"Authorization": {"Bearer x"}, "User-Agent": {"other"}, "X-Request-Id": {"r1"}, "Kubectl-Command": {"kubectl get"}},
	}
	for _, h := range same {
		if key("/api/v1/configmaps?labelSelector=a&limit=5", h) != base {
			t.Errorf("%v: another key", h)
		}
	}
	differ := map[string]Key{
		"another token":              key("/api/v1/configmaps?limit=5&labelSelector=a", tok("y")),
		"an impersonation":           key("/api/v1/configmaps?limit=5&labelSelector=a", http.Header{"Authorization": {"Bearer x"}, "Impersonate-User": {"u"}}),
		"another impersonation":      key("/api/v1/configmaps?limit=5&labelSelector=a", http.Header{"Authorization": {"Bearer x"}, "Impersonate-User": {"v"}}),
		"another impersonated uid":   key("/api/v1/configmaps?limit=5&labelSelector=a", http.Header{"Authorization": {"Bearer x"}, "Impersonate-User": {"v"}, "Impersonate-Uid": {"1"}}),
		"another impersonated extra": key("/api/v1/configmaps?limit=5&labelSelector=a", http.Header{"Authorization": {"Bearer x"}, "Impersonate-User": {"v"}, "Impersonate-Extra-Scopes": {"s"}}),
		"a front-proxy user":         key("/api/v1/configmaps?limit=5&labelSelector=a", http.Header{"Authorization": {"Bearer x"}, "X-Remote-User": {"u"}}),
		"the lent identity":          key("/api/v1/configmaps?limit=5&labelSelector=a", nil),
		"lent, impersonating":        key("/api/v1/configmaps?limit=5&labelSelector=a", http.Header{"Impersonate-User": {"u"}}),
		"another Accept":             key("/api/v1/configmaps?limit=5&labelSelector=a", http.Header{"Authorization": {"Bearer x"}, "Accept": {"application/vnd.kubernetes.protobuf"}}),
		"another selector":           key("/api/v1/configmaps?limit=5&labelSelector=b", tok("x")),
		"another limit":              key("/api/v1/configmaps?limit=6&labelSelector=a", tok("x")),
		"another path":               key("/api/v1/namespaces/a/configmaps?limit=5&labelSelector=a", tok("x")),
	}
	seen := map[Key]string{base: "base"}
	for what, k := range differ {
		if prev, dup := seen[k]; dup {
			t.Errorf("%s has the key of %s", what, prev)
		}
		seen[k] = what
	}
}

// FuzzClassify: any method, path, query and header never panics, and what is coalesced is a
// GET with credentials whose kind matches its path.
func FuzzClassify(f *testing.F) {
	f.Add("GET", "/api/v1/configmaps", "limit=500", "Bearer x", "X-A")
	f.Add("GET", "/openapi/v3/apis/apps/v1", "hash=1", "Bearer x", "")
	f.Add("GET", "/apis", "", "", "Impersonate-User")
	f.Fuzz(func(t *testing.T, method, path, query, auth, header string) {
		r, err := http.NewRequest(method, "http://x/", nil)
		if err != nil {
			return
		}
		r.URL.Path, r.URL.RawQuery = path, query
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		if header != "" {
			r.Header[header] = []string{"v"}
		}
		info := reqinfo.Parse(r)
		cred := upstream.Decide(r.Header, nil, false, upstream.IdentityOff)
		_, kind, ok := Classify(r, &info, cred)
		if !ok {
			return
		}
		if r.Method != http.MethodGet || cred.Anonymous() { // NewRequest makes "" a GET
			t.Fatalf("%s %s?%s coalesced (%s) without being a GET with credentials", method, path, query, kind)
		}
		if (kind == KindList) != info.IsResourceRequest || (kind == KindOpenAPI) != strings.HasPrefix(strings.TrimLeft(path, "/"), "openapi/") {
			t.Fatalf("%s?%s: kind %s for %+v", path, query, kind, info)
		}
	})
}
