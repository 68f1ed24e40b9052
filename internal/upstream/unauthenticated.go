package upstream

import (
	"net/http"
	"sync"
)

// Unauthenticated requests travel apart from everyone else's.
//
// kube-apiserver answers every request it does not authenticate, anonymous or refused with 401,
// on an HTTP/2 connection with "Connection: close", and Go's HTTP/2 server then ends that whole
// connection with a GOAWAY (UnauthenticatedHTTP2DOSMitigation, on by default since
// kubernetes#121120, the answer to CVE-2023-44487). Behind a proxy that one connection carries
// many clients' requests and watches (gardener#13405 turned the mitigation off for that reason):
// one anonymous request, or one with a stale token, would cost every other client a new
// connection, and any request racing the GOAWAY a replay. So watchsan sends such requests over
// connections of their own: nothing of theirs touches the connections authenticated clients
// share (docs/design.md section 10.5). They stay HTTP/2, each ended after its request as the
// apiserver decides (a handshake each, as direct): over HTTP/1.1, which the mitigation leaves
// alive, an unauthenticated watch whose client stops reading was bounded only by the kernel's
// socket buffer (about 2 MiB each, TestAttackNonReadingWatches), not by a stream window.
//
// Which requests: those with no credentials at all (credAnonymous, and watchsan's own when it
// lends nothing), known before sending; and those whose token was answered 401 last time
// (unauthenticated.refused), learned from the answers. A token's first 401 still comes over the
// shared connection: it cannot be known before the apiserver says so.

// maxRefusedPrincipals bounds the tokens remembered as answered 401. A client that makes up a
// new token for every request still gets each one's 401, over the shared connection (see above);
// forgetting a real stale token again when the set is full costs one more of those.
const maxRefusedPrincipals = 4096

// refusedSet is the principals (Credentials.Principal) whose last answer was a 401. Safe for
// concurrent use; the zero value is an empty set.
type refusedSet struct {
	mu sync.Mutex
	m  map[string]struct{}
}

func (s *refusedSet) has(p string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.m[p]
	return ok
}

// learn records what the apiserver answered a request of principal p: a 401 adds it, anything
// else removes it (a token the apiserver came to accept, e.g. a bootstrap token created after
// the node first tried it, goes back to the shared connections with its next request).
func (s *refusedSet) learn(p string, code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if code != http.StatusUnauthorized {
		delete(s.m, p)
		return
	}
	if s.m == nil {
		s.m = map[string]struct{}{}
	}
	if _, ok := s.m[p]; !ok && len(s.m) >= maxRefusedPrincipals {
		for k := range s.m { // any one: map order is random enough for a bound
			delete(s.m, k)
			break
		}
	}
	s.m[p] = struct{}{}
}

func (s *refusedSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// sendOwn sends a request with the client's own Authorization (credOwn, not an upgrade): over
// the unauthenticated connections when its token was refused last time, else over the shared
// ones, and learns from the answer which it takes next time.
func (t *transports) sendOwn(req *http.Request, cred Credentials) (*http.Response, error) {
	rt := t.forward
	if t.refused.has(cred.principal) {
		rt = t.unauth
	}
	resp, err := rt.RoundTrip(req)
	if err == nil {
		t.refused.learn(cred.principal, resp.StatusCode)
	}
	return resp, err
}
