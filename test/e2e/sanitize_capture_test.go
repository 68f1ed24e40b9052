package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/test/cluster"
)

// captureEnv is the environment variable that makes TestSanitizeCaptureStreams (re)write the
// captured streams; without it the test is skipped, so ordinary runs never touch testdata.
const captureEnv = "WATCHSAN_CAPTURE"

// TestSanitizeCaptureStreams records watch response bodies from the real apiserver, as a
// client receives them, in JSON, protobuf and CBOR, into internal/stream/testdata/captured/
// <name>.<json|pb|cbor>, where internal/stream's oracle tests hold every reader and the
// rewriter to apimachinery's decoders on them. Run with WATCHSAN_CAPTURE=1, then
// `go test ./internal/stream -run Oracle`.
//
// The streams (each in all three formats, all open at once over the same writes):
//   - configmaps-watchlist: sendInitialEvents=true: initial ADDED events, the
//     initial-events-end BOOKMARK, then ADDED, MODIFIED and DELETED, ended by timeoutSeconds;
//   - deployments-rv0: apps/v1 (large nested objects) watched from RV "0" with bookmarks;
//   - clusterroles: a cluster-scoped resource (no namespace), from RV "";
//   - errors/error-410: a watch from a compacted resourceVersion, answered with nothing but an
//     ERROR event carrying a 410 Status. It sits in a subdirectory because the oracle's
//     rewrite test wants at least one event with a resourceVersion per stream, and an ERROR's
//     Status has none in JSON and CBOR; the stream package may pick it up from there.
func TestSanitizeCaptureStreams(t *testing.T) {
	if os.Getenv(captureEnv) != "1" {
		t.Skipf("set %s=1 to capture watch streams into internal/stream/testdata/captured", captureEnv)
	}
	// Secrets bypass the watch cache (size 0), so a watch of them from a compacted revision
	// reaches etcd and fails; the cache, initialized at a revision this low on a fresh etcd,
	// would still serve it.
	e := newSanEnv(t, cluster.Options{FeatureGates: "CBORServingAndStorage=true", APIServerFlags: []string{"--watch-cache-sizes=secrets#0"}})
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	outDir := filepath.Join(root, "internal", "stream", "testdata", "captured")
	ctx := ctxT(t, 2*time.Minute)
	ns := e.namespace(t)
	const label = "watchsan-capture"

	// The initial state.
	e.createCM(t, ctx, ns, "pre-0")
	e.createCM(t, ctx, ns, "pre-1")
	deps := e.admin.AppsV1().Deployments(ns)
	if _, err := deps.Create(ctx, captureDeployment("web"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crs := e.admin.RbacV1().ClusterRoles()
	cr := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "watchsan-capture-" + ns, Labels: map[string]string{label: "yes"}},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}}},
	}
	if _, err := crs.Create(ctx, cr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	const timeout = "timeoutSeconds=4"
	streams := []struct{ name, path string }{
		{"configmaps-watchlist", "/api/v1/namespaces/" + ns + "/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&" + timeout},
		{"deployments-rv0", "/apis/apps/v1/namespaces/" + ns + "/deployments?watch=1&resourceVersion=0&allowWatchBookmarks=true&" + timeout},
		{"clusterroles", "/apis/rbac.authorization.k8s.io/v1/clusterroles?watch=1&labelSelector=" + label + "%3Dyes&allowWatchBookmarks=true&" + timeout},
	}

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.c.CAData)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	open := func(name, path string, want []string) []*capture {
		var caps []*capture
		for _, f := range captureFormats {
			caps = append(caps, e.openCapture(t, ctx, tr, name+f.ext, path, f.f, f.accept, want))
		}
		return caps
	}

	var caps []*capture
	for _, s := range streams {
		caps = append(caps, open(s.name, s.path, []string{stream.Added, stream.Bookmark, stream.Modified, stream.Deleted})...)
	}
	for _, c := range caps {
		eventually(t, 20*time.Second, c.file+": the initial-events-end bookmark", func() bool {
			ws := c.wire.watchList()
			return len(ws) == 1 && ws[0].sawInitialEventsEnd()
		})
	}

	// The writes every live stream reports.
	cms := e.admin.CoreV1().ConfigMaps(ns)
	e.createCM(t, ctx, ns, "new")
	if _, err := cms.Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pre-0"}, Data: map[string]string{"k": "changed"}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cms.Delete(ctx, "pre-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := deps.Create(ctx, captureDeployment("api"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := deps.Patch(ctx, "web", "application/merge-patch+json", []byte(`{"spec":{"replicas":3}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := deps.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := crs.Patch(ctx, cr.Name, "application/merge-patch+json", []byte(`{"metadata":{"annotations":{"changed":"yes"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := crs.Delete(ctx, cr.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// The server ends every stream at its timeoutSeconds, cleanly, at an event boundary.
	for _, c := range caps {
		c.wait(t)
	}

	// An ERROR event: compact etcd at the current revision, then watch secrets (served by
	// etcd, see above) from revision 1, which is gone; the apiserver answers 200 with an
	// ERROR event carrying a 410 Status.
	list, err := cms.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.compactEtcd(t, list.ResourceVersion)
	errCaps := open("errors/error-410", "/api/v1/namespaces/"+ns+"/secrets?watch=1&resourceVersion=1&"+timeout, []string{stream.Error})
	for _, c := range errCaps {
		c.wait(t)
	}

	if err := os.MkdirAll(filepath.Join(outDir, "errors"), 0o755); err != nil {
		t.Fatal(err)
	}
	all := append(caps, errCaps...)
	for _, c := range all {
		c.check(t)
	}
	for _, c := range all {
		if err := os.WriteFile(filepath.Join(outDir, c.file), c.body.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d bytes, events by type %v", c.file, c.body.Len(), c.types())
	}
}

// captureFormats are the three watch formats, with the file extension the stream package's
// oracle tests expect and the Accept header a client sends.
var captureFormats = []struct {
	f      stream.Format
	ext    string
	accept string
}{
	{stream.JSON, ".json", "application/json"},
	{stream.Protobuf, ".pb", "application/vnd.kubernetes.protobuf"},
	{stream.CBOR, ".cbor", "application/cbor"},
}

// capture is one watch response being recorded: its body as received, and its events as
// package stream reads them (through a wireLog).
type capture struct {
	file string
	want []string // event types the stream must contain
	wire *wireLog
	body bytes.Buffer
	done chan error
}

// openCapture starts a watch straight at the apiserver, with the admin token, asking for
// format through accept, and copies its body until the apiserver ends it.
func (e *sanEnv) openCapture(t *testing.T, ctx context.Context, tr http.RoundTripper, file, path string, format stream.Format, accept string, want []string) *capture {
	t.Helper()
	c := &capture{file: file, want: want, wire: &wireLog{}, done: make(chan error, 1)}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.c.APIServers[0].URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.c.AdminToken)
	req.Header.Set("Accept", accept)
	req.Header.Set("Accept-Encoding", "identity") // the body exactly as a client reads it
	resp, err := (&http.Client{Transport: c.wire.wrap(tr)}).Do(req)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		t.Fatalf("%s: %s: %s", file, resp.Status, b)
	}
	if got, _ := stream.FormatOf(resp.Header.Get("Content-Type")); got != format {
		resp.Body.Close()
		t.Fatalf("%s: answered with Content-Type %q, want %s", file, resp.Header.Get("Content-Type"), format)
	}
	go func() {
		defer resp.Body.Close()
		_, err := io.Copy(&c.body, resp.Body)
		c.done <- err
	}()
	return c
}

// wait waits for the apiserver to end the watch (timeoutSeconds, or after an ERROR).
func (c *capture) wait(t *testing.T) {
	t.Helper()
	select {
	case err := <-c.done:
		if err != nil {
			t.Fatalf("%s: reading the watch: %v", c.file, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: the apiserver did not end the watch", c.file)
	}
	if !c.wire.waitParsers(10 * time.Second) {
		t.Fatalf("%s: parser did not finish", c.file)
	}
}

func (c *capture) types() map[string]int {
	types := map[string]int{}
	for _, w := range c.wire.watchList() {
		for _, ev := range w.events {
			types[ev.typ]++
		}
	}
	return types
}

// check fails the test unless the stream read cleanly and holds every wanted event type.
func (c *capture) check(t *testing.T) {
	t.Helper()
	ws := c.wire.watchList()
	if len(ws) != 1 || ws[0].err != nil {
		t.Fatalf("%s: %v", c.file, ws)
	}
	types := c.types()
	for _, typ := range c.want {
		if types[typ] == 0 {
			t.Fatalf("%s: no %s event in the stream (events by type: %v)", c.file, typ, types)
		}
	}
}

// compactEtcd compacts etcd's history up to revision rv through etcd's HTTP gateway, so that
// a watch from an older revision gets "too old resource version".
func (e *sanEnv) compactEtcd(t *testing.T, rv string) {
	t.Helper()
	compactEtcd(t, e.c, rv)
}

// compactEtcd compacts c's etcd up to revision rv (physically: the call returns once the old
// revisions are gone).
func compactEtcd(t testing.TB, c *cluster.Cluster, rv string) {
	t.Helper()
	body := fmt.Sprintf(`{"revision":%q,"physical":true}`, rv)
	resp, err := http.Post(c.EtcdURL+"/v3/kv/compaction", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("compacting etcd: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("compacting etcd at %s: %s: %s", rv, resp.Status, b)
	}
}

func captureDeployment(name string) *appsv1.Deployment {
	replicas := int32(1)
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: map[string]string{"note": strings.Repeat("x", 64)}},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name:  "main",
					Image: "registry.k8s.io/pause:3.10",
					Args:  []string{"--flag=" + fmt.Sprint(len(name))},
					Env:   []corev1.EnvVar{{Name: "NAME", Value: name}},
					Ports: []corev1.ContainerPort{{ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
				}}},
			},
		},
	}
}
