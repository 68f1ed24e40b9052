package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A log whose last line the apiserver's death cut short reads up to that line; damage before
// the end is an error.
func TestReadAuditLogCutShort(t *testing.T) {
	dir := t.TempDir()
	ev := `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a","stage":"RequestReceived","requestURI":"/api/v1/pods?watch=true","verb":"watch","user":{"username":"u"},"userAgent":"x","requestReceivedTimestamp":"2026-01-01T00:00:00.000000Z","stageTimestamp":"2026-01-01T00:00:00.000000Z"}`
	cut := filepath.Join(dir, "cut.log")
	if err := os.WriteFile(cut, []byte(ev+"\n"+ev+"\n"+ev[:40]), 0o600); err != nil {
		t.Fatal(err)
	}
	evs, err := ReadAuditLog(cut)
	if err != nil || len(evs) != 2 || evs[0].Verb != "watch" || evs[1].User.Username != "u" {
		t.Fatalf("ReadAuditLog = %d events, %v; want the 2 whole ones", len(evs), err)
	}
	broken := filepath.Join(dir, "broken.log")
	if err := os.WriteFile(broken, []byte(ev+"\n{not json\n"+ev+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadAuditLog(broken); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("ReadAuditLog of a damaged log: %v, want an error naming line 2", err)
	}
}

// Options.Users get tokens the apiservers accept, with their groups, and Options.Audit logs
// each apiserver's resource requests once, by user, and no health probe.
func TestAuditAndUsers(t *testing.T) {
	c := startT(t, Options{APIServers: 2, Audit: true, Users: []User{{Name: "alice", Groups: []string{"system:masters"}}, {Name: "bob"}}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alice := clientset(t, c, 1, c.Tokens["alice"])
	if _, err := alice.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("alice (system:masters) lists configmaps: %v", err)
	}
	bob := clientset(t, c, 1, c.Tokens["bob"])
	if _, err := bob.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{}); err == nil {
		t.Fatal("bob, in no group, listed secrets")
	}
	for _, bad := range [][]User{{{Name: "x"}, {Name: "x"}}, {{Name: AdminUser}}, {{Name: "a,b"}}} {
		if _, err := Start(ctx, Options{Users: bad}); err == nil || !strings.Contains(err.Error(), "user") {
			t.Errorf("Start with users %v: %v, want refused", bad, err)
		}
	}

	if c.APIServers[0].AuditLog == c.APIServers[1].AuditLog || c.APIServers[1].AuditLog == "" {
		t.Fatalf("audit logs %q and %q, want one each", c.APIServers[0].AuditLog, c.APIServers[1].AuditLog)
	}
	evs, err := ReadAuditLog(c.APIServers[1].AuditLog)
	if err != nil {
		t.Fatal(err)
	}
	byUser := map[string][]string{}
	for _, ev := range evs {
		if ev.Stage != "RequestReceived" {
			t.Errorf("an event at stage %s: the policy logs every request once, when received", ev.Stage)
		}
		if ev.ObjectRef == nil {
			t.Errorf("a non-resource request logged: %s %s", ev.Verb, ev.RequestURI)
			continue
		}
		byUser[ev.User.Username] = append(byUser[ev.User.Username], ev.Verb+" "+ev.ObjectRef.Resource)
	}
	if got := byUser["alice"]; len(got) != 1 || got[0] != "list configmaps" {
		t.Errorf("alice's requests in apiserver-1's audit log: %v, want one list of configmaps", got)
	}
	if got := byUser["bob"]; len(got) != 1 || got[0] != "list secrets" {
		t.Errorf("bob's requests in apiserver-1's audit log: %v, want one list of secrets (refused, still received)", got)
	}
	other, err := ReadAuditLog(c.APIServers[0].AuditLog)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range other {
		if ev.User.Username == "alice" || ev.User.Username == "bob" {
			t.Errorf("apiserver-0 logged %s's %s: each apiserver logs only what it received", ev.User.Username, ev.Verb)
		}
	}
}
