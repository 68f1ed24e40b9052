package server

import (
	"bufio"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchsan/watchsan/internal/config"
)

func newServerFrom(t *testing.T, c *config.Completed) (*Server, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	s, err := New(c, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	return s, logs
}

// recordingUpstream is a TLS upstream (HTTP/2 enabled, like an apiserver) that records the
// path and Authorization of every request but watchsan's health probes.
type recordingUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	seen []string // "METHOD escaped-path auth"
}

func newRecordingUpstream(t *testing.T) *recordingUpstream {
	t.Helper()
	u := &recordingUpstream{}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			u.mu.Lock()
			u.seen = append(u.seen, r.Method+" "+r.URL.EscapedPath()+" "+r.Header.Get("Authorization"))
			u.mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"Status"}`)
	}))
	u.EnableHTTP2 = true
	u.StartTLS()
	t.Cleanup(u.Close)
	return u
}

func (u *recordingUpstream) take() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.seen
	u.seen = nil
	return s
}

// lendingConfig completes a config whose kubeconfig names server (CA: caPEM) with a token
// lent to requests without credentials, plus args.
func lendingConfig(t *testing.T, server string, caPEM []byte, args ...string) *config.Completed {
	t.Helper()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(dir, "kc")
	if err := os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: u, user: {token: lent-token}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, server, ca)), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(append([]string{"--kubeconfig=" + kc, "--listen=127.0.0.1:0", "--admin-listen=127.0.0.1:0"}, args...))
	if err != nil {
		t.Fatal(err)
	}
	done, err := c.Complete()
	if err != nil {
		t.Fatal(err)
	}
	return done
}

func (u *recordingUpstream) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: u.Certificate().Raw})
}

// rawRequest sends req as written on a fresh connection to addr and returns the response.
func rawRequest(t *testing.T, addr, req string) (*http.Response, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", strings.SplitN(req, "\r\n", 2)[0], err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp, body
}

// TestAttackLendingGuard: every way a web page or a stray client could use the lent identity
// is refused with a Status naming the flag that allows it, before anything goes upstream; the
// same requests with their own credentials, or from an accepted host, pass.
func TestAttackLendingGuard(t *testing.T) {
	up := newRecordingUpstream(t)
	s, _ := newServerFrom(t, lendingConfig(t, up.URL, up.caPEM()))
	front := httptest.NewServer(s.Handler())
	defer front.Close()
	addr := strings.TrimPrefix(front.URL, "http://")
	const ok = "Host: 127.0.0.1:8001\r\n"
	_, port, _ := net.SplitHostPort(addr)
	exec := "/api/v1/namespaces/default/pods/p/exec?command=sh"
	// every hop removes the headers Connection names, so this request went upstream
	// without the Authorization the guard had waved it through for, and got the lent identity.
	junk := "Host: evil.example\r\nOrigin: http://evil.example\r\nAuthorization: Bearer junk\r\n"
	ws := "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
	for _, tc := range []struct {
		name, req string
		code      int
		reason    string // refusal reason, "" if it must pass
		flag      string // named in the message
	}{
		{"DNS rebinding", "GET /api/v1/secrets HTTP/1.1\r\nHost: evil.example:8001\r\n\r\n", 403, "host", "--accept-hosts"},
		{"rebinding to a name that starts well", "GET /api/v1/secrets HTTP/1.1\r\nHost: localhost.evil.example\r\n\r\n", 403, "host", "--accept-hosts"},
		{"HTTP/1.0 without Host", "GET /api/v1/secrets HTTP/1.0\r\n\r\n", 403, "host", "--accept-hosts"},
		{"cross-origin WebSocket exec", "GET " + exec + " HTTP/1.1\r\n" + ok + ws + "Origin: http://evil.example\r\n\r\n", 403, "origin", "--accept-hosts"},
		{"Origin null", "GET /api/v1/secrets HTTP/1.1\r\n" + ok + "Origin: null\r\n\r\n", 403, "origin", "--accept-hosts"},
		{"cross-origin POST", "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\n" + ok + "Origin: https://evil.example\r\nContent-Length: 2\r\n\r\n{}", 403, "origin", "--accept-hosts"},
		{"cross-site without Origin", "GET /api/v1/secrets HTTP/1.1\r\n" + ok + "Sec-Fetch-Site: cross-site\r\n\r\n", 403, "origin", ""},
		{"CORS preflight", "OPTIONS /api/v1/secrets HTTP/1.1\r\n" + ok + "Origin: http://localhost:3000\r\nAccess-Control-Request-Method: DELETE\r\n\r\n", 403, "cors_preflight", ""},
		{"exec", "POST " + exec + " HTTP/1.1\r\n" + ok + "Content-Length: 0\r\n\r\n", 403, "path", "--reject-paths"},
		{"exec over SPDY", "POST " + exec + " HTTP/1.1\r\n" + ok + "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nContent-Length: 0\r\n\r\n", 403, "path", "--reject-paths"},
		{"attach", "GET /api/v1/namespaces/default/pods/p/attach HTTP/1.1\r\n" + ok + "\r\n", 403, "path", "--reject-paths"},
		{"exec via a double slash", "GET /api/v1/namespaces/default/pods/p//exec HTTP/1.1\r\n" + ok + "\r\n", 403, "path", "--reject-paths"},
		{"exec via a leading double slash", "GET //api/v1/namespaces/default/pods/p/exec HTTP/1.1\r\n" + ok + "\r\n", 403, "path", "--reject-paths"},
		{"exec via an encoded newline", "GET /api/v1/namespaces/de%0Afault/pods/p/exec HTTP/1.1\r\n" + ok + "\r\n", 403, "path", "--reject-paths"},
		{"exec via an escaped slash", "GET /api/v1/namespaces/default/pods/p%2Fexec HTTP/1.1\r\n" + ok + "\r\n", 403, "path", "--reject-paths"},
		{"kubelet exec via nodes/proxy", "GET /api/v1/nodes/n1/proxy/exec/default/p/c?command=sh HTTP/1.1\r\n" + ok + "\r\n", 403, "path", "--reject-paths"},
		{"dot segments", "GET /../../../v3/tokens HTTP/1.1\r\n" + ok + "\r\n", 400, "dot_segment", ""},
		{"encoded dot segments", "GET /%2e%2e/%2E%2e/v3/tokens HTTP/1.1\r\n" + ok + "\r\n", 400, "dot_segment", ""},
		{"dots with an encoded slash", "GET /..%2f..%2fv3/tokens HTTP/1.1\r\n" + ok + "\r\n", 400, "dot_segment", ""},
		{"a single dot", "GET /api/./v1/secrets HTTP/1.1\r\n" + ok + "\r\n", 400, "dot_segment", ""},
		{"an encoded single dot", "GET /api/v1/%2e/secrets HTTP/1.1\r\n" + ok + "\r\n", 400, "dot_segment", ""},
		{"dot segments with own credentials", "GET /../v3/tokens HTTP/1.1\r\n" + ok + "Authorization: Bearer own\r\n\r\n", 400, "dot_segment", ""},
		{"CONNECT", "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 405, "connect", ""},
		{"absolute target", "GET http://example.com/api HTTP/1.1\r\nHost: example.com\r\n\r\n", 400, "absolute_target", ""},

		{"another origin on loopback", "GET /api/v1/secrets HTTP/1.1\r\n" + ok + "Origin: http://localhost:3000\r\n\r\n", 403, "origin", "own origin"},
		{"this port over another scheme", "GET /api/v1/secrets HTTP/1.1\r\n" + ok + "Origin: https://127.0.0.1:" + port + "\r\n\r\n", 403, "origin", "own origin"},
		{"the default port", "GET /api/v1/secrets HTTP/1.1\r\n" + ok + "Origin: http://localhost\r\n\r\n", 403, "origin", "own origin"},
		{"Connection: Authorization", "POST " + exec + " HTTP/1.1\r\n" + junk + "Connection: Authorization\r\nContent-Length: 0\r\n\r\n", 400, "connection_header", "Connection"},
		{"Connection: Upgrade, Authorization", "POST " + exec + " HTTP/1.1\r\n" + junk + "Connection: Upgrade, authorization\r\nUpgrade: SPDY/3.1\r\nContent-Length: 0\r\n\r\n", 400, "connection_header", "Connection"},
		{"Connection: Authorization on a watch", "GET /api/v1/secrets?watch=true HTTP/1.1\r\n" + junk + "Connection: Authorization\r\n\r\n", 400, "connection_header", "Connection"},
		{"Connection: Authorization over HTTP/1.0", "GET /api/v1/secrets HTTP/1.0\r\nAuthorization: Bearer junk\r\nConnection: Authorization\r\n\r\n", 400, "connection_header", "Connection"},
		{"Connection names X-Remote-User", "GET /api/v1/secrets HTTP/1.1\r\n" + ok + "Connection: X-Remote-User\r\n\r\n", 400, "connection_header", "Connection"},
		{"Connection names Impersonate-Group", "GET /api/v1/secrets HTTP/1.1\r\n" + ok + "Authorization: Bearer own\r\nConnection: close, Impersonate-Group\r\n\r\n", 400, "connection_header", "Connection"},
		{"Connection names Host", "GET /api/v1/secrets HTTP/1.1\r\n" + ok + "Connection: host\r\n\r\n", 400, "connection_header", "Connection"},

		{"Connection: keep-alive", "GET /api/v1/secrets HTTP/1.1\r\n" + ok + "Connection: keep-alive\r\n\r\n", 200, "", ""},
		{"localhost", "GET /api/v1/secrets HTTP/1.1\r\nHost: localhost:8001\r\n\r\n", 200, "", ""},
		{"IPv6 loopback", "GET /api/v1/secrets HTTP/1.1\r\nHost: [::1]:8001\r\n\r\n", 200, "", ""},
		{"same origin", "GET /api/v1/secrets HTTP/1.1\r\n" + ok + "Origin: http://127.0.0.1:" + port + "\r\n\r\n", 200, "", ""},
		{"same origin by another loopback name", "GET /api/v1/secrets HTTP/1.1\r\n" + ok + "Origin: http://localhost:" + port + "\r\n\r\n", 200, "", ""},
		{"names that merely contain a dot", "GET /api/v1/namespaces/default/configmaps/a..b HTTP/1.1\r\n" + ok + "\r\n", 200, "", ""},
		{"rebinding with own credentials", "GET /api/v1/secrets HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer own\r\n\r\n", 200, "", ""},
		{"exec with own credentials", "POST " + exec + " HTTP/1.1\r\n" + ok + "Authorization: Bearer own\r\nContent-Length: 0\r\n\r\n", 200, "", ""},
		{"logs", "GET /api/v1/namespaces/default/pods/p/log HTTP/1.1\r\n" + ok + "\r\n", 200, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := testutil.ToFloat64(s.Metrics().Refused.WithLabelValues(tc.reason))
			resp, body := rawRequest(t, addr, tc.req)
			seen := up.take()
			if resp.StatusCode != tc.code {
				t.Fatalf("got %d %s, want %d (upstream saw %q)", resp.StatusCode, body, tc.code, seen)
			}
			if tc.reason == "" {
				if len(seen) != 1 {
					t.Fatalf("upstream saw %q, want the request", seen)
				}
				return
			}
			if len(seen) != 0 {
				t.Fatalf("a refused request reached the upstream: %q", seen)
			}
			var st metav1.Status
			if err := json.Unmarshal(body, &st); err != nil || st.Kind != "Status" || st.Status != metav1.StatusFailure ||
				int(st.Code) != tc.code || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("not a Status: %v %s", err, body)
			}
			if !strings.Contains(st.Message, tc.flag) {
				t.Fatalf("message %q does not name %s", st.Message, tc.flag)
			}
			if got := testutil.ToFloat64(s.Metrics().Refused.WithLabelValues(tc.reason)); got != before+1 {
				t.Fatalf("refused{reason=%s} went %v -> %v", tc.reason, before, got)
			}
		})
	}
}

// TestGuardFlags: --accept-hosts, --reject-paths and --reject-methods as configured; without
// lending the guard stands aside (the apiserver authenticates every caller), but dot segments
// are refused still.
func TestGuardFlags(t *testing.T) {
	up := newRecordingUpstream(t)
	s, _ := newServerFrom(t, lendingConfig(t, up.URL, up.caPEM(),
		`--accept-hosts=^watchsan\.local$`, "--reject-paths=", "--reject-methods=^DELETE$,^PATCH$"))
	front := httptest.NewServer(s.Handler())
	defer front.Close()
	addr := strings.TrimPrefix(front.URL, "http://")
	for _, tc := range []struct {
		req  string
		code int
	}{
		{"GET /api/v1/secrets HTTP/1.1\r\nHost: watchsan.local:8001\r\n\r\n", 200},
		{"GET /api/v1/secrets HTTP/1.1\r\nHost: localhost\r\n\r\n", 403},
		{"POST /api/v1/namespaces/d/pods/p/exec HTTP/1.1\r\nHost: watchsan.local\r\nContent-Length: 0\r\n\r\n", 200},
		{"DELETE /api/v1/namespaces/d/configmaps/c HTTP/1.1\r\nHost: watchsan.local\r\n\r\n", 405},
		{"DELETE /api/v1/namespaces/d/configmaps/c HTTP/1.1\r\nHost: watchsan.local\r\nAuthorization: Bearer own\r\n\r\n", 200},
	} {
		if resp, body := rawRequest(t, addr, tc.req); resp.StatusCode != tc.code {
			t.Errorf("%q: %d %s, want %d", strings.SplitN(tc.req, "\r\n", 2)[0], resp.StatusCode, body, tc.code)
		}
	}

	s2, _ := newServerFrom(t, lendingConfig(t, up.URL, up.caPEM(), "--no-credentials"))
	front2 := httptest.NewServer(s2.Handler())
	defer front2.Close()
	addr2 := strings.TrimPrefix(front2.URL, "http://")
	if resp, _ := rawRequest(t, addr2, "POST /api/v1/namespaces/d/pods/p/exec HTTP/1.1\r\nHost: evil.example\r\nOrigin: http://evil.example\r\nContent-Length: 0\r\n\r\n"); resp.StatusCode != 200 {
		t.Fatalf("not lending: %d, want the request passed on", resp.StatusCode)
	}
	if resp, _ := rawRequest(t, addr2, "GET /%2e%2e/v3 HTTP/1.1\r\nHost: localhost\r\n\r\n"); resp.StatusCode != 400 {
		t.Fatalf("not lending, dot segments: %d, want 400", resp.StatusCode)
	}
}
