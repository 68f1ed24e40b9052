package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/test/cluster"
)

// notesAPI is a small aggregated API server, in the test binary, that answers each user only
// what it owns, as an aggregated API may (metrics, a multi-tenant store: the kube-apiserver
// authorizes the verb, the aggregated server decides what the user sees). Group
// filtered.watchsan.test, version v1, one cluster-scoped resource, notes (kind Note), with list
// and watch in JSON: a watch (?watch=1) streams {"type":...,"object":...} lines of the user's
// own notes, resourceVersions increasing, no bookmarks. A note's owner is spec.owner, a user
// name as the kube-apiserver authenticated it.
//
// It serves TLS on 127.0.0.1 with a certificate of the cluster's CA, and believes only requests
// that come with the kube-apiserver's front-proxy client certificate (FrontProxyCAFile,
// CommonName front-proxy-client): the user is their X-Remote-User. The kube-apiserver reaches
// it through an ExternalName Service naming localhost: kube-aggregator's service resolver
// (k8s.io/apiserver/pkg/util/proxy.ResolveCluster) sends a request for the group to
// https://<externalName>:<the APIService's port>, with the TLS server name
// <service>.<namespace>.svc, which the certificate covers too.
type notesAPI struct {
	// Port is the port it listens on (127.0.0.1).
	Port int

	srv *http.Server

	mu      sync.Mutex
	rv      uint64
	notes   []noteEvent   // every change, in resourceVersion order
	changed chan struct{} // closed and replaced on every change
}

// noteEvent is one change of a note.
type noteEvent struct {
	typ   string
	name  string
	owner string
	rv    uint64
}

const (
	notesGroup    = "filtered.watchsan.test"
	notesVersion  = "v1"
	notesResource = "notes"
	// notesNS and notesService name the ExternalName Service the APIService points at.
	notesNS      = "notes-api"
	notesService = "notes-api"
	// notesFirstRV is the resourceVersion before the first note: never "0", which shares nothing.
	notesFirstRV = 100
)

// notesPath is the notes' collection path.
const notesPath = "/apis/" + notesGroup + "/" + notesVersion + "/" + notesResource

// startNotesAPI starts the server for the cluster c (stopped in t.Cleanup).
func startNotesAPI(t *testing.T, c *cluster.Cluster) *notesAPI {
	t.Helper()
	certFile, keyFile, err := c.CA.IssueServingFor("notes-api", "127.0.0.1", "::1", "localhost", notesService+"."+notesNS+".svc")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(c.FrontProxyCAFile)
	if err != nil {
		t.Fatal(err)
	}
	frontProxy := x509.NewCertPool()
	if !frontProxy.AppendCertsFromPEM(caPEM) {
		t.Fatal("no certificate in the front-proxy CA file")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &notesAPI{Port: ln.Addr().(*net.TCPAddr).Port, rv: notesFirstRV, changed: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/apis", a.groups)
	mux.HandleFunc("/apis/"+notesGroup, a.group)
	mux.HandleFunc("/apis/"+notesGroup+"/"+notesVersion, a.resources)
	mux.HandleFunc(notesPath, a.collection)
	a.srv = &http.Server{
		Handler: a.authenticated(mux),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: frontProxy,
			NextProtos: []string{"http/1.1"}},
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = a.srv.ServeTLS(ln, "", "") }() // returns when closed in Cleanup
	t.Cleanup(func() { _ = a.srv.Close() })
	return a
}

// authenticated serves only requests with the front-proxy client certificate (verified by the
// TLS handshake on FrontProxyCAFile) and an X-Remote-User, as an aggregated API server's
// request-header authenticator does (k8s.io/apiserver's requestheader: the CA, then the
// allowed names); anything else is a 401.
func (a *notesAPI) authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || r.TLS.VerifiedChains[0][0].Subject.CommonName != cluster.FrontProxyUser ||
			r.Header.Get(cluster.RemoteUserHeader) == "" {
			writeStatus(w, http.StatusUnauthorized, "Unauthorized", "notes-api: no front-proxy client certificate or no X-Remote-User")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(&metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status: metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg})
}

func (a *notesAPI) groupVersion() metav1.APIGroup {
	gv := metav1.GroupVersionForDiscovery{GroupVersion: notesGroup + "/" + notesVersion, Version: notesVersion}
	return metav1.APIGroup{TypeMeta: metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}, Name: notesGroup,
		Versions: []metav1.GroupVersionForDiscovery{gv}, PreferredVersion: gv}
}

// groups is /apis, in the legacy format: the aggregator asks for the aggregated one
// (apidiscovery.k8s.io/v2) and falls back to /apis/<group>/<version> when it gets another.
func (a *notesAPI) groups(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, &metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{a.groupVersion()}})
}

func (a *notesAPI) group(w http.ResponseWriter, r *http.Request) {
	g := a.groupVersion()
	writeJSON(w, &g)
}

// resources is the group version's discovery, which the aggregator's availability check
// (the APIService's Available condition) and its discovery ask for.
func (a *notesAPI) resources(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, &metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"}, GroupVersion: notesGroup + "/" + notesVersion,
		APIResources: []metav1.APIResource{{Name: notesResource, SingularName: "note", Namespaced: false, Kind: "Note", Verbs: []string{"get", "list", "watch"}}}})
}

