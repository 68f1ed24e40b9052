// Package localapi says which API group-versions the kube-apiserver serves itself, as against
// those an aggregated API server serves behind an APIService with a service.
//
// Why it matters (docs/design.md section 11, "Who shares with whom"): the apiserver answers a
// watch of a resource it serves itself (a built-in group, a CustomResourceDefinition's) with
// the same events for every identity it authorizes; an aggregated server receives the user
// (X-Remote-User, X-Remote-Group) and may answer each user differently (OpenShift's projects
// list and watch only the projects the user may see). A shared feed may therefore mix
// principals only for group-versions served locally.
//
// The truth is the cluster's APIService objects: one whose spec.service is nil is served by
// the kube-apiserver itself (kube-aggregator's "Local" APIServices, the built-in groups and
// every CRD's group-version, registered by its autoregister controller); one with a service
// is proxied. Catalog reads them with watchsan's own identity, at most once per Refresh while
// someone asks, and answers from its last read. When it has none (the identity may not list
// apiservices, or there is no identity: --no-credentials), only the group-versions Kubernetes
// itself defines count as local (builtin.go), and everything else as not (a CRD's group too):
// unknown means "shares within one principal only".
package localapi

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/clock"
)

// Path is where the APIServices are listed.
const Path = "/apis/apiregistration.k8s.io/v1/apiservices"

// Defaults of Options.
const (
	// DefaultRefresh is how often the APIServices are read again while asked about: an
	// APIService that changes from local to proxied is seen within it.
	DefaultRefresh = 30 * time.Second
	// DefaultMaxAge is how long a read is trusted when later reads fail, before only the
	// built-in groups count as local again.
	DefaultMaxAge = 5 * time.Minute
	// readTimeout bounds one read.
	readTimeout = 15 * time.Second
)

// List is an APIServiceList, as much of it as Catalog reads.
type List struct {
	Items []struct {
		Spec struct {
			Group   string `json:"group"`
			Version string `json:"version"`
			// Service is nil for an APIService the kube-apiserver serves itself.
			Service *struct {
				Namespace string `json:"namespace"`
				Name      string `json:"name"`
			} `json:"service"`
		} `json:"spec"`
	} `json:"items"`
}

// Options are a Catalog's dependencies and timings.
type Options struct {
	// Read lists Path with watchsan's own identity into the List; required. It returns an
	// error for anything but a 200 with a List, naming the cause.
	Read func(ctx context.Context, into *List) error
	// Clock: nil, the real clock.
	Clock clock.Clock
	// Refresh is how often the APIServices are read while someone asks; 0: DefaultRefresh.
	Refresh time.Duration
	// MaxAge is how long the last good read is used while reads fail; 0: DefaultMaxAge.
	MaxAge time.Duration
	// Logger: nil, no logging.
	Logger *zap.Logger
	// OnRead, if set, is told how each read ended (true: read).
	OnRead func(ok bool)
}

// Catalog answers Local from the cluster's APIServices. Safe for concurrent use.
type Catalog struct {
	o   Options
	log *zap.Logger

	mu       sync.Mutex
	local    map[schema.GroupVersion]bool // the last good read: group-version -> served locally; nil: none
	goodAt   time.Time                    // when local was read
	askedAt  time.Time                    // when the last read began
	reading  bool
	lastFail string // the last read's error, logged once per change
}

// New returns a Catalog that reads nothing until it is asked.
func New(o Options) *Catalog {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Refresh <= 0 {
		o.Refresh = DefaultRefresh
	}
	if o.MaxAge <= 0 {
		o.MaxAge = DefaultMaxAge
	}
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	return &Catalog{o: o, log: log}
}

// Local says whether the kube-apiserver serves group/version itself, from the last read of the
// APIServices (a read in the background begins when that is older than Refresh); with no good
// read within MaxAge, whether it is one of Kubernetes' built-in group-versions. It never waits
// for a read.
func (c *Catalog) Local(group, version string) bool {
	gv := schema.GroupVersion{Group: group, Version: version}
	now := c.o.Clock.Now()
	c.mu.Lock()
	if !c.reading && (c.askedAt.IsZero() || now.Sub(c.askedAt) >= c.o.Refresh) {
		c.reading, c.askedAt = true, now
		go c.read() // ends within readTimeout
	}
	local, fresh := c.local, c.local != nil && now.Sub(c.goodAt) < c.o.MaxAge
	c.mu.Unlock()
	if fresh {
		return local[gv]
	}
	return Builtin(gv)
}

// Builtin says whether gv is one of the group-versions Kubernetes itself defines (builtin),
// never a CRD's or an aggregated server's.
func Builtin(gv schema.GroupVersion) bool {
	for _, v := range builtin[gv.Group] {
		if v == gv.Version {
			return true
		}
	}
	return false
}

// read lists the APIServices once and keeps what they say.
func (c *Catalog) read() {
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	var l List
	err := c.o.Read(ctx, &l)
	if c.o.OnRead != nil {
		c.o.OnRead(err == nil)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reading = false
	if err != nil {
		if msg := err.Error(); msg != c.lastFail {
			c.lastFail = msg
			c.log.Warn("could not read the APIServices; clients with credentials of their own share a feed across identities only for built-in APIs until a read succeeds",
				zap.Error(err))
		}
		return
	}
	if c.lastFail != "" {
		c.log.Info("read the APIServices again")
		c.lastFail = ""
	}
	local := make(map[schema.GroupVersion]bool, len(l.Items))
	for _, it := range l.Items {
		local[schema.GroupVersion{Group: it.Spec.Group, Version: it.Spec.Version}] = it.Spec.Service == nil
	}
	c.local, c.goodAt = local, c.o.Clock.Now()
}
