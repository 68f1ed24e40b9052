package reqinfo_test

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/discovery"

	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/clustertest"
)

// The resources CheckBuiltin knows are exactly what a real kube-apiserver's discovery serves in
// those groups: none it serves is refused (--fix-exempt-resource would turn away a real
// resource), none it lists is not served.
func TestBuiltinResourcesMatchDiscovery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real kube-apiserver")
	}
	c := clustertest.Start(t, cluster.Options{})
	dc, err := discovery.NewDiscoveryClientForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	_, lists, err := dc.ServerGroupsAndResources()
	if err != nil {
		t.Fatal(err)
	}
	served := map[string][]string{}
	for _, l := range lists {
		group, _, _ := strings.Cut(l.GroupVersion, "/")
		if !strings.Contains(l.GroupVersion, "/") {
			group = "" // "v1"
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") {
				continue // a subresource
			}
			gr := r.Name
			if group != "" {
				gr = group + "/" + r.Name
			}
			if err := reqinfo.CheckBuiltin(gr); err != nil {
				t.Errorf("served resource %s refused: %v", gr, err)
			}
			if !slices.Contains(served[group], r.Name) {
				served[group] = append(served[group], r.Name)
			}
		}
	}
	for group, names := range reqinfo.BuiltinResources {
		for _, n := range names {
			if !slices.Contains(served[group], n) {
				t.Errorf("%q in group %q is listed as built in but not served (served: %v)", n, group, served[group])
			}
		}
	}
}
