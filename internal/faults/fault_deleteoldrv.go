package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/watchsan/watchsan/internal/stream"
)

// deleteOldRVFault gives every DELETED event its object's previous resourceVersion
// (DeleteOldRV), as the 1.7.0-1.9.2 watch cache did.
var deleteOldRVFault = fault{
	name: "delete-old-rv",
	rv: func(a *active, wt *watchReq, ev *stream.Event) string {
		if !a.DeleteOldRV || ev.Type != stream.Deleted || !ev.RVIsInt || !ev.CanRewriteRV() {
			return ""
		}
		l := wt.l
		prev, ok := l.tracker.prev(ev)
		if !ok {
			var err error
			prev, err = wt.lookupPrevRV(ev)
			if err != nil {
				l.stats.deletesUnknown.Add(1)
				wt.log.Warn("previous resourceVersion of a deleted object unknown; DELETED event passes unchanged",
					zap.String("namespace", ev.Namespace), zap.String("name", ev.Name), zap.String("rv", ev.RV), zap.Error(err))
				return ""
			}
		}
		l.stats.deletesRewritten.Add(1)
		wt.log.Debug("DELETED event sent with the previous resourceVersion",
			zap.String("namespace", ev.Namespace), zap.String("name", ev.Name), zap.String("rv", ev.RV), zap.String("prev", prev))
		return prev
	},
}

// credentialHeaders are the request headers the fallback LIST copies from the watch, so that
// it runs with the watch's identity.
var credentialHeaders = []string{"Authorization", "Impersonate-User", "Impersonate-Group", "Impersonate-Uid"}

// lookupPrevRV asks the apiserver, through next, for the resourceVersion ev's object had
// right before the delete: the object as listed at exactly the delete's revision minus one.
func (wt *watchReq) lookupPrevRV(ev *stream.Event) (string, error) {
	l := wt.l
	if ev.RVInt < 2 || ev.Name == "" {
		return "", errors.New("no revision before the delete, or no name to look up")
	}
	p, err := listPath(wt.r.URL.Path, ev.Namespace)
	if err != nil {
		return "", err
	}
	l.stats.lookups.Add(1)
	rv, err := wt.listAt(p, ev)
	if err != nil {
		l.stats.lookupsFailed.Add(1)
		return "", fmt.Errorf("fallback LIST %s: %w", p, err)
	}
	return rv, nil
}

func (wt *watchReq) listAt(path string, ev *stream.Event) (string, error) {
	l, r := wt.l, wt.r
	ctx, cancel := context.WithTimeout(r.Context(), l.lookupTimeout())
	defer cancel()

	q := url.Values{
		"resourceVersion":      {strconv.FormatUint(ev.RVInt-1, 10)},
		"resourceVersionMatch": {"Exact"},
		"fieldSelector":        {fields.OneTermEqualSelector("metadata.name", ev.Name).String()},
	}
	req := r.Clone(ctx)
	req.Method = http.MethodGet
	req.URL.Path, req.URL.RawPath, req.URL.RawQuery = path, "", q.Encode()
	req.RequestURI = req.URL.RequestURI()
	req.Header = http.Header{"Accept": {"application/json"}, "Accept-Encoding": {"identity"}}
	for _, k := range credentialHeaders {
		if vv := r.Header.Values(k); len(vv) > 0 {
			req.Header[k] = append([]string(nil), vv...)
		}
	}
	req.Body, req.ContentLength, req.GetBody = http.NoBody, 0, nil

	rec := &recorder{h: make(http.Header), limit: l.maxFrame()}
	if err := serveRecovered(l.next, rec, req); err != nil {
		return "", err
	}
	if rec.code != http.StatusOK {
		return "", fmt.Errorf("status %d: %s", rec.code, bytes.TrimSpace(rec.buf.Bytes()))
	}
	if ce := rec.h.Get("Content-Encoding"); ce != "" && ce != "identity" {
		return "", fmt.Errorf("unexpected content encoding %q", ce)
	}
	var list struct {
		Items []struct {
			Metadata struct {
				UID             string `json:"uid"`
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal(rec.buf.Bytes(), &list); err != nil {
		return "", fmt.Errorf("decoding the list: %w", err)
	}
	for _, it := range list.Items {
		if ev.UID != "" && it.Metadata.UID != ev.UID {
			continue
		}
		rv := it.Metadata.ResourceVersion
		n, ok := stream.ParseRV(rv)
		if !ok || n >= ev.RVInt {
			return "", fmt.Errorf("listed resourceVersion %q is not an integer below the delete's %s", rv, ev.RV)
		}
		l.tracker.record(objectKey(ev), rv, n)
		return rv, nil
	}
	return "", fmt.Errorf("the object (uid %q) is not in the list at resourceVersion %d", ev.UID, ev.RVInt-1)
}

// listPath turns a watch request's path into the path that lists the collection of the
// watched resource in namespace ns ("" for cluster-scoped objects). It knows the list paths
// (/api/v1/[namespaces/NS/]RESOURCE, /apis/G/V/...) and the legacy watch paths
// (/api/v1/watch/[namespaces/NS/]RESOURCE[/NAME]).
func listPath(watchPath, ns string) (string, error) {
	segs := strings.Split(strings.Trim(watchPath, "/"), "/")
	var prefix, rest []string
	switch {
	case len(segs) >= 3 && segs[0] == "api":
		prefix, rest = segs[:2], segs[2:]
	case len(segs) >= 4 && segs[0] == "apis":
		prefix, rest = segs[:3], segs[3:]
	default:
		return "", fmt.Errorf("not a resource path: %q", watchPath)
	}
	if rest[0] == "watch" {
		rest = rest[1:]
	}
	if len(rest) >= 3 && rest[0] == "namespaces" {
		rest = rest[2:]
	}
	if len(rest) == 0 || rest[0] == "" {
		return "", fmt.Errorf("no resource in path %q", watchPath)
	}
	p := "/" + strings.Join(prefix, "/") + "/"
	if ns != "" {
		p += "namespaces/" + ns + "/"
	}
	return p + rest[0], nil
}

// recorder is an http.ResponseWriter that keeps a bounded response in memory.
type recorder struct {
	h     http.Header
	code  int
	buf   bytes.Buffer
	limit int
}

func (r *recorder) Header() http.Header { return r.h }

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 && (code < 100 || code >= 200) {
		r.code = code
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if r.buf.Len()+len(p) > r.limit {
		return 0, fmt.Errorf("response larger than %d bytes", r.limit)
	}
	return r.buf.Write(p)
}

// serveRecovered runs h, turning the panic with which a handler aborts a response (an
// httputil.ReverseProxy does when the upstream breaks mid-body) into an error.
func serveRecovered(h http.Handler, w http.ResponseWriter, r *http.Request) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("upstream response aborted: %v", p)
		}
	}()
	h.ServeHTTP(w, r)
	return nil
}
