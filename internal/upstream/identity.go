package upstream

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net/http"
	"sort"
	"strings"
)

// IdentityMode is how watchsan asserts the identity of a client it verified by certificate
// (--identity-forwarding). The zero value asserts nothing.
type IdentityMode int

const (
	// IdentityOff: a client certificate says nothing upstream; requests go with the client's
	// Authorization, the lent identity, or anonymous.
	IdentityOff IdentityMode = iota
	// IdentityImpersonate: watchsan's own credentials (the kubeconfig's) with Impersonate-User
	// and Impersonate-Group. Its identity needs the impersonate verb on users and groups.
	IdentityImpersonate
	// IdentityRequestHeader: the apiserver's front-proxy scheme. watchsan presents its
	// front-proxy client certificate (trusted by the apiserver's --requestheader-client-ca-file)
	// and nothing else, and sends X-Remote-User and X-Remote-Group.
	IdentityRequestHeader
)

// The headers watchsan asserts an identity with. The request-header names are kubeadm's and the
// documentation's (--requestheader-username-headers=X-Remote-User,
// --requestheader-group-headers=X-Remote-Group, --requestheader-extra-headers-prefix=X-Remote-Extra-).
const (
	HeaderImpersonateUser  = "Impersonate-User"
	HeaderImpersonateGroup = "Impersonate-Group"
	HeaderRemoteUser       = "X-Remote-User"
	HeaderRemoteGroup      = "X-Remote-Group"
)

// assertedPrefixes are removed from every request on which watchsan asserts an identity,
// whatever the mode: every impersonation header (-User, -Group, -Uid, -Extra-*) and every
// request header of the front-proxy scheme. A client never adds to the identity watchsan
// asserts: an Impersonate-Group of its own would be added to the impersonated user's groups,
// an X-Remote-Group to the front proxy's assertion.
var assertedPrefixes = []string{"Impersonate-", "X-Remote-"}

// Identity is a client's identity as its verified certificate states it, by the Kubernetes x509
// convention (k8s.io/apiserver/pkg/authentication/request/x509.CommonNameUserConversion): the
// user is the subject's CommonName, the groups its Organizations.
type Identity struct {
	// User is the subject's CommonName; never empty in an Identity ClientIdentity returns.
	User string
	// Groups are the subject's Organizations; empty: none (the apiserver still adds
	// system:authenticated).
	Groups []string
}

// ClientIdentity returns the identity of the verified client certificate of cs, if there is
// one: the TLS listener verified it against --client-ca-file (VerifiedChains is set only then).
// A certificate without a CommonName names nobody (the apiserver's x509 authenticator refuses
// it the same way), so it gives no identity.
func ClientIdentity(cs *tls.ConnectionState) (Identity, bool) {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return Identity{}, false
	}
	leaf := cs.VerifiedChains[0][0]
	if leaf.Subject.CommonName == "" {
		return Identity{}, false
	}
	return Identity{User: leaf.Subject.CommonName, Groups: append([]string(nil), leaf.Subject.Organization...)}, true
}

// Credentials is whose credentials one request goes upstream with. It is decided once per
// request, by Decide, on the request as the client sent it, before anything removes a header,
// and it travels to the transport as a value (Plan.Credentials, Backend.Send), which routes by
// it alone: nothing downstream looks at the request's headers to decide again. (the
// guard let a request with `Authorization: junk` and `Connection: Authorization` pass, as the
// client's own; the hop-by-hop removal then deleted the header, and the transport, deciding
// again on what was left, lent watchsan's identity to it.) The zero value sends a request with
// only what it carries, never lent or asserted: a path that forgot to decide cannot hand out
// watchsan's identity.
type Credentials struct {
	how credHow
	// identity is the verified certificate's, when how is credAsserted.
	identity Identity
	// principal names who the upstream takes the request for (Principal).
	principal string
	// impersonates: a lent or own request that carries Impersonate-* headers, so the
	// apiserver answers it as the impersonated identity (Impersonates).
	impersonates bool
}

type credHow uint8

const (
	// credUndecided: as credOwn or credAnonymous, whichever the request is.
	credUndecided credHow = iota
	// credOwn: the client's own Authorization, forwarded as sent, on a connection that does not
	// present watchsan's client certificate.
	credOwn
	// credAnonymous: no Authorization, nothing lent or asserted.
	credAnonymous
	// credLent: watchsan's identity (the kubeconfig's), the identity headers stripped.
	credLent
	// credAsserted: the identity of the client's verified certificate (IdentityMode).
	credAsserted
	// credSelf: a request of watchsan's own (health probes, discovery): its identity when it
	// lends one, else none.
	credSelf
)

