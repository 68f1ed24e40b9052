package e2e

// The attack suite of issue 16: each test is one attack as it was measured against main
// before the fix, and fails when the fix that stops it is removed.

import (
	"strings"
	"testing"
)

// TestAttackConnectionHeaderLendsToken: a request with `Authorization: Bearer junk` and
// `Connection: Authorization`, from a foreign Host and Origin, on an exec path, got 200 and
// the upstream received the lent token: the guard skipped every check for a request with its
// own Authorization, the hop-by-hop removal then deleted that header because Connection named
// it, and the transport decided again on the stripped request and lent. The same worked on a
// watch, over HTTP/1.0 and with `Connection: Upgrade, Authorization`. Now the decision is made
// once, on the request as the client sent it, and a Connection header that names
// Authorization, an identity header or Host is refused: nothing reaches the upstream.
func TestAttackConnectionHeaderLendsToken(t *testing.T) {
	up := newTLSUpstream(t, nil)
	kc := up.kubeconfig(t, "", "lent-token", "", "")
	p := startProxy(t, "--kubeconfig="+kc)
	addr := strings.TrimPrefix(p.URL, "http://")
	const foreign = "Host: evil.example:8001\r\nOrigin: http://evil.example\r\nAuthorization: Bearer junk\r\n"
	exec := "/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true&stdout=true"
	for _, tc := range []struct{ name, req string }{ // the first four are the attack
		{"exec", "POST " + exec + " HTTP/1.1\r\n" + foreign + "Connection: Authorization\r\nContent-Length: 0\r\n\r\n"},
		{"exec upgrade", "POST " + exec + " HTTP/1.1\r\n" + foreign + "Connection: Upgrade, Authorization\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n"},
		{"watch", "GET /api/v1/namespaces/default/secrets?watch=true HTTP/1.1\r\n" + foreign + "Connection: Authorization\r\n\r\n"},
		{"HTTP/1.0", "GET /api/v1/namespaces/default/secrets HTTP/1.0\r\nAuthorization: Bearer junk\r\nConnection: authorization\r\n\r\n"},
		{"Connection names X-Remote-User", "GET /api/v1/namespaces/default/secrets HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: X-Remote-User\r\n\r\n"},
		{"Connection names Impersonate-User", "GET /api/v1/namespaces/default/secrets HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer own\r\nImpersonate-User: admin\r\nConnection: impersonate-user\r\n\r\n"},
		{"Connection names Host", "GET /api/v1/namespaces/default/secrets HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive, Host\r\n\r\n"},
	} {
		code, body := rawHTTP(t, addr, tc.req)
		seen := up.take()
		for _, s := range seen {
			if s.auth == "Bearer lent-token" && strings.Contains(tc.req, "Bearer junk") {
				t.Errorf("%s: the lent token reached the upstream (%s %s, answered %d)", tc.name, s.proto, s.path, code)
			}
		}
		if code != 400 || len(seen) != 0 {
			t.Errorf("%s: %d %s, %d requests upstream; want 400 and none", tc.name, code, body, len(seen))
			continue
		}
		if st := watchsanStatus(t, body); !strings.Contains(st.Message, "Connection") {
			t.Errorf("%s: message %q does not say it is the Connection header", tc.name, st.Message)
		}
	}
	if n := p.Metric("watchsan_requests_refused_total", map[string]string{"reason": "connection_header"}); n != 7 {
		t.Errorf("watchsan_requests_refused_total{reason=connection_header} = %v, want 7", n)
	}
	// Connection with hop-by-hop names only (keep-alive, close, Upgrade) is what clients send.
	if code, body := rawHTTP(t, addr, "GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive, close\r\n\r\n"); code != 200 {
		t.Fatalf("Connection: keep-alive, close: %d %s", code, body)
	}
	if s := up.take(); len(s) != 1 || s[0].auth != "Bearer lent-token" {
		t.Fatalf("a plain lent request reached the upstream as %+v", s)
	}
}
