package upstream

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

// verified is the connection state of a client whose certificate for user and groups the
// listener verified.
func verified(user string, groups ...string) *tls.ConnectionState {
	leaf := &x509.Certificate{Subject: pkix.Name{CommonName: user, Organization: groups}}
	return &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}, VerifiedChains: [][]*x509.Certificate{{leaf}}}
}

// forgeAll sets every identity header a client might try to choose its identity with.
func forgeAll(h http.Header) {
	h.Set("Impersonate-User", "system:admin")
	h.Add("Impersonate-Group", "system:masters")
	h.Set("Impersonate-Uid", "0")
	h.Set("Impersonate-Extra-Scopes", "all")
	h["impersonate-group"] = append(h["impersonate-group"], "system:masters") // non-canonical
	h.Set("X-Remote-User", "system:admin")
	h.Add("X-Remote-Group", "system:masters")
	h.Set("X-Remote-Extra-Scopes", "all")
	h.Set("X-Auth-User", "admin")
}

func identityHeaders(h http.Header) map[string][]string {
	out := map[string][]string{}
	for k, v := range h {
		ck := http.CanonicalHeaderKey(k)
		if strings.HasPrefix(ck, "Impersonate-") || strings.HasPrefix(ck, "X-Remote-") || ck == "X-Auth-User" {
			out[ck] = append(out[ck], v...)
		}
	}
	return out
}

// TestAttackIdentityAsserted: with identity forwarding, a request with a verified client
// certificate and no token goes upstream with exactly the certificate's user and groups, in
// either mode, on plain requests and upgrades alike; whatever identity headers the client
// forged are gone. A bearer token passes unchanged (forged headers too: the apiserver judges
// them against the token's user), and a request with neither is anonymous, never lent.
func TestAttackIdentityAsserted(t *testing.T) {
	u := newUpgradeUpstream(t)
	fpCertPEM, fpKeyPEM := clientCertPEM(t)
	fp, err := tls.X509KeyPair(fpCertPEM, fpKeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode        IdentityMode
		user, group string
		// the credentials of an asserted request: a token, a client certificate
		auth  string
		certs int
	}{
		{IdentityImpersonate, HeaderImpersonateUser, HeaderImpersonateGroup, "Bearer lent-token", 1},
		{IdentityRequestHeader, HeaderRemoteUser, HeaderRemoteGroup, "", 1},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			o := TransportOptions{Identity: tc.mode, StripHeaders: []string{"X-Auth-User"}}
			cert, key := clientCertPEM(t)
			o.Credentials = &rest.Config{Host: u.URL, BearerToken: "lent-token",
				TLSClientConfig: rest.TLSClientConfig{CAData: u.caPEM(), CertData: cert, KeyData: key}}
			if tc.mode == IdentityRequestHeader {
				o.FrontProxyCert = &fp
			}
			b := newPool(t, PoolOptions{Transport: o}, u.URL).Backends()[0]

			get, _ := http.NewRequest(http.MethodGet, b.Target(&url.URL{Path: "/api/v1/secrets"}).String(), nil)
			up := upgradeRequest(t, b, "SPDY/3.1", "")
			for _, req := range []*http.Request{get, up} {
				forgeAll(req.Header)
				req.TLS = verified("alice", "team-a", "team-b")
				resp, err := sendDecided(b, req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				s := u.last(t)
				if s.auth != tc.auth || s.certs != tc.certs {
					t.Fatalf("%s: auth %q certs %d, want %q and %d", req.Method, s.auth, s.certs, tc.auth, tc.certs)
				}
				want := map[string][]string{tc.user: {"alice"}, tc.group: {"team-a", "team-b"}}
				if got := identityHeaders(s.header); !equalHeaders(got, want) {
					t.Fatalf("%s: identity headers upstream %v, want exactly %v", req.Method, got, want)
				}
				if req.Header.Get("Impersonate-User") != "system:admin" {
					t.Fatal("the caller's request was modified")
				}
			}

			// A bearer token: unchanged, with nothing asserted and no certificate of watchsan's.
			own, _ := http.NewRequest(http.MethodGet, b.Target(&url.URL{Path: "/api/v1/secrets"}).String(), nil)
			own.Header.Set("Authorization", "Bearer own")
			own.Header.Set("Impersonate-User", "bob")
			own.TLS = verified("alice")
			resp, err := sendDecided(b, own)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if s := u.last(t); s.auth != "Bearer own" || s.certs != 0 || !equalHeaders(identityHeaders(s.header), map[string][]string{"Impersonate-User": {"bob"}}) {
				t.Fatalf("own token: auth %q certs %d headers %v, want it unchanged", s.auth, s.certs, identityHeaders(s.header))
			}

			// Neither: anonymous, never watchsan's own identity.
			for _, cs := range []*tls.ConnectionState{nil, {}, verified("")} {
				anon, _ := http.NewRequest(http.MethodGet, b.Target(&url.URL{Path: "/api/v1/secrets"}).String(), nil)
				anon.TLS = cs
				resp, err := sendDecided(b, anon)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if s := u.last(t); s.auth != "" || s.certs != 0 || len(identityHeaders(s.header)) != 0 {
					t.Fatalf("no verified identity: auth %q certs %d headers %v, want anonymous", s.auth, s.certs, identityHeaders(s.header))
				}
			}
		})
	}
}

