package watch

import (
	"net/http"
	"net/url"
	"strconv"

	"github.com/watchsan/watchsan/internal/upstream"
)

// upstreamRequest builds the template of an upstream attempt of the client's watch (the
// Attempter targets and sends it). The client's request is never modified. The first attempt
// keeps the client's parameters; a resume is a plain watch from the resume point (the initial
// phase is over). Both ask for bookmarks (stall detection and resume points) and for identity
// encoding (watchsan parses the stream). Forwarding headers are built as on every other path.
func (f *feed) upstreamRequest(first bool) *http.Request {
	rv := ""
	if !first {
		rv = f.sub.LastDelivered()
	}
	return f.requestFrom(first, rv)
}

// requestFrom is upstreamRequest for a resume from rv (when not first); it reads only what
// does not change during the feed's life, so a move's goroutine may call it.
func (f *feed) requestFrom(first bool, rv string) *http.Request {
	return f.requestWith(f.queryFrom(first, rv))
}

// queryFrom is the query of requestFrom(first, rv): the client's, copied (params.query).
func (f *feed) queryFrom(first bool, rv string) url.Values {
	q := copyQuery(f.query)
	q.Set("allowWatchBookmarks", "true")
	if !first {
		q.Set("resourceVersion", rv)
		q.Del("sendInitialEvents")
		q.Del("resourceVersionMatch")
	}
	if !f.deadline.IsZero() && (!first || f.timeout > 0) { // a negative one goes as sent
		left := f.deadline.Sub(f.h.clk.Now()).Seconds()
		q.Set("timeoutSeconds", strconv.Itoa(max(1, int(left+0.999))))
	}
	return q
}

// requestWith is the template of an upstream attempt of the client's watch with the query q.
func (f *feed) requestWith(q url.Values) *http.Request {
	// A shallow copy, not a Clone: its URL and Header are replaced, and the Attempter clones
	// the template anyway for each backend it sends it to, so a deep copy here was garbage.
	out := f.client.WithContext(f.ctx)
	out.URL = &url.URL{Path: f.client.URL.Path, RawPath: f.client.URL.RawPath, RawQuery: q.Encode()}
	out.RequestURI = ""
	out.Host = ""
	out.Body = nil
	out.ContentLength = 0
	out.Header = make(http.Header, len(f.client.Header))
	upstream.CopyEndToEnd(out.Header, f.client.Header)
	out.Header.Del("Accept-Encoding")
	upstream.SetForwarded(out, f.client)
	return out
}
