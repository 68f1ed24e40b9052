// Package faults is a fault-injecting layer for tests and the demo: an http.Handler that sits in
// front of a real kube-apiserver (usually behind an httputil.ReverseProxy to it) and makes its
// watch responses misbehave the way apiservers and the hops in front of them once did: the
// Kubernetes 1.7-1.9 DELETED events that went back in time, watches ended, reset, stalled,
// cut when idle, stripped of bookmarks, refused with 503 or sent a GOAWAY. Everything that is not a watch passes straight through.
//
// The layer parses watch streams with package stream, so it works for JSON, protobuf and CBOR
// alike, and it writes every event it does not change byte for byte as the apiserver sent it.
package faults

import (
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/stream"
)

const (
	defaultMaxFrame      = 16 << 20
	defaultMaxTracked    = 1 << 16
	defaultLookupTimeout = 10 * time.Second
)

// Layer injects Faults into the watch requests it serves and passes every other request to
// Next unchanged. Its exported fields must be set before the first request and not changed
// after; the faults themselves change at any time with Set.
//
// For DeleteOldRV the layer remembers, for every object it sees in an ADDED or MODIFIED event
// on any watch through it, the highest resourceVersion it carried: that is the resourceVersion
// a DELETED event of the object gets. When it has not seen the object (it last changed before
// any watch through the layer saw it, or the client only LISTed it), the layer asks the
// apiserver through Next, with the watch request's credentials (Authorization and
// Impersonate-* headers): a JSON LIST of the object's collection with
// resourceVersion=<delete RV - 1>, resourceVersionMatch=Exact and
// fieldSelector=metadata.name=<name>, whose one item is the object as it was right before the
// delete. That needs the delete's revision minus one to be an integer inside etcd's compaction
// window; when it is not, the DELETED event passes unchanged (Stats.DeletesUnknown).
type Layer struct {
	// MaxFrame caps one watch frame read from upstream and the fallback LIST's response body.
	// Zero means 16 MiB, what clients use.
	MaxFrame int

	// MaxTracked bounds how many objects the layer remembers (their last resourceVersion for
	// DeleteOldRV, whether a watch already ended after their delete for
	// EndWatchAfterDelete); the oldest entries go first. Zero means 65536.
	MaxTracked int

	// LookupTimeout bounds the fallback LIST that finds a deleted object's previous
	// resourceVersion. Zero means 10 s.
	LookupTimeout time.Duration

	next     http.Handler
	log      *zap.Logger
	initOnce sync.Once
	active   atomic.Pointer[active]
	tracker  tracker
	stats    counters
}

// New returns a Layer in front of next with no faults set. next must end a request it serves
// once that request's context is done. log may be nil.
func New(next http.Handler, log *zap.Logger) *Layer {
	if log == nil {
		log = zap.NewNop()
	}
	l := &Layer{next: next, log: log.Named("faults")}
	l.active.Store(&active{})
	return l
}

// Set replaces the active faults; it is safe to call while watches are being served. A running
// watch sees the new faults from its next event on. Counts that belong to a setting
// (Fail503FirstK's) start again. An invalid f is refused with the reasons and leaves the
// active faults as they were.
func (l *Layer) Set(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	l.active.Store(&active{Faults: f})
	l.log.Info("faults set", zap.Any("faults", f))
	return nil
}

// Faults returns the active faults.
func (l *Layer) Faults() Faults { return l.active.Load().Faults }

// ServeHTTP injects the active faults into a watch request and passes any other request (and
// protocol upgrades) to next as it is.
func (l *Layer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.stats.requests.Add(1)
	if !reqinfo.Parse(r).IsWatch() || r.Header.Get("Upgrade") != "" {
		if hold := l.active.Load().HoldListAnswers; hold != nil && l.holdList(w, r, hold) {
			return
		}
		l.next.ServeHTTP(w, r)
		return
	}
	l.initOnce.Do(func() { l.tracker.max = l.MaxTracked })
	l.stats.watches.Add(1)
	wt := &watchReq{l: l, w: w, r: r, log: l.log.With(zap.String("path", r.URL.Path))}
	a := l.active.Load()
	for _, f := range faultList {
		if f.admit != nil && f.admit(a, wt) {
			return
		}
	}
	wt.serve()
}

// watchReq is one watch request passing through the layer.
type watchReq struct {
	l   *Layer
	w   http.ResponseWriter
	r   *http.Request // as it came in; never modified
	log *zap.Logger
	// events counts the events written to w.
	events int
}

