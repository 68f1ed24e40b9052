package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest/observer"

	wtestutil "github.com/watchsan/watchsan/internal/testutil"
)

func newTestServer(t *testing.T, upstream string) (*Server, *observer.ObservedLogs) {
	t.Helper()
	return newTestServerArgs(t, "--upstream="+upstream)
}

func TestProxyCountsBothDirectionsAndNeverLogsTokens(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Header.Get("Authorization") != "Bearer s3cret" || r.Header.Get("X-Forwarded-For") == "" {
			http.Error(w, "headers not forwarded", 400)
			return
		}
		w.WriteHeader(201)
		w.Write(append(b, b...))
	}))
	defer up.Close()
	s, logs := newTestServer(t, up.URL)
	front := httptest.NewServer(s.Handler())
	defer front.Close()
	req, _ := http.NewRequest("POST", front.URL+"/api/v1/namespaces/d/configmaps", strings.NewReader("0123456789"))
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || len(body) != 20 {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	// The request is counted and logged after its response went out: wait for the log line,
	// written last.
	wtestutil.Eventually(t, 5*time.Second, "the request to be logged", func() bool { return logs.FilterMessage("request").Len() == 1 })
	m := s.Metrics()
	if v := testutil.ToFloat64(m.Bytes.WithLabelValues("client_to_upstream")); v != 10 {
		t.Fatalf("client_to_upstream bytes %v, want 10", v)
	}
	if v := testutil.ToFloat64(m.Bytes.WithLabelValues("upstream_to_client")); v != 20 {
		t.Fatalf("upstream_to_client bytes %v, want 20", v)
	}
	if v := testutil.ToFloat64(m.Requests.WithLabelValues("create", "configmaps", "201")); v != 1 {
		t.Fatalf("requests{create,configmaps,201} = %v", v)
	}
	lines := logs.FilterMessage("request").All()
	if len(lines) != 1 || lines[0].ContextMap()["verb"] != "create" {
		t.Fatalf("access log: %+v", lines)
	}
	for _, e := range logs.All() {
		for k, v := range e.ContextMap() {
			if strings.Contains(k+"="+stringOf(v), "s3cret") {
				t.Fatalf("a token reached the log: %s %v", e.Message, e.ContextMap())
			}
		}
	}
}

func stringOf(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return ""
}

func TestReadyzFollowsUpstreamsAndShutdown(t *testing.T) {
	s, _ := newTestServer(t, "http://127.0.0.1:1")
	admin := httptest.NewServer(s.AdminHandler())
	defer admin.Close()
	get := func(path string) int {
		resp, err := http.Get(admin.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if get("/readyz") != 503 || get("/healthz") != 200 {
		t.Fatal("a fresh server is healthy, and not ready before an upstream answered a probe")
	}
	for _, b := range s.pool.Backends() {
		if _, err := b.Probe(t.Context(), time.Second); err == nil {
			t.Fatal("probe of a closed port succeeded")
		}
	}
	s.stopping.Store(true)
	if get("/readyz") != 503 || get("/healthz") != 200 {
		t.Fatal("while stopping: readyz must fail, healthz pass")
	}
	if get("/metrics") != 200 || get("/debug/pprof/") != 404 {
		t.Fatal("metrics served; pprof only with --enable-pprof")
	}
}

// TestAttackAdminRebinding: the admin listener on loopback answered any Host, so a web page
// whose DNS name was rebound to 127.0.0.1 read /metrics (and pprof, where enabled). On
// loopback it now applies --accept-hosts as the lending listener does; on another address
// (a pod's, scraped by Prometheus) every Host is its own.
func TestAttackAdminRebinding(t *testing.T) {
	for _, tc := range []struct {
		listen string
		host   string
		code   int
	}{
		{"127.0.0.1:0", "evil.example:9091", 403},
		{"127.0.0.1:0", "127.0.0.1:9091", 200},
		{"127.0.0.1:0", "localhost", 200},
		{"0.0.0.0:0", "10.1.2.3:9091", 200},
	} {
		args := []string{"--upstream=http://127.0.0.1:1", "--admin-listen=" + tc.listen}
		if tc.listen == "0.0.0.0:0" { // the admin listener's reviews need an identity (adminauth.go)
			tok := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(tok, []byte("t"), 0o600); err != nil {
				t.Fatal(err)
			}
			args = append(args, "--admin-auth-token-file="+tok)
		}
		s, _ := newTestServerArgs(t, args...)
		admin := httptest.NewServer(s.AdminHandler())
		for _, path := range []string{"/metrics", "/healthz"} {
			req, _ := http.NewRequest(http.MethodGet, admin.URL+path, nil)
			req.Host = tc.host
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.code {
				t.Fatalf("admin on %s, Host %q, %s: %d %s, want %d", tc.listen, tc.host, path, resp.StatusCode, body, tc.code)
			}
			if tc.code == 403 && !strings.Contains(string(body), "--accept-hosts") {
				t.Fatalf("the refusal does not name --accept-hosts: %s", body)
			}
		}
		admin.Close()
	}
}
