package server

import "testing"

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
