package e2e

import (
	"testing"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
)

// The scenario's count on made-up audit events: who sent a request (by user agent) and
// whether it was a list, a watch-list (an informer's sync) or a watch (a re-watch).
func TestScenarioAuditKinds(t *testing.T) {
	for _, tc := range []struct {
		ua, verb, uri      string
		wantClient, wantKi string
	}{
		{"kube-controller-manager/v1.37.2 (linux/amd64) kubernetes/abc/shared-informers", "watch",
			"/api/v1/pods?allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&sendInitialEvents=true&watch=true", clientKCM, reqWatchList},
		{"kube-controller-manager/v1.37.2 (linux/amd64) kubernetes/abc/system:serviceaccount:kube-system:replicaset-controller", "watch",
			"/apis/apps/v1/replicasets?allowWatchBookmarks=true&resourceVersion=412&watch=true", clientKCM, reqWatch},
		{"kube-scheduler/v1.37.2 (linux/amd64) kubernetes/abc/scheduler", "list", "/api/v1/nodes?limit=500&resourceVersion=0", clientScheduler, reqList},
		{"hollow-kubelet", "watch", "/api/v1/pods?fieldSelector=spec.nodeName%3Dhollow-0&sendInitialEvents=false&watch=true", clientKubelets, reqWatch},
		{"hollow-kubelet", "update", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/hollow-0", clientKubelets, ""},
		{"e2e.test/v0.0.0 (linux/amd64) kubernetes/$Format", "list", "/api/v1/namespaces/scenario/pods", "", reqList},
		{"kube-apiserver/v1.37.2 (linux/amd64) kubernetes/abc", "watch", "/api/v1/services?watch=true", "", reqWatch},
	} {
		ev := auditv1.Event{UserAgent: tc.ua, Verb: tc.verb, RequestURI: tc.uri}
		if c, k := auditClient(ev), auditKind(ev); c != tc.wantClient || k != tc.wantKi {
			t.Errorf("%s %s from %q: client %q kind %q, want %q %q", tc.verb, tc.uri, tc.ua, c, k, tc.wantClient, tc.wantKi)
		}
	}
}
