package coalesce

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"

	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/upstream"
)

// The kinds of reads that coalesce (the kind label of the watchsan_coalesce_* metrics).
const (
	KindList      = "list"      // a resource list at resourceVersion "" or "0", or a continue page
	KindDiscovery = "discovery" // /api, /apis and their group and version documents
	KindOpenAPI   = "openapi"   // /openapi/v2, /openapi/v3 and its documents
)

// Kinds lists the kind label's values (to initialise series).
var Kinds = []string{KindList, KindDiscovery, KindOpenAPI}

// Key names the reads that may share one upstream read: a digest of the request's kind, path,
// query (canonical), the headers that shape the answer, and everything that names whom the
// apiserver takes it for. Two requests with the same Key are the same request of the same
// principal (docs/design.md section 18).
type Key [sha256.Size]byte

// keyHeaders are the request headers that go into the Key besides the principal's
// (upstream.Credentials.PrincipalKey, which holds every header that may carry an identity
// upstream): the ones that shape the answer (its format, its compression, a conditional GET).
// A request with a header neither here, nor the principal's, nor in ignoredHeaders is not
// coalesced.
var keyHeaders = map[string]bool{"Accept": true, "Accept-Encoding": true, "If-None-Match": true}

// ignoredHeaders change nothing in what the apiserver answers to a read: who is calling
// (User-Agent, kubectl's own), tracing and request ids, the forwarding chain, and the
// connection's own (hop-by-hop) headers. The upstream read carries the first member's.
var ignoredHeaders = map[string]bool{
	"User-Agent": true, "X-Request-Id": true, "Audit-Id": true, "Traceparent": true, "Tracestate": true,
	"Kubectl-Command": true, "Kubectl-Session": true,
	"Forwarded": true, "X-Forwarded-For": true, "X-Forwarded-Host": true, "X-Forwarded-Proto": true,
	"Connection": true, "Keep-Alive": true, "Te": true, "Proxy-Connection": true,
}

// listParams are the query parameters a coalesced list may carry; any other (a watch, a
// watch-list's sendInitialEvents, pretty) leaves it alone.
var listParams = map[string]bool{"resourceVersion": true, "resourceVersionMatch": true, "limit": true,
	"continue": true, "labelSelector": true, "fieldSelector": true, "timeoutSeconds": true, "timeout": true}

// Classify says whether r, classified as info and going upstream with cred, may share an
// upstream read with others, of which kind, under which key. Only GETs without a body of a
// principal (never anonymous, never undecided credentials) that are a list at resourceVersion
// "" or "0" (or a continue page), or a discovery or OpenAPI document, with only recognised
// parameters and headers; nothing else.
func Classify(r *http.Request, info *reqinfo.Info, cred upstream.Credentials) (Key, string, bool) {
	if r.Method != http.MethodGet || cred.Anonymous() || cred.Principal() == "" || upstream.IsUpgrade(r.Header) ||
		(r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0) || r.URL == nil {
		return Key{}, "", false
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return Key{}, "", false
	}
	for _, v := range q {
		if len(v) != 1 {
			return Key{}, "", false // a parameter given twice: the apiserver takes the first; not worth reasoning about
		}
	}
	kind := ""
	switch {
	case info.IsResourceRequest:
		if info.Verb != "list" || info.Subresource != "" || !listReadable(q) {
			return Key{}, "", false
		}
		kind = KindList
	default:
		kind = documentKind(r.URL.Path, q)
		if kind == "" {
			return Key{}, "", false
		}
	}
	for k := range r.Header {
		ck := http.CanonicalHeaderKey(k)
		if !ignoredHeaders[ck] && !keyHeaders[ck] && !upstream.CarriesIdentity(ck, nil, nil) {
			return Key{}, "", false // unrecognised: it may change the answer
		}
	}
	return digest(r, kind, q, &cred), kind, true
}

