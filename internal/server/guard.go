package server

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/apistatus"
	"github.com/watchsan/watchsan/internal/config"
	"github.com/watchsan/watchsan/internal/upstream"
)

// refusal is a request watchsan answers itself, before anything goes upstream: the Status
// the client gets and the reason it is counted under (metrics.RefusalReasons).
type refusal struct {
	status *metav1.Status
	reason string
}

// refuse decides whether r, whose credentials are cred (upstream.Decide), is refused. Every
// request is checked for what no apiserver client sends and a proxy must not pass on (issue
// #2, #8, 16):
//   - CONNECT and absolute-form targets: watchsan is not a forward proxy. Every absolute form
//     is refused, not only those naming another host: Go takes Host from an absolute target,
//     so the host cannot be told apart, and no Kubernetes client sends one to a server that is
//     not a proxy;
//   - dot segments in the path, raw or percent-encoded ("..", ".", "%2e%2e", "..%2f"): behind
//     an upstream with a path prefix (https://host/k8s/clusters/c1) they would climb out of it
//     with the client's or the lent credentials;
//   - a Connection header that names Authorization, Host or an identity header (Impersonate-*,
//     X-Remote-*, --strip-identity-headers): every hop removes the headers Connection names, so
//     the request upstream would not be the one decided on here (with `Authorization: junk`
//     and `Connection: Authorization` it went upstream without credentials of its own). No
//     client has a reason to send one.
//
// A request that asserts a verified client's identity (--identity-forwarding) may not ask to
// impersonate on top of it (kubectl --as): the apiserver would see watchsan's assertion, not
// the client's request, so the client is told instead of its Impersonate-* being dropped.
//
// A request that would get the lent identity (cred.Lent()) must also pass the lending guard,
// so that only programs on this machine that address it by a loopback name use the identity,
// as with kubectl proxy:
//   - its Host names an accepted host (--accept-hosts): a page whose DNS name was rebound to
//     127.0.0.1 sends its own name;
//   - it is no browser request from another origin: no CORS preflight, no Origin header that
//     names another origin than this listener's own (--accept-hosts, the listener's scheme and
//     port), no Sec-Fetch-Site: cross-site. A cross-origin WebSocket (exec) is not subject to
//     CORS, so only this check stops it;
//   - its method and path are not rejected (--reject-methods, --reject-paths).
func (g *guard) refuse(r *http.Request, cred upstream.Credentials) *refusal {
	switch {
	case r.Method == http.MethodConnect:
		return refused("connect", http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed,
			"watchsan: CONNECT is not supported; this is an apiserver proxy, not a forward proxy")
	case r.URL.IsAbs() || r.URL.Host != "":
		return refused("absolute_target", http.StatusBadRequest, metav1.StatusReasonBadRequest,
			fmt.Sprintf("watchsan: absolute request target for host %q refused; this is an apiserver proxy, not a forward proxy", clip(r.URL.Host)))
	case hasDotSegment(r.URL):
		return refused("dot_segment", http.StatusBadRequest, metav1.StatusReasonBadRequest,
			fmt.Sprintf("watchsan: path %q has a dot segment (., .., or either percent-encoded); no apiserver client sends one, and it could climb out of the upstream's path", clip(r.URL.EscapedPath())))
	}
	if name, ok := g.connectionNamesIdentity(r.Header); ok {
		return refused("connection_header", http.StatusBadRequest, metav1.StatusReasonBadRequest,
			fmt.Sprintf("watchsan: the Connection header names %q, which says who the request is for: a proxy removes the headers Connection names, so the request would not reach the apiserver as sent; send Connection with hop-by-hop names only (keep-alive, close, Upgrade)", clip(name)))
	}
	if _, ok := cred.Asserted(); ok {
		for k := range r.Header {
			if strings.HasPrefix(http.CanonicalHeaderKey(k), "Impersonate-") {
				return refused("impersonation", http.StatusForbidden, metav1.StatusReasonForbidden,
					fmt.Sprintf("watchsan: %s: impersonation (kubectl --as, --as-group) cannot be forwarded: --identity-forwarding asserts your client certificate's identity upstream, and an apiserver takes one identity per request; connect without it, or with a token of your own (which is forwarded as it is)", clip(k)))
			}
		}
	}
	if !g.On || !cred.Lent() {
		return nil
	}
	const own = "or send the request with credentials of its own"
	if host := config.HostForMatch(r.Host); r.Host == "" || !config.MatchAny(g.AcceptHosts, host) {
		return refused("host", http.StatusForbidden, metav1.StatusReasonForbidden,
			fmt.Sprintf("watchsan: Host %q is not accepted for a request that would get watchsan's identity (a web page whose name resolves to this machine sends its own name); accept it with --accept-hosts, %s", clip(r.Host), own))
	}
	if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
		return refused("cors_preflight", http.StatusForbidden, metav1.StatusReasonForbidden,
			"watchsan: CORS preflight refused: watchsan does not lend its identity to web pages of another origin; send the request with credentials of its own")
	}
	for _, o := range r.Header.Values("Origin") {
		if !sameOrigin(r, o, g.AcceptHosts) {
			return refused("origin", http.StatusForbidden, metav1.StatusReasonForbidden,
				fmt.Sprintf("watchsan: a browser request from origin %q would get watchsan's identity; only this listener's own origin (its scheme and port, a host --accept-hosts accepts) may, %s", clip(o), own))
		}
	}
	if strings.EqualFold(r.Header.Get("Sec-Fetch-Site"), "cross-site") {
		return refused("origin", http.StatusForbidden, metav1.StatusReasonForbidden,
			"watchsan: a cross-site browser request (Sec-Fetch-Site: cross-site) would get watchsan's identity; "+own)
	}
	if config.MatchAny(g.RejectMethods, r.Method) {
		return refused("method", http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed,
			fmt.Sprintf("watchsan: method %s is refused to requests that would get watchsan's identity (--reject-methods); %s", clip(r.Method), own))
	}
	if p := r.URL.Path; config.MatchAny(g.RejectPaths, p) || config.MatchAny(g.RejectPaths, path.Clean("/"+p)) {
		return refused("path", http.StatusForbidden, metav1.StatusReasonForbidden,
			fmt.Sprintf("watchsan: path %q is refused to requests that would get watchsan's identity (--reject-paths; set it without this path to allow it), %s", clip(p), own))
	}
	return nil
}

