package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/clustertest"
)

// forOperator are the kustomizations that need the Prometheus Operator's CRDs. Every other
// one must apply on a plain cluster: the test fails if one of them renders a ServiceMonitor
// (kubectl would fail on it, after creating everything else).
var forOperator = map[string]bool{"overlays/ha-monitoring": true}

// TestKubectlApply applies every kustomization under deploy/ as deploy/README.md says, with the
// real kubectl (`kubectl apply -k deploy/DIR`, from the repository's root), for real, to a
// real kube-apiserver that has only Kubernetes' own kinds (no Prometheus Operator): every one
// but those in forOperator succeeds without a warning, and every object it renders is then
// stored. Those in forOperator fail there with kubectl's `no matches for kind
// "ServiceMonitor"`, and succeed once the CRD is installed (testdata/servicemonitor-crd.yaml).
// Components are applied with their overlays (TestServerDryRun checks them with each host).
func TestKubectlApply(t *testing.T) {
	renderings := renderAll(t)
	c := clustertest.Start(t, cluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(c.Dir, "admin.kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	d := newDryRunner(t, c)
	apply := func(dir string) (stdout, stderr string, err error) {
		cmd := c.KubectlCmd(ctx, kubeconfig, "apply", "-k", "deploy/"+dir)
		cmd.Dir = root
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err = cmd.Run()
		return o.String(), e.String(), err
	}
	// stored checks that every object of r is in the apiserver.
	stored := func(t *testing.T, r rendering) {
		t.Helper()
		for _, o := range r.objs {
			ri, err := d.resource(o)
			if err != nil {
				t.Errorf("%s %s: %v", o.GetKind(), o.GetName(), err)
				continue
			}
			if _, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{}); err != nil {
				t.Errorf("after kubectl apply -k deploy/%s: %s %s/%s: %v", r.name, o.GetKind(), o.GetNamespace(), o.GetName(), err)
			}
		}
	}
	var plain, operator []rendering
	for _, r := range renderings {
		if strings.Contains(r.name, "+") { // a component with its host: no directory to apply
			continue
		}
		usesOperator := slices.ContainsFunc(r.objs, func(o *unstructured.Unstructured) bool {
			return o.GroupVersionKind().Group == "monitoring.coreos.com"
		})
		switch {
		case forOperator[r.name]:
			if !usesOperator {
				t.Errorf("deploy/%s is listed in forOperator but renders no monitoring.coreos.com object", r.name)
			}
			operator = append(operator, r)
		case usesOperator:
			t.Errorf("deploy/%s renders a monitoring.coreos.com object: it would not apply on a cluster without the Prometheus Operator (make it opt-in, as overlays/ha-monitoring)", r.name)
		default:
			plain = append(plain, r)
		}
	}
	if len(plain) < 6 || len(operator) == 0 {
		t.Fatalf("%d kustomizations for a plain cluster, %d for the operator: the walk found too few", len(plain), len(operator))
	}

	for _, r := range plain {
		t.Run(strings.ReplaceAll(r.name, "/", "_"), func(t *testing.T) {
			t0 := time.Now()
			stdout, stderr, err := apply(r.name)
			if err != nil {
				t.Fatalf("kubectl apply -k deploy/%s on a plain cluster: %v\n%s%s", r.name, err, stdout, stderr)
			}
			for _, w := range warnings(stderr) {
				t.Errorf("kubectl apply -k deploy/%s: %s", r.name, w)
			}
			stored(t, r)
			t.Logf("kubectl apply -k deploy/%s: %d objects in %.1fs", r.name, len(r.objs), time.Since(t0).Seconds())
		})
	}

	// The README's own overlay for a published image, every command of its block but the push
	// (no registry here), in a directory holding a copy of deploy/ as the reader's checkout does.
	t.Run("README_own_overlay", func(t *testing.T) {
		blocks, err := cluster.MarkdownBlocks("README.md", "## The image")
		if err != nil {
			t.Fatal(err)
		}
		var script string
		for _, b := range blocks {
			if b.Lang == "sh" && strings.Contains(b.Text, "kubectl apply -k my-watchsan") {
				for _, l := range strings.SplitAfter(b.Text, "\n") {
					if !strings.HasPrefix(l, "make push ") {
						script += l
					}
				}
			}
		}
		if script == "" {
			t.Fatal(`deploy/README.md, "The image": no sh block applies my-watchsan`)
		}
		dir := t.TempDir()
		if out, err := exec.Command("cp", "-r", filepath.Join(root, "deploy"), dir).CombinedOutput(); err != nil {
			t.Fatalf("cp deploy: %v: %s", err, out)
		}
		_, stderr, err := c.Shell(ctx, dir, kubeconfig, script)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range warnings(string(stderr)) {
			t.Errorf("README's own overlay: %s", w)
		}
		dep, err := d.dyn.Resource(schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}).
			Namespace("watchsan-system").Get(ctx, "watchsan-frontend", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ctrs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
		want := "registry.example.com/watchsan:v1.2.3"
		if len(ctrs) != 1 || ctrs[0].(map[string]any)["image"] != want {
			t.Errorf("after the README's own overlay, the frontend's containers are %v, want the image %s", ctrs, want)
		}
	})

	for _, r := range operator {
		t.Run(strings.ReplaceAll(r.name, "/", "_"), func(t *testing.T) {
			_, stderr, err := apply(r.name)
			if err == nil || !strings.Contains(stderr, `no matches for kind "ServiceMonitor"`) {
				t.Errorf("kubectl apply -k deploy/%s without the ServiceMonitor CRD: err %v, stderr %q; want kubectl's no matches for kind \"ServiceMonitor\" (else this test does not show it needs the CRD)", r.name, err, stderr)
			}
		})
	}
	installCRD(ctx, t, d, "testdata/servicemonitor-crd.yaml")
	for _, r := range operator {
		t.Run(strings.ReplaceAll(r.name, "/", "_")+"_with_CRD", func(t *testing.T) {
			stdout, stderr, err := apply(r.name)
			if err != nil {
				t.Fatalf("kubectl apply -k deploy/%s with the ServiceMonitor CRD: %v\n%s%s", r.name, err, stdout, stderr)
			}
			for _, w := range warnings(stderr) {
				t.Errorf("kubectl apply -k deploy/%s: %s", r.name, w)
			}
			stored(t, r)
		})
	}
}

// warnings returns kubectl's "Warning: ..." lines (the apiserver's warnings, Pod Security's
// included).
func warnings(stderr string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(stderr))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "Warning:") {
			out = append(out, sc.Text())
		}
	}
	return out
}