// Self is what watchsan's own requests (discovery) go with: the lent identity when there is
// one, else none.
var Self = Credentials{how: credSelf, principal: "self"}

// Decide is the one rule for whose credentials a client's request goes with, given whether
// watchsan lends its identity and how it asserts a verified client's (mode):
//   - with an Authorization header of its own (any, even empty), its own: the apiserver
//     authenticates the token, and a verified certificate besides changes nothing;
//   - else, with a certificate the listener verified (cs; a CommonName) and mode not
//     IdentityOff, that certificate's identity, asserted (docs/design.md section 8);
//   - else the lent identity when lend, else none.
//
// h and cs are the request as the client sent it (Request.Header, Request.TLS).
func Decide(h http.Header, cs *tls.ConnectionState, lend bool, mode IdentityMode) Credentials {
	if own := h.Values("Authorization"); len(own) > 0 {
		sum := sha256.Sum256([]byte(strings.Join(own, "\x00")))
		c := Credentials{how: credOwn, principal: "token:" + hex.EncodeToString(sum[:12])}
		if imp, ok := impersonation(h); ok { // the token's user asks to be another
			c.principal += ":as:" + imp
			c.impersonates = true
		}
		return c
	}
	if mode != IdentityOff {
		if id, ok := ClientIdentity(cs); ok {
			sum := sha256.Sum256([]byte(id.User + "\x00" + strings.Join(id.Groups, "\x00")))
			return Credentials{how: credAsserted, identity: id, principal: "cert:" + hex.EncodeToString(sum[:12])}
		}
	}
	if lend {
		if imp, ok := impersonation(h); ok {
			return Credentials{how: credLent, principal: "lent-as:" + imp, impersonates: true}
		}
		return Credentials{how: credLent, principal: "lent"}
	}
	return Credentials{how: credAnonymous, principal: "anonymous"}
}

// impersonation is a digest of the Impersonate-* headers of h in a canonical form (names
// canonical and sorted, each group list sorted: the apiserver takes groups as a set; user, uid
// and extra values as sent), and whether there is any. The lent identity sends them on
// (--strip-identity-headers removes only X-Remote-* by default), so the apiserver answers
// such a request as the impersonated user, groups, uid and extra together: every one of them
// is part of who it is (docs/design.md section 11, "Who shares with whom").
func impersonation(h http.Header) (string, bool) {
	var names []string
	for k := range h {
		if strings.HasPrefix(http.CanonicalHeaderKey(k), "Impersonate-") {
			names = append(names, k)
		}
	}
	if len(names) == 0 {
		return "", false
	}
	sort.Strings(names) // a non-canonical spelling beside the canonical one merges in one order
	canon := make(map[string][]string, len(names))
	keys := make([]string, 0, len(names))
	for _, k := range names {
		ck := http.CanonicalHeaderKey(k)
		if _, seen := canon[ck]; !seen {
			keys = append(keys, ck)
		}
		canon[ck] = append(canon[ck], h[k]...)
	}
	sort.Strings(keys)
	sum := sha256.New()
	for _, k := range keys {
		v := canon[k]
		if k == HeaderImpersonateGroup {
			v = append([]string(nil), v...)
			sort.Strings(v)
		}
		fmt.Fprintf(sum, "%s:%q\x00", k, v)
	}
	return hex.EncodeToString(sum.Sum(nil)[:12]), true
}

// Lent reports whether the request gets watchsan's own identity (the lending guard applies),
// with or without an impersonation of its own (Impersonates).
func (c Credentials) Lent() bool { return c.how == credLent }

// Impersonates reports whether a lent request, or one with the client's own token,
// impersonates (Impersonate-* headers): the apiserver answers it as another identity than the
// lent one or the token's, so it is never the same principal as the same request without
// them, and is authorized as the impersonated one.
func (c Credentials) Impersonates() bool { return c.impersonates }

// Anonymous reports whether the request goes with no credentials at all: none of its own,
// none lent, none asserted.
func (c Credentials) Anonymous() bool { return c.how == credAnonymous }

// Own reports whether the request goes with the client's own Authorization, as sent.
func (c Credentials) Own() bool { return c.how == credOwn }

// Asserted returns the client identity asserted upstream, if the request asserts one.
func (c Credentials) Asserted() (Identity, bool) { return c.identity, c.how == credAsserted }

