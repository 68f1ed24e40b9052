package server

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/watchsan/watchsan/internal/config"
	"github.com/watchsan/watchsan/internal/upstream"
	"github.com/watchsan/watchsan/internal/watch"
)

// The status page on the admin listener (docs/operations.md, "The status page"): what
// watchsan is doing now, in one page a browser renders from the server alone (no script, no
// external asset) and refreshes itself, and the same data as JSON (/status?format=json or
// /status.json). It shows the upstreams with their state and last error (upstream.Health),
// the open shared feeds (watch.Handler.Feeds, as /debug/feeds), the recent rewrites,
// resumes, moves, absorbs and forced relists (recentEvents), and the flags in effect. Every
// list is bounded, saying how many rows it left out. It names no token and no certificate:
// the flags hold only paths of such files, and a URL's user information is dropped. Like
// everything on the admin listener but the probes, it is behind the admin authentication off
// loopback (adminauth.go).

// Bounds of the status page's lists.
const (
	maxStatusUpstreams = 100
	maxStatusFeeds     = 200
	// statusRefresh is how often the page reloads itself.
	statusRefresh = 5 * time.Second
)

//go:embed templates/status.html
var statusHTML string

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"ago": func(now, t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return now.Sub(t).Round(time.Second).String()
	},
	"utc": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339)
	},
	"seconds": func(s float64) string { return (time.Duration(s * float64(time.Second))).Round(time.Second).String() },
}).Parse(statusHTML))

// statusData is the page's content, and its JSON.
type statusData struct {
	Generated time.Time `json:"generated"`
	// RefreshSeconds is how often the HTML page reloads itself.
	RefreshSeconds int  `json:"refreshSeconds"`
	Ready          bool `json:"ready"`
	ShuttingDown   bool `json:"shuttingDown"`
	// Upstreams, at most maxStatusUpstreams; UpstreamsOmitted counts the others.
	Upstreams        []statusUpstream `json:"upstreams"`
	UpstreamsOmitted int              `json:"upstreamsOmitted"`
	// Feeds is /debug/feeds' listing, at most maxStatusFeeds in Feeds.Feeds (Feeds.More counts
	// the others).
	Feeds watch.FeedsListing `json:"feeds"`
	// Events are the recent ones, the newest first; EventsTotal counts every one since start,
	// EventsOmitted those no longer held.
	Events        []recentEvent `json:"events"`
	EventsTotal   uint64        `json:"eventsTotal"`
	EventsOmitted uint64        `json:"eventsOmitted"`
	// Flags are the flags in effect, in help order.
	Flags []statusFlag `json:"flags"`
}

// statusUpstream is one upstream as the page shows it.
type statusUpstream struct {
	Name       string    `json:"name"`
	State      string    `json:"state"`
	StateSince time.Time `json:"stateSince,omitzero"`
	// LastError is the health checker's last error (kept after a recovery), ErrorKind its
	// class (upstream.CauseKind), ErrorSince when an error of that kind began, ErrorAt the last
	// time it was seen.
	LastError   string    `json:"lastError,omitempty"`
	ErrorKind   string    `json:"errorKind,omitempty"`
	ErrorSince  time.Time `json:"errorSince,omitzero"`
	ErrorAt     time.Time `json:"errorAt,omitzero"`
	OpenWatches int64     `json:"openWatches"`
	InFlight    int64     `json:"inFlight"`
	Lagging     bool      `json:"lagging"`
	// ReadinessUnverified: ready without proof (docs/design.md section 10.6).
	ReadinessUnverified bool `json:"readinessUnverified"`
}

// statusFlag is one flag and its value in effect; Changed: not its default.
type statusFlag struct {
	Name    string `json:"name"`
	Value   string `json:"value"`
	Changed bool   `json:"changed"`
}

// status gathers the page's data now.
func (s *Server) status() statusData {
	now := time.Now()
	d := statusData{Generated: now, RefreshSeconds: int(statusRefresh / time.Second),
		Ready: s.pool.Ready(), ShuttingDown: s.stopping.Load(), Upstreams: []statusUpstream{}}
	bs := s.pool.Backends()
	if len(bs) > maxStatusUpstreams {
		d.UpstreamsOmitted = len(bs) - maxStatusUpstreams
		bs = bs[:maxStatusUpstreams]
	}
	for _, b := range bs {
		h := b.Health()
		u := statusUpstream{Name: b.String(), State: h.State.String(), StateSince: h.StateSince,
			OpenWatches: b.OpenWatches(), InFlight: b.InFlight(), Lagging: b.Lagging(), ReadinessUnverified: b.ReadinessUnverified()}
		if h.LastError != nil {
			u.LastError, u.ErrorKind, u.ErrorSince, u.ErrorAt = h.LastError.Error(), string(h.LastError.Kind), h.ErrorSince, h.ErrorAt
		}
		d.Upstreams = append(d.Upstreams, u)
	}
	d.Feeds = s.watch.Feeds()
	if n := len(d.Feeds.Feeds); n > maxStatusFeeds {
		d.Feeds.More += n - maxStatusFeeds
		d.Feeds.Feeds = d.Feeds.Feeds[:maxStatusFeeds]
	}
	d.Events, d.EventsTotal = s.recent.list()
	d.EventsOmitted = d.EventsTotal - uint64(len(d.Events))
	d.Flags = effectiveFlags(s.cfg.Config)
	return d
}

// effectiveFlags lists c's flags with their values; a URL's user information is dropped, and
// a flag whose name says it holds a secret's contents (none does today: tokens and keys are
// given as files) is shown as set or not.
func effectiveFlags(c config.Config) []statusFlag {
	defaults := config.FlagSet(new(config.Default()))
	var out []statusFlag
	config.FlagSet(&c).VisitAll(func(f *pflag.Flag) {
		if f.Shorthand != "" && f.Name == "v" {
			return
		}
		v := f.Value.String()
		changed := true
		if d := defaults.Lookup(f.Name); d != nil {
			changed = d.Value.String() != v
		}
		out = append(out, statusFlag{Name: f.Name, Value: redactFlag(f.Name, v), Changed: changed})
	})
	return out
}

// redactFlag is what the page shows of flag name's value v.
func redactFlag(name, v string) string {
	secret := false
	for _, w := range []string{"token", "password", "secret", "key", "cert", "bearer"} {
		if strings.Contains(name, w) && !strings.HasSuffix(name, "-file") && !strings.HasSuffix(name, "-dir") {
			secret = true
		}
	}
	if secret {
		if v == "" {
			return ""
		}
		return "(set, not shown)"
	}
	if strings.Contains(v, "@") && strings.Contains(v, "://") {
		parts := strings.Split(strings.Trim(v, "[]"), ",")
		for i, p := range parts {
			if u, err := url.Parse(p); err == nil && u.User != nil {
				u.User = nil
				parts[i] = u.String()
			}
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	return clip(v)
}

// serveStatus answers /status (HTML, or JSON with ?format=json) and /status.json.
func (s *Server) serveStatus(w http.ResponseWriter, r *http.Request) {
	d := s.status()
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if r.URL.Path == "/status.json" || r.URL.Query().Get("format") == "json" {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(d)
		return
	}
	var buf bytes.Buffer
	if err := statusTemplate.Execute(&buf, d); err != nil {
		http.Error(w, "status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	// Nothing from elsewhere: no script, no external style, image or frame.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'")
	_, _ = w.Write(buf.Bytes())
}

// upstreamName names b for the recent events (nil: not known).
func upstreamName(b *upstream.Backend) string {
	if b == nil {
		return ""
	}
	return b.String()
}
