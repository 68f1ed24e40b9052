package check

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/clustertest"
)

// `watchsan check --config FILE` holds the file's resources to a real apiserver's discovery:
// built-in ones in any group pass, a group's resource the cluster does not serve (a CRD that
// is not installed, a typo in a dotted group) is named and the check does not run.
func TestConfigResourcesAgainstDiscovery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real kube-apiserver")
	}
	c := clustertest.Start(t, cluster.Options{})
	client, err := NewClient(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	unknown, err := UnknownResources(ctx, client, []string{"pods", "apps/deployments", "coordination.k8s.io/leases",
		"example.com/widgets", "coordination.k8s.io/leasez", "networking.k8s.io/ingresses"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"example.com/widgets", "coordination.k8s.io/leasez"}; !slices.Equal(unknown, want) {
		t.Errorf("UnknownResources = %q, want %q", unknown, want)
	}

	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := c.WriteKubeconfig(kc, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "watchsan.yaml")
	if err := os.WriteFile(cfg, []byte("fix-exempt-resource:\n  - pods\n  - widgets.example.com\nshare-exclude-resource: leases.coordination.k8s.io\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := Main([]string{"--kubeconfig", kc, "--config", cfg, "--bookmark-wait=0", "--idle-wait=0"}, &stdout, &stderr)
	want := "watchsan check: --config " + cfg + " names resources this cluster does not serve (watchsan would match no watch with them):\n" +
		"  - fix-exempt-resource \"widgets.example.com\"\n"
	if code != ExitError || stderr.String() != want || stdout.Len() != 0 {
		t.Errorf("exit %d, stderr:\n%s\nwant:\n%s", code, stderr.String(), want)
	}
	// Offline: a core resource no Kubernetes serves is refused before any request.
	if err := os.WriteFile(cfg, []byte("fix-exempt-resource: podz\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stderr.Reset()
	if code := Main([]string{"--kubeconfig", kc, "--config", cfg}, &stdout, &stderr); code != ExitError || !strings.Contains(stderr.String(), `fix-exempt-resource "podz": "podz" is not a resource of the core API group; did you mean pods?`) {
		t.Errorf("podz: exit %d, stderr %q", code, stderr.String())
	}
}
