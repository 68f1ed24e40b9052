package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/watchsan/watchsan/test/cluster"
)

// chartDir is the Helm chart, relative to deploy/.
const chartDir = "helm/watchsan"

// helmCase is one rendering of the chart that renderAll adds to the kustomizations, so that
// every check of TestRendered and TestServerDryRun applies to the chart too. Its name has a "+"
// (like a component with its host): there is no directory to `kubectl apply -k`.
type helmCase struct {
	name      string
	namespace string
	args      []string // --set and the like
	// matches is the kustomization whose rendering this one must equal (TestHelmMatchesKustomize);
	// empty for a case with values of its own.
	matches string
}

var helmCases = []helmCase{
	{name: "helm/watchsan+mode=frontend", namespace: "watchsan-system", matches: "base/ha",
		args: []string{"--set", "mode=frontend"}},
	{name: "helm/watchsan+mode=node-local", namespace: "watchsan-node", matches: "base/node-local",
		args: []string{"--set", "mode=node-local"}},
	// Values that move what the kustomize bases hard-code: the ports (the probes and the
	// --config file follow), the image, more flags, the name.
	{name: "helm/watchsan+node-local,values", namespace: "kube-node-agents", args: []string{
		"--set", "mode=node-local", "--set", "name=edge-watchsan", "--set", "nodeLocal.port=17443", "--set", "nodeLocal.adminPort=19091",
		"--set", "image.repository=" + watchsanImage, "--set", "image.tag=v1.2.3", "--set", "logFormat=console",
		"--set", "extraConfig.share-watches=false", "--set-json", `upstreams=["https://10.0.0.11:6443","https://10.0.0.12:6443"]`,
	}},
	{name: "helm/watchsan+frontend,values", namespace: "proxies", args: []string{
		"--set", "mode=frontend", "--set", "frontend.replicas=3", "--set", "frontend.port=9443", "--set", "frontend.adminPort=9092",
		"--set", "image.digest=sha256:" + strings.Repeat("ab", 32), "--set", "frontend.networkPolicy.enabled=false",
	}},
}

// helmPath is the Helm CLI hack/cluster-bins.sh builds from tools/helm.
func helmPath() (string, error) { return cluster.Binary("helm") }

// helmRenderings renders every helmCase with `helm template`. Under -short without the Helm CLI
// it renders none (go test -short needs no cluster-bins); otherwise a missing CLI fails.
func helmRenderings() ([]rendering, error) {
	helm, err := helmPath()
	if err != nil {
		if testing.Short() {
			return nil, nil
		}
		return nil, fmt.Errorf("the Helm chart: %w", err)
	}
	var out []rendering
	for _, hc := range helmCases {
		args := append([]string{"template", "watchsan", chartDir, "--namespace", hc.namespace, "--set", "namespace.create=true"}, hc.args...)
		stdout, err := runHelm(helm, args...)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", hc.name, err)
		}
		objs, err := decodeObjects(stdout)
		if err != nil {
			return nil, fmt.Errorf("%s: helm template's output: %w", hc.name, err)
		}
		out = append(out, rendering{name: hc.name, objs: objs})
	}
	return out, nil
}

func runHelm(helm string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, helm, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}

// decodeObjects splits a multi-document YAML stream into objects (empty documents skipped).
func decodeObjects(data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		// Through JSON, so numbers are int64 as unstructured objects expect.
		b, err := json.Marshal(m)
		if err != nil {
			return nil, err
		}
		o := &unstructured.Unstructured{}
		if err := o.UnmarshalJSON(b); err != nil {
			return nil, err
		}
		objs = append(objs, o)
	}
}

// TestHelmLint runs `helm lint --strict` on the chart in both modes, and checks that a mode the
// chart does not know fails the rendering with a message naming the choices.
func TestHelmLint(t *testing.T) {
	helm, err := helmPath()
	if err != nil {
		if testing.Short() {
			t.Skip("no Helm CLI (make cluster-bins builds it):", err)
		}
		t.Fatal(err)
	}
	for _, mode := range []string{"frontend", "node-local"} {
		out, err := runHelm(helm, "lint", "--strict", chartDir, "--set", "mode="+mode)
		if err != nil {
			t.Errorf("helm lint --strict, mode %s: %v\n%s", mode, err, out)
		}
	}
	_, err = runHelm(helm, "template", "watchsan", chartDir, "--set", "mode=sidecar")
	if err == nil || !strings.Contains(err.Error(), "mode must be frontend or node-local") {
		t.Errorf("helm template --set mode=sidecar: %v; want it to fail naming the modes", err)
	}
}

