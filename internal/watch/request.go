package watch

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

type cancelKey struct{}

// cancelOf returns the cancel function stored in an attempt's request context (nil if none).
func cancelOf(resp *http.Response) context.CancelCauseFunc {
	c, _ := resp.Request.Context().Value(cancelKey{}).(context.CancelCauseFunc)
	return c
}

// upstreamRequest builds an upstream attempt of the client's watch, from rv. The client's
// request is never modified. The first attempt keeps the client's parameters; a resume is a
// plain watch from rv (the initial phase is over). Both ask for bookmarks (stall detection and
// resume points) and for identity encoding (watchsan parses the stream).
func (s *session) upstreamRequest(rv string, first bool) *http.Request {
	q := s.client.URL.Query()
	q.Set("allowWatchBookmarks", "true")
	if !first {
		q.Set("resourceVersion", rv)
		q.Del("sendInitialEvents")
		q.Del("resourceVersionMatch")
	}
	if !s.deadline.IsZero() {
		left := time.Until(s.deadline).Seconds()
		q.Set("timeoutSeconds", strconv.Itoa(max(1, int(left+0.999))))
	}
	u := &url.URL{Path: s.client.URL.Path, RawPath: s.client.URL.RawPath, RawQuery: q.Encode()}
	ctx, cancel := context.WithCancelCause(s.ctx)
	out := s.client.Clone(context.WithValue(ctx, cancelKey{}, cancel))
	out.URL = u
	out.RequestURI = ""
	out.Host = ""
	out.Body = nil
	out.ContentLength = 0
	out.Header = make(http.Header, len(s.client.Header))
	copyHeader(out.Header, s.client.Header)
	out.Header.Del("Accept-Encoding")
	prior := s.client.Header.Values("X-Forwarded-For")
	out.Header.Del("X-Forwarded-For")
	for _, v := range prior {
		out.Header.Add("X-Forwarded-For", v)
	}
	out.Header.Add("X-Forwarded-For", forwardedFor(s.client))
	return out
}