// ReviewedKey is the key under which r, a list Classify found coalescable, may share an
// upstream read with other principals' identical lists, once an access review with its own
// credentials allowed each of them that list: its kind, path, query and answer-shaping headers,
// none of its credentials. Only for lists of group-versions the apiserver serves itself (the
// caller's to know), whose answer is the same for every identity allowed it; false for a
// request that impersonates or asserts anything of its own (Impersonate-*, X-Remote-*), which
// only ever shares with its own principal.
func ReviewedKey(r *http.Request, kind string) (Key, bool) {
	if kind != KindList {
		return Key{}, false
	}
	for k := range r.Header {
		if upstream.AssertsIdentity(k) {
			return Key{}, false
		}
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return Key{}, false
	}
	return digest(r, kind, q, nil), true
}

// digest is the key of r of kind with query q: of cred's principal key
// (upstream.Credentials.PrincipalKey) when cred is given, of "reviewed" instead when not, and
// of the headers that shape the answer.
func digest(r *http.Request, kind string, q url.Values, cred *upstream.Credentials) Key {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00", kind, r.URL.EscapedPath(), q.Encode())
	if cred == nil {
		fmt.Fprintf(h, "reviewed\x00")
	} else {
		pk := cred.PrincipalKey(r.Header)
		fmt.Fprintf(h, "as\x00%x\x00", pk[:])
	}
	names := make([]string, 0, len(r.Header))
	for k := range r.Header {
		ck := http.CanonicalHeaderKey(k)
		if ignoredHeaders[ck] || upstream.CarriesIdentity(ck, nil, nil) { // the principal's, in its key
			continue
		}
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(h, "%s:%q\x00", k, r.Header[k])
	}
	var out Key
	h.Sum(out[:0])
	return out
}

// Snapshot says whether the answer to r, a read Classify found coalescable, is the same
// whenever the apiserver reads it: a continue page, the next page of the snapshot its token
// names (or 410 Expired once that revision is compacted, which stays so). Such a read may be
// joined after it began (docs/design.md section 18).
func Snapshot(r *http.Request) bool {
	q, err := url.ParseQuery(r.URL.RawQuery)
	return err == nil && q.Get("continue") != ""
}

// listReadable says whether a list's query asks for a state whose every answer a later read
// may give: resourceVersion "" (the newest state: a consistent read) or "0" (any state not
// older than what the apiserver has, resourceVersionMatch NotOlderThan allowed with it), or a
// continue token (the snapshot the token names), with only listParams.
func listReadable(q url.Values) bool {
	for k := range q {
		if !listParams[k] {
			return false
		}
	}
	rv, match, cont := q.Get("resourceVersion"), q.Get("resourceVersionMatch"), q.Get("continue")
	switch {
	case cont != "":
		return rv == "" && match == ""
	case rv == "":
		return match == ""
	case rv == "0":
		return match == "" || match == "NotOlderThan"
	}
	return false
}

// documentKind is the kind of a discovery or OpenAPI document's path, with its query; "" for
// anything else. Discovery: /api, /api/VERSION, /apis, /apis/GROUP, /apis/GROUP/VERSION (the
// aggregated form of /api and /apis is the same path with another Accept, which is in the
// key). OpenAPI: /openapi/v2, /openapi/v3 and /openapi/v3/... with at most its hash parameter.
func documentKind(path string, q url.Values) string {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	for _, s := range segs {
		if s == "" || s == "." || s == ".." {
			return ""
		}
	}
	kind := ""
	switch {
	case segs[0] == "api" && len(segs) <= 2, segs[0] == "apis" && len(segs) <= 3:
		kind = KindDiscovery
	case len(segs) == 2 && segs[0] == "openapi" && segs[1] == "v2", len(segs) >= 2 && segs[0] == "openapi" && segs[1] == "v3":
		kind = KindOpenAPI
	default:
		return ""
	}
	for k := range q {
		if k != "timeout" && !(k == "hash" && kind == KindOpenAPI && segs[1] == "v3") {
			return ""
		}
	}
	return kind
}