// Principal names who the upstream takes the request for: "lent", "anonymous", "self", or a
// digest of the client's token ("token:...", with ":as:..." when it impersonates), of its
// certificate's identity ("cert:...") or of a lent request's impersonation ("lent-as:...");
// never a credential itself; "" for the zero value. Two requests with the same Principal are the
// same user to the apiserver (the delete memory's scope).
func (c Credentials) Principal() string { return c.principal }

// String names the kind of credentials for logs: own, anonymous, lent, asserted, self.
func (c Credentials) String() string {
	return [...]string{"as-sent", "own", "anonymous", "lent", "asserted", "self"}[c.how]
}

// asserter sends a request that asserts the client identity id.
type asserter func(req *http.Request, id Identity) (*http.Response, error)

// assertIdentity wraps rt, which sends with the credentials of mode (watchsan's own identity,
// or its front-proxy certificate), so that every request carries exactly the identity given
// (Credentials.Asserted): every client-sent identity header (assertedPrefixes and the
// --strip-identity-headers names) is removed, then watchsan's own are set.
func assertIdentity(rt http.RoundTripper, mode IdentityMode, names, prefixes []string) asserter {
	prefixes = append(append([]string(nil), prefixes...), assertedPrefixes...)
	return func(req *http.Request, id Identity) (*http.Response, error) {
		if id.User == "" {
			return nil, fmt.Errorf("watchsan: no verified client identity to assert (a bug: this transport is only for requests that have one)")
		}
		out := *req // a shallow copy: the caller's request and headers stay as they are
		out.Header = make(http.Header, len(req.Header)+1+len(id.Groups))
		for k, v := range req.Header {
			if !identityHeader(k, names, prefixes) {
				out.Header[k] = v
			}
		}
		user, group := HeaderImpersonateUser, HeaderImpersonateGroup
		if mode == IdentityRequestHeader {
			user, group = HeaderRemoteUser, HeaderRemoteGroup
		}
		out.Header[user] = []string{id.User}
		if len(id.Groups) > 0 {
			out.Header[group] = append([]string(nil), id.Groups...)
		}
		return rt.RoundTrip(&out)
	}
}

// CarriesIdentity reports whether a header named k says who a request is for upstream:
// Authorization, an impersonation or front-proxy header (AssertsIdentity), or one of the
// --strip-identity-headers names (canonical) and prefixes.
func CarriesIdentity(k string, names, prefixes []string) bool {
	k = http.CanonicalHeaderKey(k)
	return k == "Authorization" || identityHeader(k, names, prefixes) || AssertsIdentity(k)
}

// AssertsIdentity reports whether a header named k asserts an identity of its own besides the
// credentials: an impersonation header (Impersonate-User, -Group, -Uid, -Extra-*) or a
// front-proxy one (X-Remote-*).
func AssertsIdentity(k string) bool { return identityHeader(k, nil, assertedPrefixes) }

// PrincipalKey is a digest of who a request goes upstream as (Credentials.PrincipalKey).
type PrincipalKey [sha256.Size]byte

// PrincipalKey is the one digest of who a request with c and the headers h is to the
// apiserver: everything that decides its answer (docs/design.md section 11, "Who shares with
// whom"): c's kind and principal, an asserted identity's user and groups, and, as sent, every
// header that may carry an identity upstream (CarriesIdentity without the
// --strip-identity-headers names: Authorization, every Impersonate-* header with -Uid and
// -Extra-*, every X-Remote-*; the transport strips some of them where it lends or asserts an
// identity, and a key that holds more than decides is only one that shares less). Two
// requests with the same key are the same user to the apiserver. h is the request's headers
// as the client sent them (as Decide's). The access reviews' cache (review.CredentialsKey) and
// the coalesced reads (coalesce.Classify) key on it; it is kept in memory only, never logged.
func (c Credentials) PrincipalKey(h http.Header) PrincipalKey {
	sum := sha256.New()
	fmt.Fprintf(sum, "%s\x00%s\x00", c.String(), c.principal)
	if id, ok := c.Asserted(); ok {
		fmt.Fprintf(sum, "%q\x00%q\x00", id.User, id.Groups)
	}
	names := make([]string, 0, 2)
	for k := range h {
		if CarriesIdentity(k, nil, nil) {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(sum, "%s:%q\x00", k, h[k])
	}
	var out PrincipalKey
	sum.Sum(out[:0])
	return out
}

// String names the mode as --identity-forwarding does.
func (m IdentityMode) String() string {
	switch m {
	case IdentityImpersonate:
		return "impersonate"
	case IdentityRequestHeader:
		return "requestheader"
	}
	return ""
}
