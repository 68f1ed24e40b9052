package cluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"sigs.k8s.io/yaml"
)

// auditPolicy is Options.Audit's policy: every request for a resource (reads, watches and
// writes) at Metadata level, logged once, when the apiserver receives it, so that a count of a
// log's lines is what that apiserver was asked, whether or not it answered (a watch that is
// still open, or that the apiserver's death ended, has no later stage). Non-resource requests
// (/readyz, /healthz, discovery) are not logged: they are not what a client's informers cost.
func auditPolicy() *auditv1.Policy {
	return &auditv1.Policy{
		TypeMeta: metav1.TypeMeta{APIVersion: "audit.k8s.io/v1", Kind: "Policy"},
		OmitStages: []auditv1.Stage{
			auditv1.StageResponseStarted, auditv1.StageResponseComplete, auditv1.StagePanic,
		},
		Rules: []auditv1.PolicyRule{
			// First, since a rule that names no resources and no URLs matches non-resource
			// requests too.
			{Level: auditv1.LevelNone, NonResourceURLs: []string{"*"}},
			// Every resource (a rule with no Resources matches all of them).
			{
				Level: auditv1.LevelMetadata,
				Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"},
			},
			{Level: auditv1.LevelNone},
		},
	}
}

// writeAuditPolicy writes auditPolicy into dir and returns its path.
func writeAuditPolicy(dir string) (string, error) {
	b, err := yaml.Marshal(auditPolicy())
	if err != nil {
		return "", fmt.Errorf("audit policy: %w", err)
	}
	path := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return "", fmt.Errorf("audit policy: %w", err)
	}
	return path, nil
}

// auditArgs are the audit flags of apiserver i with Options.Audit: the policy, and a JSON log
// of its own (kept across restarts: the log backend appends).
func (a *APIServer) auditArgs() []string {
	if a.AuditLog == "" {
		return nil
	}
	return []string{
		"--audit-policy-file=" + a.c.auditPolicy,
		"--audit-log-path=" + a.AuditLog,
		"--audit-log-format=json",
		"--audit-log-mode=blocking", // every event written before the request goes on: none lost at a SIGKILL
		"--audit-log-maxsize=0",     // never rotated: one file per apiserver for the whole test
	}
}

// ReadAuditLog reads an apiserver's audit log (APIServer.AuditLog), one event a line. A line cut
// short (the apiserver was killed while writing it) ends the log without an error.
func ReadAuditLog(path string) ([]auditv1.Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	defer f.Close()
	var out []auditv1.Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for line := 1; sc.Scan(); line++ {
		var ev auditv1.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			if !sc.Scan() { // the last line, cut short
				break
			}
			return nil, fmt.Errorf("audit log %s line %d: %w", path, line, err)
		}
		out = append(out, ev)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("audit log %s: %w", path, err)
	}
	return out, nil
}