func equalHeaders(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// TestDecideLentImpersonation: a lent request that impersonates is its own principal, one per
// impersonated identity (user, groups as a set, uid, extra), never the plain lent one; the same
// impersonation spelled in another case or group order is the same principal.
func TestDecideLentImpersonation(t *testing.T) {
	decide := func(kv ...string) Credentials {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h[kv[i]] = append(h[kv[i]], kv[i+1])
		}
		return Decide(h, nil, true, IdentityOff)
	}
	plain := decide()
	if plain.Principal() != "lent" || plain.Impersonates() || !plain.Lent() {
		t.Fatalf("no impersonation: %q impersonates=%v lent=%v, want the plain lent principal", plain.Principal(), plain.Impersonates(), plain.Lent())
	}
	alice := decide("Impersonate-User", "alice", "Impersonate-Group", "a", "Impersonate-Group", "b")
	if !alice.Lent() || !alice.Impersonates() || !strings.HasPrefix(alice.Principal(), "lent-as:") {
		t.Fatalf("impersonating: %q impersonates=%v lent=%v", alice.Principal(), alice.Impersonates(), alice.Lent())
	}
	same := decide("impersonate-user", "alice", "Impersonate-Group", "b", "Impersonate-Group", "a")
	if same.Principal() != alice.Principal() {
		t.Errorf("the same impersonation spelled otherwise: %q, want %q", same.Principal(), alice.Principal())
	}
	for name, other := range map[string]Credentials{
		"group only":    decide("Impersonate-Group", "a"),
		"other user":    decide("Impersonate-User", "bob", "Impersonate-Group", "a", "Impersonate-Group", "b"),
		"other groups":  decide("Impersonate-User", "alice", "Impersonate-Group", "a"),
		"with uid":      decide("Impersonate-User", "alice", "Impersonate-Group", "a", "Impersonate-Group", "b", "Impersonate-Uid", "1"),
		"with extra":    decide("Impersonate-User", "alice", "Impersonate-Group", "a", "Impersonate-Group", "b", "Impersonate-Extra-Scopes", "x"),
		"a group split": decide("Impersonate-User", "alice", "Impersonate-Group", "a, b"),
	} {
		if other.Principal() == alice.Principal() || other.Principal() == plain.Principal() {
			t.Errorf("%s: principal %q shared with another identity", name, other.Principal())
		}
	}
	if c := Decide(http.Header{"Impersonate-User": {"alice"}}, nil, false, IdentityOff); !c.Anonymous() || c.Impersonates() {
		t.Errorf("no token, nothing lent: anonymous=%v impersonates=%v, want an anonymous request", c.Anonymous(), c.Impersonates())
	}
	if plain.Anonymous() || alice.Anonymous() {
		t.Error("a lent request counted anonymous")
	}
	// A token of its own stays the client's own, and impersonating makes it another principal.
	tok := Decide(http.Header{"Authorization": {"Bearer x"}}, nil, true, IdentityOff)
	c := Decide(http.Header{"Authorization": {"Bearer x"}, "Impersonate-User": {"alice"}}, nil, true, IdentityOff)
	if !c.Own() || c.Lent() || !c.Impersonates() || c.Principal() == tok.Principal() || !strings.HasPrefix(c.Principal(), tok.Principal()+":as:") {
		t.Errorf("own token with impersonation: own=%v lent=%v impersonates=%v principal %q (the token alone: %q)",
			c.Own(), c.Lent(), c.Impersonates(), c.Principal(), tok.Principal())
	}
}

