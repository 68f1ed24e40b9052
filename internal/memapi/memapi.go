// Package memapi is a small in-memory Kubernetes apiserver for the demo and for tests: an
// http.Handler that serves a few core/v1 resources as JSON, well enough for real client-go
// clients and shared informers, watch-list included.
//
// What it does as the apiserver does (kube-apiserver 1.37 with its watch cache):
//   - one global integer resourceVersion, bumped by every create, update and delete;
//   - LIST at the current resourceVersion, or at an exact older one still in the history
//     (resourceVersionMatch=Exact); limit and continue are ignored (every item in one page, which
//     clients must accept);
//   - GET, POST (create, generateName, dryRun=All), PUT (update with optimistic concurrency; an
//     update that changes nothing is a no-op with no event), DELETE (with preconditions); the
//     DELETED event carries the object with the delete's new resourceVersion;
//   - WATCH (`?watch=true` and the legacy /api/v1/watch/... paths) from any resourceVersion still
//     in a bounded event history, else HTTP 200 and an ERROR event with 410 Expired; initial
//     ADDED events for a watch from "" or "0"; watch-list (sendInitialEvents=true with
//     resourceVersionMatch=NotOlderThan): ADDED for the current state, then, when bookmarks are
//     allowed, a BOOKMARK annotated k8s.io/initial-events-end: "true"; periodic BOOKMARKs;
//     timeoutSeconds; label selectors and the metadata.name / metadata.namespace field selectors
//     (an object whose labels stop or start matching is DELETED or ADDED for that watch);
//   - errors as metav1.Status JSON with the apiserver's codes and reasons; list options are
//     validated with apimachinery's own validation;
//   - minimal discovery (/api, /api/v1, /apis), /version, /healthz, /readyz, /livez.
//
// What it does not: protobuf or CBOR (JSON only; a request that accepts only those gets 406),
// PATCH, DELETE of a collection, subresources, admission, namespaces' lifecycle, field
// validation beyond a name, authentication.
//
// Watches are served in the request's goroutine from the shared event history (each watch
// keeps a cursor into it, nothing is queued per watch), so a client that disconnects or reads
// too slowly costs nothing and leaves no goroutine behind; one that falls behind the history
// gets 410 Expired, as the apiserver's slow watchers are cut.
package memapi

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Resource describes one core/v1 resource a Server stores.
type Resource struct {
	// Name is the plural resource name used in paths, e.g. "services".
	Name string
	// Kind is its objects' kind, e.g. "Service"; lists are Kind+"List".
	Kind string
	// Namespaced says whether its objects live in namespaces.
	Namespaced bool
}

// Resources New serves when given none, and a few more to choose from.
var (
	Services   = Resource{Name: "services", Kind: "Service", Namespaced: true}
	ConfigMaps = Resource{Name: "configmaps", Kind: "ConfigMap", Namespaced: true}
	Secrets    = Resource{Name: "secrets", Kind: "Secret", Namespaced: true}
	Namespaces = Resource{Name: "namespaces", Kind: "Namespace"}
)

const (
	defaultHistorySize      = 1000
	defaultBookmarkInterval = time.Minute
	defaultWatchTimeout     = 30 * time.Minute
	// maxBodyBytes is the apiserver's limit on a request body (3 MiB).
	maxBodyBytes = 3 << 20
)

// Server is the in-memory apiserver. Its exported fields must be set before the first request
// and not changed after. The zero value is not usable; use New.
type Server struct {
	// HistorySize is how many events (of all resources together) are kept for watches that
	// start from an older resourceVersion, and for exact LISTs at one. A watch from before the
	// oldest event kept gets 410 Expired. Zero means 1000.
	HistorySize int

	// BookmarkInterval is how often a watch that allows bookmarks gets a BOOKMARK carrying the
	// resourceVersion it has been brought up to. Zero means one minute, as the apiserver does.
	BookmarkInterval time.Duration

	// WatchTimeout ends a watch that did not ask for timeoutSeconds, cleanly. Zero means 30
	// minutes (the apiserver picks 30 to 60 at random).
	WatchTimeout time.Duration

	log       *zap.Logger
	resources map[string]*resource // by Name
	order     []*resource          // as given to New, for discovery

	mu      sync.Mutex
	rv      uint64   // the current resourceVersion: the last write's, or 1 at the start
	history []*event // the last events, oldest first; history[i].rv == floor+1+i
	floor   uint64   // a watch can start from any resourceVersion >= floor
	changed chan struct{}

	done      chan struct{}
	closeOnce sync.Once
	watches   atomic.Int64
}

// resource is a Resource with its objects.
type resource struct {
	Resource
	gr      schema.GroupResource
	objects map[string]*object // by namespace + "/" + name
}