// guard is the configured lending guard.
type guard struct{ config.Guard }

// connectionNamesIdentity returns the first name in h's Connection header that carries who a
// request is for (upstream.CarriesIdentity) or is Host.
func (g *guard) connectionNamesIdentity(h http.Header) (string, bool) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			name = strings.TrimSpace(name)
			if strings.EqualFold(name, "Host") || upstream.CarriesIdentity(name, g.StripHeaders, g.StripPrefixes) {
				return name, true
			}
		}
	}
	return "", false
}

func refused(reason string, code int32, why metav1.StatusReason, msg string) *refusal {
	return &refusal{status: apistatus.New(code, why, msg), reason: reason}
}

// hasDotSegment reports a "." or ".." segment in u's decoded path, which is where the
// percent-encoded forms (%2e%2e, ..%2f, %2E) show as dots too.
func hasDotSegment(u *url.URL) bool {
	p := u.Path
	for p != "" {
		var seg string
		seg, p, _ = strings.Cut(p, "/")
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// sameOrigin reports whether origin (an Origin header's value) is the origin of the listener
// r came in on: its scheme (https when r came over TLS), a host accepted names, and the
// listener's own port, explicit or the scheme's default. A page of another port on this
// machine (a dev server at http://localhost:3000, a local web UI) is another origin, and
// could otherwise use the lent identity, over WebSocket too.
func sameOrigin(r *http.Request, origin string, accepted []*regexp.Regexp) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || !config.MatchAny(accepted, config.HostForMatch(u.Host)) {
		return false
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if !strings.EqualFold(u.Scheme, scheme) {
		return false
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	_, own, err := net.SplitHostPort(local.String())
	return err == nil && own == port
}

// clip keeps what a client sent short in a message.
func clip(s string) string {
	if len(s) > 128 {
		return s[:128] + "..."
	}
	return s
}
