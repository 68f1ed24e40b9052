package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --probe-kubeconfig: its user is loaded; a file that is missing, names no
// credentials, or would send them to a plain http:// upstream is refused at start.
func TestProbeKubeconfig(t *testing.T) {
	kc := writeKubeconfig(t, "https://10.0.0.9:6443", "")
	noUser := filepath.Join(t.TempDir(), "nouser")
	os.WriteFile(noUser, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600)
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--upstream=https://10.0.0.1:6443", "--no-credentials", "--probe-kubeconfig=" + kc}, ""},
		{[]string{"--upstream=https://10.0.0.1:6443", "--no-credentials", "--probe-kubeconfig=/nonexistent"}, "--probe-kubeconfig: stat /nonexistent"},
		{[]string{"--upstream=https://10.0.0.1:6443", "--no-credentials", "--probe-kubeconfig=" + noUser}, "its user has no credentials"},
		{[]string{"--upstream=http://10.0.0.1:8080", "--no-credentials", "--probe-kubeconfig=" + kc}, "would cross the network in cleartext"},
	} {
		done, err := complete(t, tc.args...)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.wantErr == "" && (done.ProbeCredentials == nil || done.ProbeCredentials.BearerToken != "secret-token-value"):
			t.Errorf("%v: probe credentials %+v, want the file's token", tc.args, done.ProbeCredentials)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%v: err %v, want one saying %q", tc.args, err, tc.wantErr)
		}
	}
}
