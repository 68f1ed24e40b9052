package cli

import (
	"os/exec"
	"strings"
	"testing"
)

// the production binary links none of the demo's real-cluster mode, the
// in-memory apiserver, the fault layers or the test harness (they are cmd/watchsan-demo's).
// Nor does it link any k8s.io/api group or client-go's clientset (k8s.io/client-go/kubernetes
// and its scheme): they registered every API group's types and doubled the binary (42.9 MB
// instead of 21.6 MB) when `watchsan check` used the typed core/v1 client; check talks through
// client-go's dynamic client and a REST client without that scheme. One group is linked, for
// its types alone: k8s.io/api/authorization/v1, the SelfSubjectAccessReview that lets a client
// with its own credentials share a watch feed (internal/watch/access.go); it cost 316 KB
// (24,322,763 to 24,639,539 bytes, linux/amd64) and registers nothing in any scheme.
func TestBinaryLinksNoDemoOrTestCode(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", "github.com/watchsan/watchsan/cmd/watchsan").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	allowed := map[string]bool{"k8s.io/api/authorization/v1": true}
	for _, pkg := range strings.Fields(string(out)) {
		if allowed[pkg] {
			continue
		}
		for _, bad := range []string{
			"github.com/watchsan/watchsan/internal/demo", "github.com/watchsan/watchsan/internal/memapi",
			"github.com/watchsan/watchsan/internal/faults", "github.com/watchsan/watchsan/test/", "k8s.io/apiserver",
			"k8s.io/api/", "k8s.io/client-go/kubernetes",
			"github.com/chromedp", // the status page's browser test drives Chromium with it; never the binary
		} {
			if pkg == bad || strings.HasPrefix(pkg, bad+"/") || (strings.HasSuffix(bad, "/") && strings.HasPrefix(pkg, bad)) {
				t.Errorf("cmd/watchsan links %s", pkg)
			}
		}
	}
}
