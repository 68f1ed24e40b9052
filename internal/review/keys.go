package review

import (
	"crypto/sha256"
	"encoding/json"
	"net/http"

	authorizationv1 "k8s.io/api/authorization/v1"

	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/upstream"
)

// key is a digest of the credentials and the review's attributes; CredKey one of the
// credentials alone.
type (
	key [sha256.Size]byte
	// CredKey is a digest of what names the identity a request goes as (CredentialsKey).
	CredKey [sha256.Size]byte
)

// NeedsReview says whether a watch with cred may share only after an access review: the
// client's own token, its verified certificate's identity asserted, or the lent identity
// impersonating another (reviewed as the impersonated one: the review goes with the same
// headers). The lent identity itself needs none (the lending guard decided who gets it);
// anonymous and undecided credentials never share (an anonymous review may be allowed where
// the anonymous watch is not: the apiserver's anonymous authenticator may be limited to some
// paths).
func NeedsReview(cred upstream.Credentials) bool {
	_, asserted := cred.Asserted()
	return asserted || cred.Own() || (cred.Lent() && cred.Impersonates())
}

// CredentialsKey is a digest of what names the identity a request with cred goes as, so two
// requests with the same key are the same user to the apiserver: the one principal key
// (upstream.Credentials.PrincipalKey) of r's headers.
func CredentialsKey(r *http.Request, cred upstream.Credentials) CredKey {
	return CredKey(cred.PrincipalKey(r.Header))
}

// Attributes are what the apiserver authorizes the watch r for: verb watch on its group,
// version, resource, subresource, namespace and name, with its label and field selectors (the
// apiserver authorizes selectors since 1.31; the Node authorizer lets a kubelet watch pods only
// with its own spec.nodeName).
func Attributes(r *http.Request, info *reqinfo.Info) *authorizationv1.ResourceAttributes {
	q := r.URL.Query()
	ra := &authorizationv1.ResourceAttributes{
		Verb: "watch", Group: info.APIGroup, Version: info.APIVersion, Resource: info.Resource,
		Subresource: info.Subresource, Namespace: info.Namespace, Name: info.Name,
	}
	if s := q.Get("labelSelector"); s != "" {
		ra.LabelSelector = &authorizationv1.LabelSelectorAttributes{RawSelector: s}
	}
	if s := q.Get("fieldSelector"); s != "" {
		ra.FieldSelector = &authorizationv1.FieldSelectorAttributes{RawSelector: s}
	}
	return ra
}

func (k CredKey) review(ra *authorizationv1.ResourceAttributes) key {
	h := sha256.New()
	h.Write(k[:])
	b, _ := json.Marshal(ra) // plain strings: never fails
	h.Write(b)
	var out key
	h.Sum(out[:0])
	return out
}
