package server

import (
	"fmt"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchsan/watchsan/internal/config"
)

// TestRecentEventsBounded: the ring keeps the last n events, the newest first, and counts
// every one added.
func TestRecentEventsBounded(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	r := newRecentEvents(3, clk)
	if got, total := r.list(); len(got) != 0 || total != 0 {
		t.Fatalf("empty ring: %v %d", got, total)
	}
	for i := range 5 {
		clk.SetTime(time.Unix(1000+int64(i), 0))
		r.add("resume", "https://a", "/api/v1/pods", fmt.Sprint(i))
	}
	got, total := r.list()
	if total != 5 || len(got) != 3 {
		t.Fatalf("after 5 in a ring of 3: %d held, %d counted", len(got), total)
	}
	for i, want := range []string{"4", "3", "2"} {
		if got[i].Detail != want || !got[i].At.Equal(time.Unix(1000+int64(4-i), 0)) {
			t.Errorf("event %d: %+v, want detail %s", i, got[i], want)
		}
	}
	r.add("move", "", strings.Repeat("x", 1000), "")
	if got, _ := r.list(); len(got[0].Where) > 200 {
		t.Errorf("a path is kept whole (%d bytes); want it clipped", len(got[0].Where))
	}
}

// TestEffectiveFlagsNameNoSecret: the status page's configuration shows files by path, drops a
// URL's user information, and marks what differs from the default.
func TestEffectiveFlagsNameNoSecret(t *testing.T) {
	c := config.Default()
	c.Upstreams = []string{"https://admin:hunter2@10.0.0.1:6443", "https://10.0.0.2:6443"}
	c.AdminAuthTokenFile = "/var/run/secrets/token"
	c.Kubeconfig = "/etc/watchsan/kubeconfig"
	flags := effectiveFlags(c)
	byName := map[string]statusFlag{}
	for _, f := range flags {
		byName[f.Name] = f
		if strings.Contains(f.Value, "hunter2") || strings.Contains(f.Value, "admin:") {
			t.Errorf("--%s shows %q: a URL's password", f.Name, f.Value)
		}
	}
	if f := byName["upstream"]; !f.Changed || !strings.Contains(f.Value, "https://10.0.0.1:6443") || !strings.Contains(f.Value, "https://10.0.0.2:6443") {
		t.Errorf("--upstream: %+v", f)
	}
	if f := byName["admin-auth-token-file"]; f.Value != "/var/run/secrets/token" || !f.Changed {
		t.Errorf("--admin-auth-token-file: %+v, want its path", f)
	}
	if f := byName["listen"]; f.Changed {
		t.Errorf("--listen at its default marked changed: %+v", f)
	}
	if got := redactFlag("bearer-token", "abc"); got == "abc" {
		t.Errorf("a flag named for a token's contents shows it: %q", got)
	}
}
