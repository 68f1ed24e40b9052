package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAdminOpen: only the probes' paths (and /metrics unless it is checked) are open; any other
// path, those that merely start like an open one included, is checked: the rule names what is
// open, so a path added later is checked by default.
func TestAdminOpen(t *testing.T) {
	for _, tc := range []struct {
		path           string
		metricsChecked bool
		open           bool
	}{
		{"/healthz", false, true}, {"/livez", true, true}, {"/readyz", true, true},
		{"/metrics", false, true}, {"/metrics", true, false},
		{"/debug/feeds", false, false}, {"/debug/pprof/", false, false}, {"/debug/pprof/cmdline", false, false},
		{"/healthz/../debug/feeds", false, false}, {"/readyz/", false, false}, {"//healthz", false, false},
		{"/metrics/../debug/feeds", false, false}, {"/", false, false}, {"", false, false}, {"/HEALTHZ", false, false},
		{"/status", false, false}, {"/status.json", false, false},
	} {
		if got := adminOpen(tc.path, tc.metricsChecked); got != tc.open {
			t.Errorf("adminOpen(%q, metrics checked %v) = %v, want %v", tc.path, tc.metricsChecked, got, tc.open)
		}
	}
}

// TestBearerToken: the token of "Bearer TOKEN", the scheme in any case, as the apiserver reads
// it; anything else is no token.
func TestBearerToken(t *testing.T) {
	for h, want := range map[string]string{
		"Bearer abc": "abc", "bearer abc": "abc", "BEARER  abc ": "abc",
		"": "", "Bearer": "", "Bearer ": "", "Basic YWJj": "", "abc": "",
	} {
		got, ok := bearerToken(h)
		if got != want || ok != (want != "") {
			t.Errorf("bearerToken(%q) = %q, %v; want %q", h, got, ok, want)
		}
	}
}

// TestAdminAuthRefusesWithoutAnAnswer: off loopback, the admin handler serves /debug/* to no
// one the apiserver has not allowed: no token is 401 at once; a token that cannot be reviewed
// (no upstream answers) is 401 naming the failed TokenReview, and the token is not logged; the
// probes' paths and /metrics stay open; with adminReviewSlots requests being reviewed, one more
// is 429. (The real apiserver's answers: test/e2e/admin_auth_test.go.)
func TestAdminAuthRefusesWithoutAnAnswer(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("reviewer-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, logs := newTestServerArgs(t, "--upstream=http://127.0.0.1:1", "--no-credentials", "--retry-budget=0",
		"--admin-listen=0.0.0.0:0", "--admin-auth-token-file="+tok, "--enable-pprof")
	admin := httptest.NewServer(s.AdminHandler())
	defer admin.Close()
	get := func(path, token string) (int, metav1.Status) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, admin.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st metav1.Status
		_ = json.NewDecoder(resp.Body).Decode(&st)
		return resp.StatusCode, st
	}
	for _, path := range []string{"/healthz", "/livez", "/metrics"} {
		if code, _ := get(path, ""); code != http.StatusOK {
			t.Errorf("%s without a token: %d, want 200", path, code)
		}
	}
	for _, path := range []string{"/debug/feeds", "/debug/pprof/cmdline", "/debug/nothing", "/healthz/../debug/feeds"} {
		if code, st := get(path, ""); code != http.StatusUnauthorized || st.Reason != metav1.StatusReasonUnauthorized || !strings.Contains(st.Message, "bearer token") {
			t.Errorf("%s without a token: %d %+v, want a 401 Status asking for a bearer token", path, code, st)
		}
	}
	code, st := get("/debug/feeds", "client-secret")
	if code != http.StatusUnauthorized || !strings.Contains(st.Message, "TokenReview failed") {
		t.Errorf("/debug/feeds with a token no apiserver could review: %d %+v, want a 401 naming the failed TokenReview", code, st)
	}
	// The bound on reviews at once: with every slot taken (requests being reviewed), one more
	// is answered 429 with Retry-After at once, sending no review.
	for range adminReviewSlots {
		s.adminAuth.slots <- struct{}{}
	}
	req, _ := http.NewRequest(http.MethodGet, admin.URL+"/debug/feeds", nil)
	req.Header.Set("Authorization", "Bearer client-secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("/debug/feeds with every review slot taken: %s, Retry-After %q; want 429 with Retry-After 1", resp.Status, resp.Header.Get("Retry-After"))
	}
	if code, _ := get("/healthz", ""); code != http.StatusOK {
		t.Errorf("/healthz with every review slot taken: %d, want 200", code)
	}
	for range adminReviewSlots {
		<-s.adminAuth.slots
	}
	for _, e := range logs.All() {
		line := fmt.Sprint(e.Message, e.ContextMap())
		if strings.Contains(line, "client-secret") || strings.Contains(line, "reviewer-secret") {
			t.Errorf("a token was logged: %s", line)
		}
	}
}