// serve sends the watch upstream and copies its answer to the client, event by event, with
// the active faults applied.
func (wt *watchReq) serve() {
	l, w, r := wt.l, wt.w, wt.r
	u := startUpstream(l.next, r, wt.log)
	defer u.close()

	<-u.ready
	if u.status == 0 { // next returned or panicked without answering
		if u.aborted.Load() {
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(http.StatusOK)
		return
	}

	format, isStream := stream.FormatOf(u.header.Get("Content-Type"))
	encoding := strings.ToLower(strings.TrimSpace(u.header.Get("Content-Encoding")))
	if encoding != "" && encoding != "identity" && encoding != "gzip" {
		wt.log.Warn("upstream watch has an unknown content encoding; passing it through without faults",
			zap.String("encoding", encoding))
		isStream = false
	}
	if u.status != http.StatusOK || !isStream {
		wt.passThrough(u)
		return
	}

	h := w.Header()
	copyHeader(h, u.header)
	h.Del("Content-Length")
	h.Del("Content-Encoding")
	a := l.active.Load()
	for _, f := range faultList {
		if f.header != nil {
			f.header(a, wt, h)
		}
	}
	w.WriteHeader(u.status)
	if flush(w) != nil {
		return
	}
	for _, f := range faultList {
		if f.started != nil && f.started(a, wt) != carryOn {
			return
		}
	}
	idle := startIdleCut(a, wt, u)
	defer idle.stop()

	var body io.Reader = u.pr
	if encoding == "gzip" { // asked for identity; decode anyway if the upstream insists
		zr, err := gzip.NewReader(u.pr)
		if err != nil {
			wt.readFailed(u, err)
			return
		}
		body = zr
	}
	rd := stream.NewReader(format, body, l.maxFrame())
	wr := stream.NewWriter(format, w)
	for {
		ev, err := rd.Next()
		if err != nil {
			wt.readFailed(u, err)
			return
		}
		a := l.active.Load()
		if ev.Type == stream.Added || ev.Type == stream.Modified {
			l.tracker.observe(ev)
		}
		if dropped(a, wt, ev) {
			continue
		}
		rv := ""
		for _, f := range faultList {
			if rv == "" && f.rv != nil {
				rv = f.rv(a, wt, ev)
			}
		}
		if rv != "" {
			err = wr.WriteWithRV(ev, rv)
		} else {
			err = wr.Write(ev)
		}
		if err == nil {
			err = flush(w)
		}
		if err != nil {
			wt.log.Debug("client went away", zap.Error(err))
			return
		}
		wt.events++
		idle.touch()
		for _, f := range faultList {
			if f.after == nil {
				continue
			}
			switch f.after(a, wt, ev) {
			case carryOn:
				continue
			case endClean:
				return
			case reset:
				u.close()
				wt.reset(a.ResetTCP)
				return
			case stall:
				u.close()
				<-r.Context().Done()
				return
			}
		}
	}
}

// readFailed ends the client's response after the upstream stream could not be read further:
// cleanly when it ended cleanly, was cut for being idle (EndIdleAfter) or sent something
// unreadable, with an abort when the upstream
// itself was aborted (so the client sees the break it would have seen without the layer).
func (wt *watchReq) readFailed(u *upstream, err error) {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, errIdleCut):
		return
	case wt.r.Context().Err() != nil:
		return
	case u.aborted.Load():
		wt.log.Debug("upstream watch aborted; aborting the client's", zap.Error(err))
		panic(http.ErrAbortHandler)
	default:
		wt.l.stats.garbage.Add(1)
		wt.log.Warn("unreadable upstream watch stream; ending the response", zap.Error(err))
	}
}

// passThrough copies an answer the layer does not touch (an error status, a non-stream
// content type) to the client, flushing as it goes.
func (wt *watchReq) passThrough(u *upstream) {
	w := wt.w
	copyHeader(w.Header(), u.header)
	w.WriteHeader(u.status)
	buf := make([]byte, 32<<10)
	for {
		n, err := u.pr.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if flush(w) != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && u.aborted.Load() && wt.r.Context().Err() == nil {
				panic(http.ErrAbortHandler)
			}
			return
		}
	}
}

func (l *Layer) maxFrame() int {
	if l.MaxFrame > 0 {
		return l.MaxFrame
	}
	return defaultMaxFrame
}

func (l *Layer) lookupTimeout() time.Duration {
	if l.LookupTimeout > 0 {
		return l.LookupTimeout
	}
	return defaultLookupTimeout
}

// flush sends what was written to the client now. A writer that cannot flush is not an error.
func flush(w http.ResponseWriter) error {
	err := http.NewResponseController(w).Flush()
	if errors.Is(err, http.ErrNotSupported) {
		return nil
	}
	return err
}

func copyHeader(dst, src http.Header) {
	for k, vv := range src {
		dst[k] = append([]string(nil), vv...)
	}
}
