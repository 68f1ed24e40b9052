package watch

import (
	"cmp"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/upstream"
)

// The listing of the open shared feeds, /debug/feeds on the admin listener (docs/operations.md,
// "Shared watch feeds"). It is built from what each feed says of itself, never from its key:
// the key holds the credentials' principal. What it shows is what a feed's first request
// asked (its path and selectors), what it delivers and where from, and how many clients it
// serves; never who they are, their tokens or certificates. It takes no lock a delivery takes:
// each feed's goroutine publishes its state (publish) as it reads, the subscriber count is an
// atomic, and only the registry's lock is held, for as long as copying its pointers takes.

// MaxFeedsListed bounds the feeds one listing names (the oldest first); the count of the
// others is given.
const MaxFeedsListed = 1000

// feedIDs numbers the shared feeds, so that two whose listed fields are alike (they differ in
// the Accept header or a parameter not listed) are told apart, and the listing is ordered.
var feedIDs atomic.Uint64

// feedDesc is what a feed is, fixed when it opens.
type feedDesc struct {
	id                           uint64
	opened                       time.Time
	group, version, resource     string
	namespace, name              string
	labelSelector, fieldSelector string
	// as is the transformation its Accept asks for (stream.AcceptAs: "Table"), shown with its
	// format; "": whole objects.
	as string
}

// describe is the feedDesc of the feed a watch (info: reqinfo.Parse of it, q its query as
// parsed, accept its Accept header) opens.
func (h *Handler) describe(q url.Values, accept string, info *reqinfo.Info) feedDesc {
	return feedDesc{
		id: feedIDs.Add(1), opened: h.clk.Now(),
		group: info.APIGroup, version: info.APIVersion, resource: info.Resource,
		namespace: info.Namespace, name: info.Name,
		labelSelector: q.Get("labelSelector"), fieldSelector: q.Get("fieldSelector"),
		as: stream.AcceptAs(accept),
	}
}

// feedSnapshot is a feed's state as of its last read from the upstream, published by its
// goroutine (publish), which alone writes what it copies.
type feedSnapshot struct {
	format           stream.Format
	backend          *upstream.Backend
	ringEvents       int
	ringBytes        int
	ringFrom, ringTo uint64
	last             uint64
	events           uint64
	resumes          int
	joinable         bool
}

// publish makes the feed's state what the listing shows: from the feed's goroutine only (run,
// flush), which is the one that writes last, notJoinable, and the feed's backend and
// resumes, so it reads them without the feed's lock. A new snapshot only when something changed.
func (sf *sharedFeed) publish() {
	f := sf.f
	s := feedSnapshot{format: f.format, backend: f.backend,
		last: sf.last, events: f.events, resumes: f.resumes, joinable: sf.notJoinable == ""}
	// Under the ring's own lock: the budget may evict from it for another feed (ring.Budget).
	s.ringEvents, s.ringBytes, s.ringFrom, s.ringTo = sf.ring.Stats()
	if old := sf.snap.Load(); old != nil && *old == s {
		return
	}
	sf.snap.Store(&s)
}

// FeedsListing is /debug/feeds' answer.
type FeedsListing struct {
	// Sharing is --share-watches; without it there are no feeds.
	Sharing bool `json:"sharing"`
	// Open is how many shared feeds are open, MaxFeeds the most that may be
	// (--share-max-feeds), More how many open ones are not in Feeds (MaxFeedsListed).
	Open     int        `json:"open"`
	MaxFeeds int        `json:"maxFeeds"`
	More     int        `json:"more"`
	Feeds    []FeedInfo `json:"feeds"`
}

// FeedInfo is one shared feed.
type FeedInfo struct {
	ID uint64 `json:"id"`
	// What it watches: its first request's path and selectors.
	Group         string `json:"group"`
	Version       string `json:"version"`
	Resource      string `json:"resource"`
	Namespace     string `json:"namespace,omitempty"`
	Name          string `json:"name,omitempty"`
	LabelSelector string `json:"labelSelector,omitempty"`
	FieldSelector string `json:"fieldSelector,omitempty"`
	// Opening: its first attempt has not answered yet; what follows is not known.
	Opening bool `json:"opening,omitempty"`
	// Format is the upstream's wire format: json, protobuf or cbor, with the transformation
	// the watch asked for when any ("json;as=Table": kubectl's Table rows).
	Format      string   `json:"format,omitempty"`
	Subscribers int      `json:"subscribers"`
	Ring        FeedRing `json:"ring"`
	// LastDeliveredRV is the newest resourceVersion it delivered (events and bookmarks).
	LastDeliveredRV string `json:"lastDeliveredRV"`
	// Joinable: a client may still join it (false: it delivered resourceVersions out of order).
	Joinable bool `json:"joinable"`
	// Backend is the upstream its watch is on now, as the metrics name it.
	Backend    string  `json:"backend,omitempty"`
	AgeSeconds float64 `json:"ageSeconds"`
	// Events it received from upstream, and Resumes: its upstream watch broke and was resumed
	// (or moved) this many times, once for all its subscribers.
	Events  uint64 `json:"events"`
	Resumes int    `json:"resumes"`
	// Lag is how far its subscribers are behind it.
	Lag FeedLag `json:"lag"`
}