// The one principal key (PrincipalKey, what the access reviews' cache and the coalesced reads
// key on) changes with every header that decides whom the apiserver takes a request for
// (docs/design.md section 11: the credentials, every Impersonate-* header with -Uid and
// -Extra-*, the front-proxy's X-Remote-*), with the credentials' kind and an asserted
// certificate's identity, and with nothing else.
func TestPrincipalKeyIsWhoTheClientIs(t *testing.T) {
	type req struct {
		h    http.Header
		cs   *tls.ConnectionState
		lend bool
	}
	key := func(r req) PrincipalKey {
		return Decide(r.h, r.cs, r.lend, IdentityImpersonate).PrincipalKey(r.h)
	}
	with := func(h http.Header, k string, v ...string) http.Header {
		h = h.Clone()
		h[k] = v
		return h
	}
	for _, base := range []struct {
		what string
		r    req
	}{
		{"a token", req{h: http.Header{"Authorization": {"Bearer x"}}}},
		{"a token impersonating", req{h: http.Header{"Authorization": {"Bearer x"}, "Impersonate-User": {"u"}, "Impersonate-Group": {"g"},
			"Impersonate-Uid": {"1"}, "Impersonate-Extra-Scopes": {"s"}}}},
		{"the lent identity", req{h: http.Header{}, lend: true}},
		{"the lent identity impersonating", req{h: http.Header{"Impersonate-User": {"u"}}, lend: true}},
		{"an asserted certificate", req{h: http.Header{}, cs: verified("alice", "g1")}},
	} {
		k := key(base.r)
		deciding := map[string]req{
			"another token":                 {h: with(base.r.h, "Authorization", "Bearer y"), cs: base.r.cs, lend: base.r.lend},
			"Impersonate-User":              {h: with(base.r.h, "Impersonate-User", "other"), cs: base.r.cs, lend: base.r.lend},
			"Impersonate-Group":             {h: with(base.r.h, "Impersonate-Group", "other"), cs: base.r.cs, lend: base.r.lend},
			"Impersonate-Uid":               {h: with(base.r.h, "Impersonate-Uid", "2"), cs: base.r.cs, lend: base.r.lend},
			"Impersonate-Extra-Scopes":      {h: with(base.r.h, "Impersonate-Extra-Scopes", "other"), cs: base.r.cs, lend: base.r.lend},
			"another Impersonate-Extra-*":   {h: with(base.r.h, "Impersonate-Extra-Reason", "r"), cs: base.r.cs, lend: base.r.lend},
			"X-Remote-User":                 {h: with(base.r.h, "X-Remote-User", "other"), cs: base.r.cs, lend: base.r.lend},
			"X-Remote-Group":                {h: with(base.r.h, "X-Remote-Group", "other"), cs: base.r.cs, lend: base.r.lend},
			"X-Remote-Extra-Scopes":         {h: with(base.r.h, "X-Remote-Extra-Scopes", "other"), cs: base.r.cs, lend: base.r.lend},
			"another certificate's user":    {h: base.r.h, cs: verified("bob", "g1"), lend: base.r.lend},
			"another certificate's groups":  {h: base.r.h, cs: verified("alice", "g2"), lend: base.r.lend},
			"lent instead (no certificate)": {h: base.r.h, lend: !base.r.lend},
		}
		for what, r := range deciding {
			if _, own := base.r.h["Authorization"]; own && (r.cs != base.r.cs || r.lend != base.r.lend) {
				continue // a token decides alone: a certificate or lending changes nothing (Decide)
			}
			if base.r.cs != nil && what == "lent instead (no certificate)" {
				r.cs = nil
			}
			if key(r) == k {
				t.Errorf("%s: %s does not change the principal key", base.what, what)
			}
		}
		for _, h := range []string{"User-Agent", "Accept", "Accept-Encoding", "X-Request-Id", "Audit-Id", "Traceparent", "Content-Type",
			"Kubectl-Command", "X-Forwarded-For", "X-Auth-User", "Impersonate"} {
			r := base.r
			r.h = with(r.h, h, "v")
			if key(r) != k {
				t.Errorf("%s: %s, which decides nothing of who it is, changes the principal key", base.what, h)
			}
		}
	}
}
