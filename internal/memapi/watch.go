package memapi

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metainternalversionscheme "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme"
	"k8s.io/apimachinery/pkg/apis/meta/internalversion/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
)

// selector is a request's label and field selectors. Fields: metadata.name and
// metadata.namespace, which every resource supports.
type selector struct {
	labels labels.Selector
	fields fields.Selector
}

func (sel selector) matches(o *object) bool {
	if sel.labels != nil && !sel.labels.Empty() && !sel.labels.Matches(labels.Set(o.u.GetLabels())) {
		return false
	}
	if sel.fields != nil && !sel.fields.Empty() &&
		!sel.fields.Matches(fields.Set{"metadata.name": o.u.GetName(), "metadata.namespace": o.u.GetNamespace()}) {
		return false
	}
	return true
}

// view returns how a watch with sel in namespace ns (all if "") sees ev, if at all: an object
// whose labels start matching is ADDED for it, one whose labels stop matching is DELETED.
func (sel selector) view(ev *event, res *resource, ns string) (watch.EventType, bool) {
	if ev.res != res || (ns != "" && ev.obj.u.GetNamespace() != ns) {
		return "", false
	}
	switch ev.typ {
	case watch.Added:
		return watch.Added, sel.matches(ev.obj)
	case watch.Deleted:
		return watch.Deleted, sel.matches(ev.prev)
	}
	now, before := sel.matches(ev.obj), sel.matches(ev.prev)
	switch {
	case now && before:
		return watch.Modified, true
	case now:
		return watch.Added, true
	case before:
		return watch.Deleted, true
	}
	return "", false
}

// options decodes and validates the request's list options, as the apiserver does.
func (rq *request) options(legacyWatch bool) (*metainternalversion.ListOptions, selector, *apierrors.StatusError) {
	opts := &metainternalversion.ListOptions{}
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(rq.r.URL.Query(), metav1.SchemeGroupVersion, opts); err != nil {
		return nil, selector{}, apierrors.NewBadRequest(err.Error())
	}
	if legacyWatch {
		opts.Watch = true
	}
	if rq.name != "" { // a legacy watch of one object
		nameSel := fields.OneTermEqualSelector("metadata.name", rq.name)
		if opts.FieldSelector == nil || opts.FieldSelector.Empty() {
			opts.FieldSelector = nameSel
		} else {
			opts.FieldSelector = fields.AndSelectors(opts.FieldSelector, nameSel)
		}
	}
	if errs := validation.ValidateListOptions(opts, true); len(errs) > 0 {
		return nil, selector{}, apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "ListOptions"}, "", errs)
	}
	if opts.FieldSelector != nil {
		for _, r := range opts.FieldSelector.Requirements() {
			if r.Field != "metadata.name" && r.Field != "metadata.namespace" {
				return nil, selector{}, apierrors.NewBadRequest(fmt.Sprintf("field label not supported: %s", r.Field))
			}
		}
	}
	return opts, selector{labels: opts.LabelSelector, fields: opts.FieldSelector}, nil
}

// parseRV parses a resourceVersion parameter that is neither "" nor "0".
func parseRV(rv string) (uint64, *apierrors.StatusError) {
	n, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return 0, apierrors.NewBadRequest(fmt.Sprintf("invalid resource version %q: %v", rv, err))
	}
	return n, nil
}

// errTooLargeRV is the apiserver's answer to a list or watch-list from a resourceVersion it has
// not reached yet (kube-apiserver waits up to 3 s first; memapi, being the storage, knows at once).
func errTooLargeRV(asked, current uint64) *apierrors.StatusError {
	err := apierrors.NewTimeoutError(fmt.Sprintf("Too large resource version: %d, current: %d", asked, current), 1)
	err.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: metav1.CauseTypeResourceVersionTooLarge, Message: "Too large resource version"}}
	return err
}

func errTooOldRV(asked, floor uint64) *apierrors.StatusError {
	return apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", asked, floor))
}

func (rq *request) listOrWatch(legacyWatch bool) {
	opts, sel, serr := rq.options(legacyWatch)
	if serr != nil {
		writeStatus(rq.w, serr)
		return
	}
	if opts.Watch {
		rq.watch(opts, sel)
		return
	}
	rq.list(opts, sel)
}

func (rq *request) list(opts *metainternalversion.ListOptions, sel selector) {
	s := rq.s
	s.mu.Lock()
	at := s.rv
	if rv := opts.ResourceVersion; rv != "" && rv != "0" {
		n, serr := parseRV(rv)
		switch {
		case serr != nil:
		case n > s.rv:
			serr = errTooLargeRV(n, s.rv)
		case opts.ResourceVersionMatch == metav1.ResourceVersionMatchExact && n < s.floor:
			serr = errTooOldRV(n, s.floor)
		case opts.ResourceVersionMatch == metav1.ResourceVersionMatchExact:
			at = n
		}
		if serr != nil {
			s.mu.Unlock()
			writeStatus(rq.w, serr)
			return
		}
	}
	items := s.snapshotLocked(rq.res, rq.ns, sel, at)
	s.mu.Unlock()

	buf := fmt.Appendf(nil, `{"kind":%q,"apiVersion":"v1","metadata":{"resourceVersion":"%d"},"items":[`, rq.res.Kind+"List", at)
	for i, o := range items {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, o.raw...)
	}
	buf = append(buf, "]}\n"...)
	writeJSON(rq.w, http.StatusOK, buf)
}

