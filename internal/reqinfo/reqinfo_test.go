package reqinfo

import (
	"net/http/httptest"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		watch        bool
		want         Info
	}{
		{"GET", "/api/v1/namespaces/ns/pods", false, Info{"list", "pods", "ns", ""}},
		{"GET", "/api/v1/namespaces/ns/pods", true, Info{"watch", "pods", "ns", ""}},
		{"GET", "/api/v1/watch/namespaces/ns/pods/p", true, Info{"watch", "pods", "ns", "p"}},
		{"GET", "/api/v1/namespaces/ns/pods/p/log", false, Info{"get", "pods/log", "ns", "p"}},
		{"POST", "/apis/apps/v1/namespaces/ns/deployments", false, Info{"create", "apps/deployments", "ns", ""}},
		{"PATCH", "/apis/apps/v1/namespaces/ns/deployments/d/scale", false, Info{"patch", "apps/deployments/scale", "ns", "d"}},
		{"DELETE", "/api/v1/namespaces/ns/configmaps", false, Info{"deletecollection", "configmaps", "ns", ""}},
		{"DELETE", "/api/v1/namespaces/ns", false, Info{"delete", "namespaces", "", "ns"}},
		{"PUT", "/api/v1/namespaces/ns/finalize", false, Info{"update", "namespaces/finalize", "", "ns"}},
		{"GET", "/api/v1/nodes", false, Info{"list", "nodes", "", ""}},
		{"GET", "/version", false, Info{"get", "", "", ""}},
		{"GET", "/apis/apps/v1", false, Info{"get", "", "", ""}},
		{"GET", "/openapi/v3", false, Info{"get", "", "", ""}},
	} {
		r := httptest.NewRequest(tc.method, tc.path, nil)
		if got := Parse(r, tc.watch); got != tc.want {
			t.Errorf("%s %s: %+v, want %+v", tc.method, tc.path, got, tc.want)
		}
	}
}