// put adds (or changes) the note name of owner and returns its resourceVersion.
func (a *notesAPI) put(name, owner string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	typ := "ADDED"
	for _, e := range a.notes {
		if e.name == name {
			typ = "MODIFIED"
		}
	}
	a.rv++
	a.notes = append(a.notes, noteEvent{typ: typ, name: name, owner: owner, rv: a.rv})
	close(a.changed)
	a.changed = make(chan struct{})
	return strconv.FormatUint(a.rv, 10)
}

// resourceVersion is the newest resourceVersion.
func (a *notesAPI) resourceVersion() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return strconv.FormatUint(a.rv, 10)
}

// object is the note of e as the API serves it.
func (e noteEvent) object() map[string]any {
	return map[string]any{
		"apiVersion": notesGroup + "/" + notesVersion, "kind": "Note",
		"metadata": map[string]any{"name": e.name, "uid": "note-uid-" + e.name, "resourceVersion": strconv.FormatUint(e.rv, 10),
			"creationTimestamp": "2026-01-01T00:00:00Z"},
		"spec": map[string]any{"owner": e.owner},
	}
}

// since returns the events of user's notes after resourceVersion from, the newest
// resourceVersion, and the channel closed at the next change.
func (a *notesAPI) since(user string, from uint64) ([]noteEvent, uint64, <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []noteEvent
	for _, e := range a.notes {
		if e.rv > from && e.owner == user {
			out = append(out, e)
		}
	}
	return out, a.rv, a.changed
}

// collection serves list and watch of the user's notes.
func (a *notesAPI) collection(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		writeStatus(w, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed, "notes-api: only list and watch")
		return
	}
	user := r.Header.Get(cluster.RemoteUserHeader)
	q := r.URL.Query()
	if q.Get("watch") != "1" && q.Get("watch") != "true" {
		current := map[string]noteEvent{}
		var order []string
		evs, rv, _ := a.since(user, 0)
		for _, e := range evs {
			if _, ok := current[e.name]; !ok {
				order = append(order, e.name)
			}
			current[e.name] = e
		}
		items := []any{}
		for _, n := range order {
			items = append(items, current[n].object())
		}
		writeJSON(w, map[string]any{"apiVersion": notesGroup + "/" + notesVersion, "kind": "NoteList",
			"metadata": map[string]any{"resourceVersion": strconv.FormatUint(rv, 10)}, "items": items})
		return
	}
	var from uint64
	if s := q.Get("resourceVersion"); s != "" && s != "0" {
		var err error
		if from, err = strconv.ParseUint(s, 10, 64); err != nil {
			writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, "notes-api: resourceVersion "+s+" is no integer")
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	fl.Flush()
	enc := json.NewEncoder(w)
	for {
		evs, newest, changed := a.since(user, from)
		for _, e := range evs {
			if err := enc.Encode(map[string]any{"type": e.typ, "object": e.object()}); err != nil {
				return
			}
		}
		fl.Flush()
		from = newest
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

// register makes the kube-apiserver serve the group from a: the ExternalName Service, the
// APIService (its caBundle the cluster's CA, which signed a's certificate), and waits until
// the APIService is Available and a list of notes through the kube-apiserver answers 200.
func (a *notesAPI) register(t *testing.T, ctx context.Context, c *cluster.Cluster, admin kubernetes.Interface) {
	t.Helper()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: notesNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Services(notesNS).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: notesService},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	apiServices := dyn.Resource(schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"})
	if _, err := apiServices.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": notesVersion + "." + notesGroup},
		"spec": map[string]any{
			"group": notesGroup, "version": notesVersion, "groupPriorityMinimum": int64(1000), "versionPriority": int64(15),
			"service":  map[string]any{"namespace": notesNS, "name": notesService, "port": int64(a.Port)},
			"caBundle": base64.StdEncoding.EncodeToString(c.CAData),
		},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var last string
	eventually(t, 60*time.Second, "the APIService "+notesVersion+"."+notesGroup+" Available", func() bool {
		u, err := apiServices.Get(ctx, notesVersion+"."+notesGroup, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Available" {
				last = fmt.Sprintf("%v: %v", m["reason"], m["message"])
				return m["status"] == "True"
			}
		}
		return false
	})
	t.Logf("APIService %s.%s: %s", notesVersion, notesGroup, last)
	hc := directClient(t, c)
	eventually(t, 30*time.Second, "a list of notes through the kube-apiserver", func() bool {
		req, _ := http.NewRequestWithContext(ctx, "GET", c.APIServers[0].URL+notesPath, nil)
		req.Header.Set("Authorization", "Bearer "+c.AdminToken)
		resp, err := hc.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// notesReaders binds the ClusterRole to get, list and watch notes to the ServiceAccounts of
// namespace ns named in sas.
func notesReaders(t *testing.T, ctx context.Context, admin kubernetes.Interface, ns string, sas ...string) {
	t.Helper()
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "notes-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{notesGroup}, Resources: []string{notesResource}, Verbs: []string{"get", "list", "watch"}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "notes-readers"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "notes-reader"}}
	for _, sa := range sas {
		crb.Subjects = append(crb.Subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa})
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// serviceAccountUser is the user name the kube-apiserver authenticates a token of the
// ServiceAccount ns/name as.
func serviceAccountUser(ns, name string) string {
	return strings.Join([]string{"system", "serviceaccount", ns, name}, ":")
}
