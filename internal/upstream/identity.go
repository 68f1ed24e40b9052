package upstream

import (
	"crypto/tls"
	"fmt"
	"net/http"
)

// IdentityMode is how watchsan asserts the identity of a client it verified by certificate
// (--identity-forwarding, issue 8). The zero value asserts nothing.
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

// Asserts reports the identity watchsan asserts upstream for a request with header h and
// client connection cs: one with a verified client certificate and no Authorization of its
// own. A bearer token always passes unchanged with nothing asserted, certificate or not (the
// apiserver authenticates the token). The one rule for every path: Backend.send decides by it,
// and the server's pass-through and watch requests carry the client's connection state
// (Request.TLS, kept by Request.Clone) to it.
func Asserts(h http.Header, cs *tls.ConnectionState) (Identity, bool) {
	if !Lends(h) {
		return Identity{}, false
	}
	return ClientIdentity(cs)
}

// assertIdentity wraps rt, which sends with the credentials of mode (watchsan's own identity,
// or its front-proxy certificate), so that every request carries exactly the identity of its
// client's verified certificate: every client-sent identity header (assertedPrefixes and the
// --strip-identity-headers names) is removed, then watchsan's own are set. A request without
// such an identity is refused here, never sent with watchsan's credentials alone.
func assertIdentity(rt http.RoundTripper, mode IdentityMode, names, prefixes []string) http.RoundTripper {
	prefixes = append(append([]string(nil), prefixes...), assertedPrefixes...)
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		id, ok := Asserts(req.Header, req.TLS)
		if !ok {
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
	})
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