// watch serves a watch in the request's goroutine until the client goes away, its timeout, or
// Close.
func (rq *request) watch(opts *metainternalversion.ListOptions, sel selector) {
	s := rq.s
	timeout := s.watchTimeout()
	if opts.TimeoutSeconds != nil && *opts.TimeoutSeconds > 0 {
		timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	watchList := opts.SendInitialEvents != nil && *opts.SendInitialEvents

	s.mu.Lock()
	var (
		from     = s.rv
		initial  []*object
		expired  *apierrors.StatusError
		asked    uint64
		askedErr *apierrors.StatusError
	)
	if rv := opts.ResourceVersion; rv != "" && rv != "0" {
		asked, askedErr = parseRV(rv)
	}
	switch {
	case askedErr != nil:
	case watchList:
		// The current state (never older than asked), then everything after it.
		if asked > s.rv {
			askedErr = errTooLargeRV(asked, s.rv)
			break
		}
		initial = s.snapshotLocked(rq.res, rq.ns, sel, s.rv)
	case opts.ResourceVersion == "" || opts.ResourceVersion == "0":
		if opts.SendInitialEvents == nil { // the legacy "get state and start at most recent"
			initial = s.snapshotLocked(rq.res, rq.ns, sel, s.rv)
		}
	default:
		from = asked
		if asked < s.floor {
			expired = errTooOldRV(asked, s.floor)
		}
	}
	s.mu.Unlock()
	if askedErr != nil {
		writeStatus(rq.w, askedErr)
		return
	}

	s.watches.Add(1)
	defer s.watches.Add(-1)
	h := rq.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-cache, private")
	rq.w.WriteHeader(http.StatusOK)
	ww := &watchWriter{w: rq.w, rc: http.NewResponseController(rq.w), kind: rq.res.Kind}
	if ww.rc.Flush() != nil {
		return
	}
	if expired != nil {
		// Once a watch has started the apiserver reports 410 as an ERROR event.
		_ = ww.status(expired)
		return
	}
	for _, o := range initial {
		if ww.event(watch.Added, o.raw) != nil {
			return
		}
	}
	if watchList && opts.AllowWatchBookmarks {
		if ww.bookmark(from, true) != nil {
			return
		}
	}

	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var tick <-chan time.Time
	if opts.AllowWatchBookmarks {
		t := time.NewTicker(s.bookmarkInterval())
		defer t.Stop()
		tick = t.C
	}
	ctx := rq.r.Context()
	cursor := from // every event up to cursor has been considered
	var batch []*event
	for {
		s.mu.Lock()
		if cursor < s.floor {
			// Fell behind the history (a slow reader): the apiserver cuts such watchers.
			serr := errTooOldRV(cursor, s.floor)
			s.mu.Unlock()
			_ = ww.status(serr)
			return
		}
		batch = batch[:0]
		if cursor < s.rv {
			batch = append(batch, s.history[cursor-s.floor:]...)
		}
		current, changed := s.rv, s.changed
		s.mu.Unlock()

		for i, ev := range batch {
			batch[i] = nil
			if typ, ok := sel.view(ev, rq.res, rq.ns); ok {
				if ww.event(typ, ev.obj.raw) != nil {
					return
				}
			}
			cursor = ev.rv
		}
		if len(batch) > 0 {
			continue // more may have come meanwhile
		}
		select {
		case <-changed:
		case <-tick:
			if cursor <= current && ww.bookmark(cursor, false) != nil {
				return
			}
		case <-deadline.C:
			return
		case <-ctx.Done():
			return
		case <-s.done:
			return
		}
	}
}

// watchWriter writes JSON watch events, one per line, each flushed.
type watchWriter struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	kind string
	buf  []byte
}

func (ww *watchWriter) write() error {
	if _, err := ww.w.Write(ww.buf); err != nil {
		return err
	}
	return ww.rc.Flush()
}

func (ww *watchWriter) event(typ watch.EventType, obj []byte) error {
	ww.buf = append(ww.buf[:0], `{"type":"`...)
	ww.buf = append(ww.buf, typ...)
	ww.buf = append(ww.buf, `","object":`...)
	ww.buf = append(ww.buf, obj...)
	ww.buf = append(ww.buf, "}\n"...)
	return ww.write()
}

// bookmark writes a BOOKMARK: an object of the watched kind carrying only its resourceVersion,
// and the initial-events-end annotation when end is set.
func (ww *watchWriter) bookmark(rv uint64, end bool) error {
	ann := ""
	if end {
		ann = fmt.Sprintf(`,"annotations":{%q:"true"}`, metav1.InitialEventsAnnotationKey)
	}
	obj := fmt.Appendf(nil, `{"kind":%q,"apiVersion":"v1","metadata":{"resourceVersion":"%d"%s}}`, ww.kind, rv, ann)
	return ww.event(watch.Bookmark, obj)
}

func (ww *watchWriter) status(serr *apierrors.StatusError) error {
	return ww.event(watch.Error, statusJSON(serr))
}