// New returns a Server for resources (services and configmaps if none are given), empty, at
// resourceVersion 1. log may be nil.
func New(log *zap.Logger, resources ...Resource) *Server {
	if log == nil {
		log = zap.NewNop()
	}
	if len(resources) == 0 {
		resources = []Resource{Services, ConfigMaps}
	}
	s := &Server{
		log:       log.Named("memapi"),
		resources: make(map[string]*resource, len(resources)),
		rv:        1,
		floor:     1,
		changed:   make(chan struct{}),
		done:      make(chan struct{}),
	}
	for _, r := range resources {
		if _, dup := s.resources[r.Name]; dup || r.Name == "" || r.Kind == "" {
			continue
		}
		res := &resource{Resource: r, gr: schema.GroupResource{Resource: r.Name}, objects: map[string]*object{}}
		s.resources[r.Name] = res
		s.order = append(s.order, res)
	}
	return s
}

// ResourceVersion returns the current resourceVersion (the last write's).
func (s *Server) ResourceVersion() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rv
}

// OpenWatches returns the number of watch responses being served now.
func (s *Server) OpenWatches() int { return int(s.watches.Load()) }

// Close ends every open watch cleanly (their clients see the response end, as when an
// apiserver's watch times out) and makes later watches end at once. Other requests are still
// served. Close lets an http.Server or httptest.Server in front of s shut down, since those
// wait for running handlers. It is safe to call more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.done) })
}

func (s *Server) historySize() int {
	if s.HistorySize > 0 {
		return s.HistorySize
	}
	return defaultHistorySize
}

func (s *Server) bookmarkInterval() time.Duration {
	if s.BookmarkInterval > 0 {
		return s.BookmarkInterval
	}
	return defaultBookmarkInterval
}

func (s *Server) watchTimeout() time.Duration {
	if s.WatchTimeout > 0 {
		return s.WatchTimeout
	}
	return defaultWatchTimeout
}

// ServeHTTP routes a request: discovery and health paths, then /api/v1/... resource paths.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := strings.Trim(r.URL.Path, "/")
	switch p {
	case "healthz", "readyz", "livez":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok"))
		return
	case "version":
		s.serveVersion(w)
		return
	case "api":
		s.serveAPIVersions(w, r)
		return
	case "apis":
		s.serveAPIGroups(w)
		return
	case "api/v1":
		s.serveResourceList(w)
		return
	}
	segs := strings.Split(p, "/")
	if len(segs) < 3 || segs[0] != "api" || segs[1] != "v1" {
		writeStatus(w, errNotFoundPath())
		return
	}
	s.serveResource(w, r, segs[2:])
}

// serveResource serves /api/v1/<segs...>: [watch/][namespaces/NS/]RESOURCE[/NAME].
func (s *Server) serveResource(w http.ResponseWriter, r *http.Request, segs []string) {
	legacyWatch := false
	if segs[0] == "watch" {
		legacyWatch, segs = true, segs[1:]
	}
	var ns string
	if len(segs) >= 3 && segs[0] == "namespaces" {
		ns, segs = segs[1], segs[2:]
	}
	if len(segs) == 0 || len(segs) > 2 || segs[0] == "" {
		writeStatus(w, errNotFoundPath())
		return
	}
	res, ok := s.resources[segs[0]]
	if !ok || (ns != "" && !res.Namespaced) {
		writeStatus(w, errNotFoundPath())
		return
	}
	name := ""
	if len(segs) == 2 {
		if name = segs[1]; name == "" {
			writeStatus(w, errNotFoundPath())
			return
		}
	}
	if !acceptsJSON(r.Header.Get("Accept")) {
		writeStatus(w, errNotAcceptable())
		return
	}
	rq := &request{s: s, w: w, r: r, res: res, ns: ns, name: name}
	switch {
	case legacyWatch:
		if r.Method != http.MethodGet {
			writeStatus(w, errMethod(res, r.Method))
			return
		}
		rq.listOrWatch(true)
	case name == "" && r.Method == http.MethodGet:
		rq.listOrWatch(false)
	case name == "" && r.Method == http.MethodPost:
		rq.create()
	case name != "" && r.Method == http.MethodGet:
		rq.get()
	case name != "" && r.Method == http.MethodPut:
		rq.update()
	case name != "" && r.Method == http.MethodDelete:
		rq.delete()
	default:
		writeStatus(w, errMethod(res, r.Method))
	}
}

// acceptsJSON reports whether a response in JSON is acceptable for an Accept header.
func acceptsJSON(accept string) bool {
	if accept == "" {
		return true
	}
	for _, part := range strings.Split(accept, ",") {
		mt := strings.ToLower(strings.TrimSpace(strings.SplitN(part, ";", 2)[0]))
		switch mt {
		case "application/json", "application/*", "*/*", "*":
			return true
		}
	}
	return false
}

// request is one resource request being served.
type request struct {
	s    *Server
	w    http.ResponseWriter
	r    *http.Request
	res  *resource
	ns   string // "" for cluster-scoped resources, or a list across namespaces
	name string // "" for a collection
}