// TestHelmMatchesKustomize: the chart with its default values renders what the kustomize base
// of the same mode renders, object for object, in everything but the objects' labels and
// annotations: the image, the args and the --config file's keys, the probes, the resources,
// the securityContexts, the volumes, the replicas and spreading, the Service, the
// PodDisruptionBudget, the NetworkPolicy, the ServiceAccount and every RBAC rule and binding.
// Generated ConfigMaps are matched without kustomize's hash suffix; the chart's explicit
// imagePullPolicy IfNotPresent is the default kustomize's manifests leave out.
func TestHelmMatchesKustomize(t *testing.T) {
	all := renderAll(t)
	byName := map[string]rendering{}
	for _, r := range all {
		byName[r.name] = r
	}
	compared := 0
	for _, hc := range helmCases {
		if hc.matches == "" {
			continue
		}
		h, ok := byName[hc.name]
		if !ok {
			if testing.Short() {
				t.Skip("no Helm CLI (make cluster-bins builds it)")
			}
			t.Fatalf("%s was not rendered", hc.name)
		}
		k, ok := byName[hc.matches]
		if !ok {
			t.Fatalf("%s was not rendered", hc.matches)
		}
		t.Run(strings.ReplaceAll(hc.name, "/", "_"), func(t *testing.T) {
			want := normalizeAll(t, k.objs)
			got := normalizeAll(t, h.objs)
			for key, w := range want {
				g, ok := got[key]
				if !ok {
					t.Errorf("%s renders %s, the chart does not", hc.matches, key)
					continue
				}
				if !reflect.DeepEqual(w, g) {
					wj, _ := yaml.Marshal(w)
					gj, _ := yaml.Marshal(g)
					t.Errorf("%s differs from %s's:\n--- kustomize\n%s--- helm\n%s", key, hc.matches, wj, gj)
				}
				compared++
			}
			for key := range got {
				if _, ok := want[key]; !ok {
					t.Errorf("the chart renders %s, %s does not", key, hc.matches)
				}
			}
		})
	}
	t.Logf("%d objects compared", compared)
}

var hashSuffix = regexp.MustCompile(`-[a-z0-9]{10}$`)

// normalizeAll keys each object by kind and name (ConfigMaps without a hash suffix) and keeps
// what the comparison covers.
func normalizeAll(t *testing.T, objs []*unstructured.Unstructured) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, o := range objs {
		o = o.DeepCopy()
		name := o.GetName()
		if o.GetKind() == "ConfigMap" {
			name = hashSuffix.ReplaceAllString(name, "")
			// The --config file as watchsan reads it: keys and values, not comments or order.
			data, _, _ := unstructured.NestedStringMap(o.Object, "data")
			parsed := map[string]any{}
			for k, v := range data {
				var m any
				if err := yaml.Unmarshal([]byte(v), &m); err != nil {
					t.Fatalf("ConfigMap %s key %s: %v", o.GetName(), k, err)
				}
				parsed[k] = m
			}
			o.Object["data"] = parsed
		}
		meta := map[string]any{"name": name, "namespace": o.GetNamespace()}
		if o.GetKind() == "Namespace" {
			pss := map[string]any{} // the Pod Security level
			for k, v := range o.GetLabels() {
				if strings.HasPrefix(k, "pod-security.kubernetes.io/") {
					pss[k] = v
				}
			}
			meta["labels"] = pss
		}
		o.Object["metadata"] = meta
		if tmpl, ok, _ := unstructured.NestedMap(o.Object, "spec", "template"); ok {
			normalizePodTemplate(tmpl)
			_ = unstructured.SetNestedMap(o.Object, tmpl, "spec", "template")
		}
		out[o.GetKind()+" "+o.GetNamespace()+"/"+name] = o.Object
	}
	return out
}

func normalizePodTemplate(tmpl map[string]any) {
	if md, ok := tmpl["metadata"].(map[string]any); ok {
		delete(md, "annotations") // the chart's config checksum; kustomize rolls pods by the ConfigMap's name
	}
	spec, _ := tmpl["spec"].(map[string]any)
	for _, list := range []string{"containers", "initContainers"} {
		cs, _ := spec[list].([]any)
		for _, c := range cs {
			if m, ok := c.(map[string]any); ok && m["imagePullPolicy"] == "IfNotPresent" {
				delete(m, "imagePullPolicy")
			}
		}
	}
	vs, _ := spec["volumes"].([]any)
	for _, v := range vs {
		if cm, ok, _ := unstructured.NestedMap(v.(map[string]any), "configMap"); ok {
			if n, ok := cm["name"].(string); ok {
				cm["name"] = hashSuffix.ReplaceAllString(n, "")
				_ = unstructured.SetNestedMap(v.(map[string]any), cm, "configMap")
			}
		}
	}
}