// FeedLag is how far a feed's subscribers are behind it: what it queued for them that their
// clients have not been written yet. A subscriber whose queue reaches --share-subscriber-buffer-bytes
// is ended (a slow subscriber); a lag that stays is a client reading slower than its feed
// delivers.
type FeedLag struct {
	// Behind counts the subscribers with something queued.
	Behind int `json:"behind"`
	// MaxBytes and MaxFrames are the most any one subscriber has queued (its bytes as its
	// bound counts them: frames queued or being written, and their entries); MaxSeconds how
	// long the oldest frame still queued for any of them has waited.
	MaxBytes   int     `json:"maxBytes"`
	MaxFrames  int     `json:"maxFrames"`
	MaxSeconds float64 `json:"maxSeconds"`
}

// lag reads how far sf's subscribers are behind it, at now.
func (sf *sharedFeed) lag(now time.Time) FeedLag {
	var l FeedLag
	oldest := int64(0)
	sf.mu.Lock()
	for m := range sf.members {
		b, n, since := int(m.queued.Load()), int(m.frames.Load()), m.since.Load()
		if n == 0 {
			continue
		}
		l.Behind++
		l.MaxBytes, l.MaxFrames = max(l.MaxBytes, b), max(l.MaxFrames, n)
		if since != 0 && (oldest == 0 || since < oldest) {
			oldest = since
		}
	}
	sf.mu.Unlock()
	if oldest != 0 {
		l.MaxSeconds = max(0, now.Sub(time.Unix(0, oldest)).Seconds())
	}
	return l
}

// FeedRing is a feed's ring: its events and bytes, and the resourceVersions it covers (a
// client joins from any RV in FromRV..the feed's LastDeliveredRV; ToRV is its newest event's).
type FeedRing struct {
	Events int    `json:"events"`
	Bytes  int    `json:"bytes"`
	FromRV string `json:"fromRV"`
	ToRV   string `json:"toRV"`
}

// Feeds lists the open shared feeds, the oldest first, at most MaxFeedsListed.
func (h *Handler) Feeds() FeedsListing { return h.listFeeds(MaxFeedsListed) }

// listFeeds is Feeds, listing at most limit.
func (h *Handler) listFeeds(limit int) FeedsListing {
	out := FeedsListing{Sharing: h.cfg.Share, MaxFeeds: h.cfg.ShareMaxFeeds, Feeds: []FeedInfo{}}
	g := h.feeds
	g.mu.Lock()
	feeds := make([]*sharedFeed, 0, len(g.feeds))
	for _, sf := range g.feeds {
		feeds = append(feeds, sf)
	}
	g.mu.Unlock()
	out.Open = len(feeds)
	slices.SortFunc(feeds, func(a, b *sharedFeed) int { return cmp.Compare(a.desc.id, b.desc.id) })
	if len(feeds) > limit {
		out.More = len(feeds) - limit
		feeds = feeds[:limit]
	}
	now := h.clk.Now()
	for _, sf := range feeds {
		out.Feeds = append(out.Feeds, sf.info(now))
	}
	return out
}

// info is what the listing shows of sf at now.
func (sf *sharedFeed) info(now time.Time) FeedInfo {
	d := sf.desc
	fi := FeedInfo{
		ID: d.id, Group: d.group, Version: d.version, Resource: d.resource, Namespace: d.namespace, Name: d.name,
		LabelSelector: d.labelSelector, FieldSelector: d.fieldSelector,
		Subscribers: int(sf.nsubs.Load()), AgeSeconds: now.Sub(d.opened).Seconds(), Lag: sf.lag(now),
	}
	rv := func(v uint64) string { return strconv.FormatUint(v, 10) }
	s := sf.snap.Load()
	if s == nil {
		fi.Opening = true
		fi.Ring.FromRV, fi.Ring.ToRV, fi.LastDeliveredRV = rv(sf.from), rv(sf.from), rv(sf.from)
		return fi
	}
	fi.Format = s.format.String()
	if d.as != "" {
		fi.Format += ";as=" + d.as
	}
	if s.backend != nil {
		fi.Backend = s.backend.String()
	}
	fi.Ring = FeedRing{Events: s.ringEvents, Bytes: s.ringBytes, FromRV: rv(s.ringFrom), ToRV: rv(s.ringTo)}
	fi.LastDeliveredRV, fi.Joinable, fi.Events, fi.Resumes = rv(s.last), s.joinable, s.events, s.resumes
	return fi
}

// ServeFeeds answers /debug/feeds with Feeds as JSON; for the admin listener only.
func (h *Handler) ServeFeeds(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(h.Feeds())
}
