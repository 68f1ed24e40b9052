// Package deploy_test renders every kustomization under deploy/ with kustomize (as a library),
// checks what a wrong manifest would get wrong at run time (probes, listeners, credentials,
// mounts, hardening, pinned images), and sends every rendered object to a real kube-apiserver
// with a server-side dry run and strict field validation, so a misspelt or misplaced field, a
// value the API rejects, or a Pod Security warning fails the test.
package deploy_test

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/watchsan/watchsan/internal/config"
	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/clustertest"
)

// watchsanImage is the image every watchsan container runs.
const watchsanImage = "ghcr.io/watchsan/watchsan"

// componentHosts names, for each kustomize Component, the kustomization it is rendered with in
// the test (a Component cannot be built alone).
var componentHosts = map[string]string{
	"components/servicemonitor":      "base/ha",
	"components/identity-forwarding": "overlays/ha",
	"components/sidecar":             "examples/controller",
}

// rendering is the output of one kustomization.
type rendering struct {
	name string // its directory under deploy/, or "HOST+COMPONENT"
	objs []*unstructured.Unstructured
}

var (
	renderOnce sync.Once
	rendered   []rendering
	renderErr  error
)

// renderAll builds every kustomization under deploy/ (and every component with its host).
func renderAll(t *testing.T) []rendering {
	t.Helper()
	renderOnce.Do(func() { rendered, renderErr = doRenderAll() })
	if renderErr != nil {
		t.Fatal(renderErr)
	}
	return rendered
}

func doRenderAll() ([]rendering, error) {
	var dirs []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "kustomization.yaml" {
			return err
		}
		dirs = append(dirs, filepath.Dir(p))
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(dirs)
	var out []rendering
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
		if err != nil {
			return nil, err
		}
		var k struct{ Kind string }
		if err := yaml.Unmarshal(data, &k); err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
		var r rendering
		switch k.Kind {
		case "", "Kustomization":
			r, err = render(dir, dir, types.LoadRestrictionsRootOnly)
		case "Component":
			host, ok := componentHosts[dir]
			if !ok {
				return nil, fmt.Errorf("component %s: name the kustomization to render it with in componentHosts", dir)
			}
			r, err = renderComponent(host, dir)
		default:
			return nil, fmt.Errorf("%s: unknown kind %q", dir, k.Kind)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	if len(out) < 3 {
		return nil, fmt.Errorf("found only %d kustomizations under deploy/", len(out))
	}
	// The Helm chart's renderings go through the same checks.
	hr, err := helmRenderings()
	if err != nil {
		return nil, err
	}
	return append(out, hr...), nil
}

// renderComponent renders host with component added, from a kustomization in a temporary
// directory that names both and sets the host's namespace.
func renderComponent(host, component string) (rendering, error) {
	h, err := render(host, host, types.LoadRestrictionsRootOnly)
	if err != nil {
		return rendering{}, err
	}
	nss := h.all("Namespace")
	if len(nss) != 1 {
		return rendering{}, fmt.Errorf("%s, the host of %s, should create one namespace, not %d", host, component, len(nss))
	}
	absHost, err := filepath.Abs(host)
	if err != nil {
		return rendering{}, err
	}
	absComp, err := filepath.Abs(component)
	if err != nil {
		return rendering{}, err
	}
	dir, err := os.MkdirTemp("", "watchsan-deploy-")
	if err != nil {
		return rendering{}, err
	}
	defer os.RemoveAll(dir)
	// kustomize takes no absolute paths, and a temporary directory keeps deploy/ untouched.
	relHost, err := filepath.Rel(dir, absHost)
	if err != nil {
		return rendering{}, err
	}
	relComp, err := filepath.Rel(dir, absComp)
	if err != nil {
		return rendering{}, err
	}
	// As an operator's overlay would, it sets the namespace.
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: %s\nresources:\n- %s\ncomponents:\n- %s\n",
		nss[0].GetName(), relHost, relComp)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		return rendering{}, err
	}
	return render(host+"+"+component, dir, types.LoadRestrictionsNone)
}

func render(name, dir string, lr types.LoadRestrictions) (rendering, error) {
	opts := krusty.MakeDefaultOptions()
	opts.LoadRestrictions = lr
	m, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return rendering{}, fmt.Errorf("kustomize build %s: %w", name, err)
	}
	r := rendering{name: name}
	for _, res := range m.Resources() {
		// Through JSON, so numbers are int64 as unstructured objects expect.
		data, err := res.MarshalJSON()
		if err != nil {
			return rendering{}, fmt.Errorf("%s: %w", name, err)
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(data); err != nil {
			return rendering{}, fmt.Errorf("%s: %w", name, err)
		}
		r.objs = append(r.objs, obj)
	}
	return r, nil
}

func (r rendering) find(kind, name string) *unstructured.Unstructured {
	for _, o := range r.objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func (r rendering) all(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range r.objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func convert[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	v := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, v); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
	return v
}

// workload is a pod template and what owns it.
type workload struct {
	kind, name string
	ns         string // its namespace, as rendered
	replicas   int32
	tmpl       corev1.PodTemplateSpec
	selector   *metav1.LabelSelector
}

func workloads(t *testing.T, r rendering) []workload {
	t.Helper()
	var out []workload
	for _, o := range r.objs {
		switch o.GetKind() {
		case "Deployment":
			d := convert[appsv1.Deployment](t, o)
			replicas := int32(1)
			if d.Spec.Replicas != nil {
				replicas = *d.Spec.Replicas
			}
			out = append(out, workload{"Deployment", d.Name, d.Namespace, replicas, d.Spec.Template, d.Spec.Selector})
		case "DaemonSet":
			d := convert[appsv1.DaemonSet](t, o)
			out = append(out, workload{"DaemonSet", d.Name, d.Namespace, 0, d.Spec.Template, d.Spec.Selector})
		case "StatefulSet", "Job", "CronJob", "Pod", "ReplicaSet":
			t.Errorf("%s: %s %s: add this kind to the test's checks", r.name, o.GetKind(), o.GetName())
		}
	}
	return out
}

// TestRendered renders every kustomization and checks every workload in it. No cluster needed.
func TestRendered(t *testing.T) {
	sawSidecar, sawFrontend, sawNodeLocal := false, false, false
	for _, r := range renderAll(t) {
		t.Run(strings.ReplaceAll(r.name, "/", "_"), func(t *testing.T) {
			checkNamespaces(t, r)
			ws := workloads(t, r)
			if len(ws) == 0 {
				t.Fatalf("%s renders no workload", r.name)
			}
			for _, w := range ws {
				checkPodHardening(t, w)
				for _, c := range w.tmpl.Spec.InitContainers {
					if isWatchsan(c) {
						sawSidecar = true
						checkSidecar(t, r, w, c)
					}
				}
				for _, c := range w.tmpl.Spec.Containers {
					if !isWatchsan(c) {
						continue
					}
					cfg := checkWatchsan(t, r, w, c)
					switch {
					case w.kind == "Deployment" && !config.IsLoopback(cfg.Listen):
						sawFrontend = true
						checkFrontend(t, r, w, cfg)
					case w.kind == "DaemonSet":
						sawNodeLocal = true
						if !w.tmpl.Spec.HostNetwork || !config.IsLoopback(cfg.Listen) {
							t.Errorf("%s: the node-local proxy should listen on the node's loopback (hostNetwork, 127.0.0.1)", w.name)
						}
					}
				}
			}
		})
	}
	if !sawSidecar || !sawFrontend || !sawNodeLocal {
		t.Errorf("deploy/ should have a sidecar (%v), an HA frontend (%v) and a node-local DaemonSet (%v)", sawSidecar, sawFrontend, sawNodeLocal)
	}
}

// clusterScoped are the cluster-scoped kinds deploy/ may use.
var clusterScoped = map[string]bool{"Namespace": true, "ClusterRole": true, "ClusterRoleBinding": true, "CustomResourceDefinition": true}

// checkNamespaces: every namespaced object names a namespace the rendering creates, and every
// ServiceAccount a binding names is in the rendering, in that namespace (a component added by an
// overlay that sets no namespace, or an overlay that moves everything but a binding's subject,
// breaks that).
func checkNamespaces(t *testing.T, r rendering) {
	t.Helper()
	created := map[string]bool{}
	for _, o := range r.all("Namespace") {
		created[o.GetName()] = true
	}
	for _, o := range r.objs {
		switch {
		case clusterScoped[o.GetKind()] && o.GetNamespace() != "":
			t.Errorf("%s %s is cluster-scoped but has namespace %s", o.GetKind(), o.GetName(), o.GetNamespace())
		case !clusterScoped[o.GetKind()] && !created[o.GetNamespace()]:
			t.Errorf("%s %s: namespace %q is not created by this rendering", o.GetKind(), o.GetName(), o.GetNamespace())
		}
		if o.GetKind() != "RoleBinding" && o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		for _, s := range subjects {
			m, _ := s.(map[string]any)
			if m["kind"] != "ServiceAccount" {
				continue
			}
			name, ns := fmt.Sprint(m["name"]), fmt.Sprint(m["namespace"])
			if sa := r.find("ServiceAccount", name); sa == nil || sa.GetNamespace() != ns {
				t.Errorf("%s %s: subject ServiceAccount %s/%s is not in this rendering", o.GetKind(), o.GetName(), ns, name)
			}
		}
	}
}

func isWatchsan(c corev1.Container) bool {
	return strings.HasPrefix(c.Image, watchsanImage+":") || strings.HasPrefix(c.Image, watchsanImage+"@")
}

// checkPodHardening: every container has resources, a locked-down securityContext, and an image
// pinned by tag (or digest).
func checkPodHardening(t *testing.T, w workload) {
	t.Helper()
	ps := w.tmpl.Spec.SecurityContext
	all := append(slices.Clone(w.tmpl.Spec.InitContainers), w.tmpl.Spec.Containers...)
	for _, c := range all {
		where := fmt.Sprintf("%s %s container %s", w.kind, w.name, c.Name)
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := c.Resources.Requests[r]; !ok || q.IsZero() {
				t.Errorf("%s: no %s request", where, r)
			}
		}
		if q, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok || q.IsZero() {
			t.Errorf("%s: no memory limit", where)
		}
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("%s: no securityContext", where)
			continue
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: allowPrivilegeEscalation must be false", where)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: readOnlyRootFilesystem must be true", where)
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("%s: privileged", where)
		}
		nonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (sc.RunAsNonRoot == nil && ps != nil && ps.RunAsNonRoot != nil && *ps.RunAsNonRoot)
		if !nonRoot {
			t.Errorf("%s: runAsNonRoot must be true", where)
		}
		if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
			t.Errorf("%s: capabilities must drop ALL and add none", where)
		}
		seccomp := sc.SeccompProfile
		if seccomp == nil && ps != nil {
			seccomp = ps.SeccompProfile
		}
		if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: seccompProfile must be RuntimeDefault", where)
		}
		if !pinned(c.Image) {
			t.Errorf("%s: image %q is not pinned by a tag or digest", where, c.Image)
		}
	}
}

func pinned(image string) bool {
	if strings.Contains(image, "@sha256:") {
		return true
	}
	slash := strings.LastIndex(image, "/")
	colon := strings.LastIndex(image, ":")
	if colon < slash+1 {
		return false
	}
	tag := image[colon+1:]
	return tag != "" && tag != "latest"
}

// watchsanConfig loads a watchsan container's flags (and the --config file they name, from the
// rendered ConfigMap the path is mounted from) through watchsan's own flag parser, so a flag
// that does not exist or a bad value fails here.
func watchsanConfig(t *testing.T, r rendering, w workload, c corev1.Container) config.Config {
	t.Helper()
	if len(c.Command) > 0 {
		t.Errorf("%s: command %q replaces the image's entrypoint; give args only", c.Name, c.Command)
	}
	args := slices.Clone(c.Args)
	for i, a := range args {
		name, val, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name != "config" {
			continue
		}
		if !ok {
			t.Fatalf("%s: write --config=PATH as one argument", c.Name)
		}
		data, ok := mountedFile(t, r, w, c, val)
		if !ok {
			t.Fatalf("%s %s: --config %s is not in a ConfigMap rendered with it", w.kind, w.name, val)
		}
		tmp := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		args[i] = "--config=" + tmp
	}
	cfg, err := config.Load(args)
	if err != nil {
		t.Fatalf("%s %s: watchsan rejects its flags: %v", w.kind, w.name, err)
	}
	return cfg
}

// mount finds the volume mounted at the directory containing path.
func mount(w workload, c corev1.Container, path string) (corev1.Volume, string, bool) {
	for _, m := range c.VolumeMounts {
		if rel, ok := strings.CutPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/"); ok {
			for _, v := range w.tmpl.Spec.Volumes {
				if v.Name == m.Name {
					return v, rel, true
				}
			}
		}
	}
	return corev1.Volume{}, "", false
}

// mountedFile returns the content of a file mounted from a ConfigMap that is part of r.
func mountedFile(t *testing.T, r rendering, w workload, c corev1.Container, path string) ([]byte, bool) {
	t.Helper()
	v, rel, ok := mount(w, c, path)
	if !ok || v.ConfigMap == nil {
		return nil, false
	}
	key := rel
	if len(v.ConfigMap.Items) > 0 {
		key = ""
		for _, it := range v.ConfigMap.Items {
			if it.Path == rel {
				key = it.Key
			}
		}
	}
	cm := r.find("ConfigMap", v.ConfigMap.Name)
	if cm == nil {
		return nil, false
	}
	data, ok, _ := unstructured.NestedString(cm.Object, "data", key)
	return []byte(data), ok
}

// checkWatchsan checks a watchsan container wherever it runs and returns its configuration.
func checkWatchsan(t *testing.T, r rendering, w workload, c corev1.Container) config.Config {
	t.Helper()
	where := fmt.Sprintf("%s %s container %s", w.kind, w.name, c.Name)
	cfg := watchsanConfig(t, r, w, c)

	// Credentials: a listener others can reach must not lend the pod's identity (identity
	// forwarding never lends it: it asserts the identity of verified clients only).
	if !cfg.NoCredentials && cfg.IdentityForwarding == "" && !config.IsLoopback(cfg.Listen) {
		t.Errorf("%s: --listen %s is not loopback and credentials are lent (set no-credentials)", where, cfg.Listen)
	}
	if w.tmpl.Spec.HostNetwork && !cfg.NoCredentials {
		t.Errorf("%s: with hostNetwork every process on the node reaches the listener: set no-credentials", where)
	}

	// Files watchsan reads must be mounted.
	for flag, p := range map[string]string{
		"tls-cert-file": cfg.TLSCertFile, "tls-private-key-file": cfg.TLSKeyFile, "upstream-ca-file": cfg.UpstreamCAFile,
		"kubeconfig": cfg.Kubeconfig, "client-ca-file": cfg.ClientCAFile,
		"requestheader-client-cert-file": cfg.RequestHeaderClientCertFile, "requestheader-client-key-file": cfg.RequestHeaderClientKeyFile,
		"admin-auth-token-file": cfg.AdminAuthTokenFile,
	} {
		if p == "" {
			continue
		}
		v, rel, ok := mount(w, c, p)
		switch {
		case !ok:
			t.Errorf("%s: --%s %s is on no volume mount", where, flag, p)
		case v.Secret != nil && len(v.Secret.Items) == 0 && !slices.Contains([]string{"tls.crt", "tls.key", "ca.crt"}, rel):
			t.Errorf("%s: --%s %s: a kubernetes.io/tls Secret has tls.crt, tls.key (and ca.crt), not %s", where, flag, p, rel)
		case v.ConfigMap != nil && len(v.ConfigMap.Items) > 0 && !slices.ContainsFunc(v.ConfigMap.Items, func(k corev1.KeyToPath) bool { return k.Path == rel }):
			t.Errorf("%s: --%s %s: the ConfigMap volume %s projects no %s", where, flag, p, v.Name, rel)
		}
	}
	if (cfg.TLSCertFile != "") != (cfg.TLSKeyFile != "") {
		t.Errorf("%s: TLS certificate and key go together", where)
	}
	if cfg.IdentityForwarding == config.IdentityImpersonate && (w.tmpl.Spec.AutomountServiceAccountToken == nil || !*w.tmpl.Spec.AutomountServiceAccountToken) && cfg.Kubeconfig == "" {
		t.Errorf("%s: --identity-forwarding=impersonate impersonates with the pod's service account, but its token is not mounted", where)
	}
	if cfg.IdentityForwarding != "" && (cfg.ClientCAFile == "" || cfg.TLSCertFile == "") {
		t.Errorf("%s: --identity-forwarding needs --client-ca-file and TLS", where)
	}
	if !config.IsLoopback(cfg.Listen) && cfg.TLSCertFile == "" {
		t.Errorf("%s: --listen %s is reachable from other pods but serves plain HTTP: clients would send tokens in clear (or none at all)", where, cfg.Listen)
	}

	checkAdminAuth(t, r, w, c, cfg)

	// Probes: readiness on /readyz, liveness on /healthz, both on the admin listener, reached the
	// way the kubelet reaches it.
	adminHost, adminPort, err := net.SplitHostPort(cfg.AdminListen)
	if err != nil {
		t.Fatalf("%s: --admin-listen %q: %v", where, cfg.AdminListen, err)
	}
	for _, p := range []struct {
		kind  string
		probe *corev1.Probe
		path  string
	}{
		{"readiness", c.ReadinessProbe, "/readyz"},
		{"liveness", c.LivenessProbe, "/healthz"},
		{"startup", c.StartupProbe, ""},
	} {
		if p.probe == nil {
			if p.kind != "startup" {
				t.Errorf("%s: no %s probe", where, p.kind)
			}
			continue
		}
		g := p.probe.HTTPGet
		if g == nil {
			t.Errorf("%s: %s probe is not an HTTP GET", where, p.kind)
			continue
		}
		if p.path != "" && g.Path != p.path {
			t.Errorf("%s: %s probe path %s, want %s", where, p.kind, g.Path, p.path)
		}
		if port := probePort(c, g.Port); port != adminPort {
			t.Errorf("%s: %s probe goes to port %s, the admin listener is on %s", where, p.kind, port, adminPort)
		}
		switch {
		case g.Host == "" && config.IsLoopback(cfg.AdminListen) && !w.tmpl.Spec.HostNetwork:
			t.Errorf("%s: %s probe: the kubelet connects to the pod IP, but the admin listener is on %s", where, p.kind, adminHost)
		case g.Host != "" && !w.tmpl.Spec.HostNetwork:
			t.Errorf("%s: %s probe names host %s: the kubelet would connect to that address from the node, not to the pod", where, p.kind, g.Host)
		case g.Host != "" && adminHost != g.Host && !isWildcard(adminHost):
			t.Errorf("%s: %s probe connects to %s, the admin listener is on %s", where, p.kind, g.Host, adminHost)
		}
	}
	return cfg
}

// checkAdminAuth: an admin listener off loopback is checked (--admin-auth is not none), and
// watchsan has an identity to send its TokenReviews and SubjectAccessReviews with that the
// rendering allows to create both: the lent one (the pod's service account, mounted), or the
// pod's service account token projected for the reviews (--admin-auth-token-file). The rendering
// also shows whom to grant reading /debug/*: a ClusterRole with get on it.
func checkAdminAuth(t *testing.T, r rendering, w workload, c corev1.Container, cfg config.Config) {
	t.Helper()
	where := fmt.Sprintf("%s %s container %s", w.kind, w.name, c.Name)
	if config.IsLoopback(cfg.AdminListen) {
		return
	}
	if cfg.AdminAuthMode != config.AdminAuthDelegated {
		t.Errorf("%s: --admin-listen %s is not loopback and --admin-auth is %q: anyone who reaches the pod reads /debug/feeds", where, cfg.AdminListen, cfg.AdminAuthMode)
		return
	}
	if cfg.AdminAuthMetrics {
		t.Errorf("%s: --admin-auth-metrics: the probes' paths stay open, but Prometheus (the ServiceMonitor) scrapes /metrics without a token", where)
	}
	automounted := w.tmpl.Spec.AutomountServiceAccountToken == nil || *w.tmpl.Spec.AutomountServiceAccountToken
	switch {
	case cfg.AdminAuthTokenFile != "":
		v, rel, ok := mount(w, c, cfg.AdminAuthTokenFile)
		projected := ok && v.Projected != nil && slices.ContainsFunc(v.Projected.Sources, func(p corev1.VolumeProjection) bool {
			return p.ServiceAccountToken != nil && p.ServiceAccountToken.Path == rel && p.ServiceAccountToken.Audience == ""
		})
		if !projected {
			t.Errorf("%s: --admin-auth-token-file %s is not the pod's service account token, projected for the apiserver's audience", where, cfg.AdminAuthTokenFile)
		}
	case cfg.NoCredentials || cfg.IdentityForwarding != "" || cfg.Kubeconfig != "" || len(cfg.Upstreams) > 0 || !automounted:
		t.Errorf("%s: --admin-listen %s is not loopback and watchsan lends no in-cluster identity to review its readers' tokens with: give it --admin-auth-token-file (watchsan refuses to start)", where, cfg.AdminListen)
		return
	}
	sa := w.tmpl.Spec.ServiceAccountName
	for _, need := range [][2]string{{"authentication.k8s.io", "tokenreviews"}, {"authorization.k8s.io", "subjectaccessreviews"}} {
		if !granted(t, r, sa, w.namespace(r), func(rule rbacv1.PolicyRule) bool {
			return slices.Contains(rule.APIGroups, need[0]) && slices.Contains(rule.Resources, need[1]) && slices.Contains(rule.Verbs, "create")
		}) {
			t.Errorf("%s: service account %s may not create %s.%s: every admin review would be refused", where, sa, need[1], need[0])
		}
	}
	readable := false
	for _, o := range r.all("ClusterRole") {
		for _, rule := range convert[rbacv1.ClusterRole](t, o).Rules {
			if slices.Contains(rule.Verbs, "get") && slices.ContainsFunc(rule.NonResourceURLs, func(u string) bool {
				return u == "/debug/feeds" || u == "/debug/*"
			}) {
				readable = true
			}
		}
	}
	if !readable {
		t.Errorf("%s: no ClusterRole of the rendering grants get on nonResourceURL /debug/feeds: say whom to grant it", where)
	}
}

// namespace is the namespace w's pods run in: the rendering's own (one per rendering).
func (w workload) namespace(r rendering) string {
	if w.ns != "" {
		return w.ns
	}
	if nss := r.all("Namespace"); len(nss) == 1 {
		return nss[0].GetName()
	}
	return ""
}

// granted reports whether a ClusterRoleBinding of r binds the ServiceAccount ns/sa to a
// ClusterRole of r with a rule that ok accepts.
func granted(t *testing.T, r rendering, sa, ns string, ok func(rbacv1.PolicyRule) bool) bool {
	t.Helper()
	for _, o := range r.all("ClusterRoleBinding") {
		b := convert[rbacv1.ClusterRoleBinding](t, o)
		if b.RoleRef.Kind != "ClusterRole" || !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == ns
		}) {
			continue
		}
		if role := r.find("ClusterRole", b.RoleRef.Name); role != nil && slices.ContainsFunc(convert[rbacv1.ClusterRole](t, role).Rules, ok) {
			return true
		}
	}
	return false
}

func isWildcard(host string) bool {
	ip := net.ParseIP(host)
	return host == "" || (ip != nil && ip.IsUnspecified())
}

// probePort resolves a probe's port (a number or a container port's name) to a number.
func probePort(c corev1.Container, p intstr.IntOrString) string {
	if p.IntValue() > 0 {
		return strconv.Itoa(p.IntValue())
	}
	for _, cp := range c.Ports {
		if cp.Name == p.String() {
			return strconv.Itoa(int(cp.ContainerPort))
		}
	}
	return "(no port named " + p.String() + ")"
}

// checkSidecar: watchsan as a native sidecar that lends the pod's identity on loopback to the
// other containers, which find it through their kubeconfig.
func checkSidecar(t *testing.T, r rendering, w workload, c corev1.Container) {
	t.Helper()
	where := fmt.Sprintf("%s %s sidecar %s", w.kind, w.name, c.Name)
	if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("%s: an init container without restartPolicy: Always is not a sidecar: the pod would wait for it to exit", where)
	}
	if c.StartupProbe == nil {
		t.Errorf("%s: no startupProbe: the controller would start before watchsan listens", where)
	}
	cfg := checkWatchsan(t, r, w, c)
	if !config.IsLoopback(cfg.Listen) || cfg.TLSCertFile != "" {
		t.Errorf("%s: a sidecar listens on loopback, plain HTTP (got %s)", where, cfg.Listen)
	}
	if cfg.NoCredentials || len(cfg.Upstreams) > 0 || cfg.Kubeconfig != "" {
		t.Errorf("%s: the sidecar is meant to lend the pod's service account (in-cluster config)", where)
	}
	if w.tmpl.Spec.AutomountServiceAccountToken != nil && !*w.tmpl.Spec.AutomountServiceAccountToken {
		t.Errorf("%s: the sidecar lends the service account token, but the pod does not mount it", where)
	}
	want := "http://" + cfg.Listen
	clients := 0
	for _, other := range w.tmpl.Spec.Containers {
		for _, e := range other.Env {
			if e.Name != "KUBECONFIG" {
				continue
			}
			clients++
			data, ok := mountedFile(t, r, w, other, e.Value)
			if !ok {
				t.Errorf("%s: container %s: KUBECONFIG %s is not mounted from a ConfigMap of this rendering", where, other.Name, e.Value)
				continue
			}
			kc, err := clientcmd.Load(data)
			if err != nil {
				t.Errorf("%s: container %s: kubeconfig: %v", where, other.Name, err)
				continue
			}
			rc, err := clientcmd.NewDefaultClientConfig(*kc, nil).ClientConfig()
			if err != nil {
				t.Errorf("%s: container %s: kubeconfig: %v", where, other.Name, err)
				continue
			}
			if rc.Host != want {
				t.Errorf("%s: container %s's kubeconfig server is %s, watchsan listens on %s", where, other.Name, rc.Host, want)
			}
			if rc.BearerToken != "" || rc.BearerTokenFile != "" || rc.CertFile != "" || len(rc.CertData) > 0 {
				t.Errorf("%s: container %s's kubeconfig carries credentials; watchsan lends the pod's", where, other.Name)
			}
		}
	}
	if clients == 0 {
		t.Errorf("%s: no container of the pod has a KUBECONFIG pointing at watchsan", where)
	}
}

// checkFrontend: several replicas spread over nodes, drained before they stop, behind a Service
// and a PodDisruptionBudget.
func checkFrontend(t *testing.T, r rendering, w workload, cfg config.Config) {
	t.Helper()
	where := fmt.Sprintf("%s %s", w.kind, w.name)
	if w.replicas < 2 {
		t.Errorf("%s: %d replicas: an HA frontend needs at least 2", where, w.replicas)
	}
	if a := w.tmpl.Spec.Affinity; a == nil || a.PodAntiAffinity == nil ||
		len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution)+len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) == 0 {
		t.Errorf("%s: no pod anti-affinity: replicas may share a node", where)
	}
	if cfg.ShutdownDelay <= 0 {
		t.Errorf("%s: --shutdown-delay is 0: clients are sent to a replica that has stopped accepting", where)
	}
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if g := w.tmpl.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = *g
	}
	if need := cfg.ShutdownDelay + cfg.ShutdownTimeout; time.Duration(grace)*time.Second <= need {
		t.Errorf("%s: terminationGracePeriodSeconds %d does not cover shutdown-delay + shutdown-timeout (%s): watchsan would be killed mid-drain", where, grace, need)
	}
	podLabels := labels.Set(w.tmpl.Labels)
	selects := func(sel *metav1.LabelSelector) bool {
		s, err := metav1.LabelSelectorAsSelector(sel)
		return err == nil && !s.Empty() && s.Matches(podLabels)
	}
	if !selects(w.selector) {
		t.Errorf("%s: its selector does not match its pods", where)
	}
	pdbs := 0
	for _, o := range r.all("PodDisruptionBudget") {
		if selects(convert[policyv1.PodDisruptionBudget](t, o).Spec.Selector) {
			pdbs++
		}
	}
	if pdbs != 1 {
		t.Errorf("%s: %d PodDisruptionBudgets select its pods, want 1", where, pdbs)
	}
	_, listenPort, _ := net.SplitHostPort(cfg.Listen)
	served := false
	for _, o := range r.all("Service") {
		s := convert[corev1.Service](t, o)
		if len(s.Spec.Selector) == 0 || !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) {
			continue
		}
		for _, sp := range s.Spec.Ports {
			for _, c := range w.tmpl.Spec.Containers {
				if isWatchsan(c) && probePort(c, sp.TargetPort) == listenPort {
					served = true
				}
			}
		}
	}
	if !served {
		t.Errorf("%s: no Service sends to the main listener's port %s", where, listenPort)
	}
	// A NetworkPolicy that selects the pods must let clients reach the main listener.
	var c corev1.Container
	for _, cc := range w.tmpl.Spec.Containers {
		if isWatchsan(cc) {
			c = cc
		}
	}
	for _, o := range r.all("NetworkPolicy") {
		np := convert[networkingv1.NetworkPolicy](t, o)
		if !selects(&np.Spec.PodSelector) {
			continue
		}
		open := false
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if p.Port != nil && probePort(c, *p.Port) == listenPort && len(rule.From) == 0 {
					open = true
				}
			}
		}
		if !open {
			t.Errorf("%s: NetworkPolicy %s does not admit clients from everywhere to port %s", where, np.Name, listenPort)
		}
	}
}

// dryRunner sends objects to the test apiserver.
type dryRunner struct {
	dyn      dynamic.Interface
	mapper   *restmapper.DeferredDiscoveryRESTMapper
	mu       sync.Mutex
	warnings []string
}

func (d *dryRunner) HandleWarningHeader(code int, agent, text string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.warnings = append(d.warnings, text)
}

func (d *dryRunner) takeWarnings() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.warnings
	d.warnings = nil
	return w
}

func (d *dryRunner) resource(o *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := o.GroupVersionKind()
	m, err := d.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", gvk, err)
	}
	if m.Scope.Name() == "namespace" {
		if o.GetNamespace() == "" {
			return nil, fmt.Errorf("%s %s has no namespace", o.GetKind(), o.GetName())
		}
		return d.dyn.Resource(m.Resource).Namespace(o.GetNamespace()), nil
	}
	return d.dyn.Resource(m.Resource), nil
}

// newDryRunner is a dryRunner with the admin's identity on apiserver 0 of c.
func newDryRunner(t *testing.T, c *cluster.Cluster) *dryRunner {
	t.Helper()
	d := &dryRunner{}
	cfg := c.RESTConfig(0, c.AdminToken)
	cfg.WarningHandler = d
	var err error
	if d.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	return d
}

// create creates o for real (dryRun false) or with dryRun=All, with strict field validation.
func (d *dryRunner) create(ctx context.Context, o *unstructured.Unstructured, dryRun bool) error {
	ri, err := d.resource(o)
	if err != nil {
		return err
	}
	opts := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = ri.Create(ctx, o.DeepCopy(), opts)
	return err
}

// TestServerDryRun sends every rendered object to a real kube-apiserver: namespaces are created,
// everything else is created with dryRun=All and fieldValidation=Strict, so the apiserver runs
// its defaulting, validation and admission (Pod Security included) without storing anything.
// Any error or warning fails the test.
func TestServerDryRun(t *testing.T) {
	renderings := renderAll(t)
	start := time.Now()
	c := clustertest.Start(t, cluster.Options{})
	t.Logf("apiserver ready in %s", time.Since(start).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	d := newDryRunner(t, c)

	// The ServiceMonitor's CRD, as a cluster with the Prometheus Operator has it.
	installCRD(ctx, t, d, "testdata/servicemonitor-crd.yaml")

	// The harness really rejects what it should: an unknown field in a Deployment.
	bad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": "bad", "namespace": "default"},
		"spec": map[string]any{
			"selector": map[string]any{"matchLabels": map[string]any{"a": "b"}},
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"a": "b"}},
				"spec": map[string]any{"containers": []any{map[string]any{
					"name": "c", "image": "example.test/c:1", "readinessProbe": map[string]any{"httpGet": map[string]any{"port": int64(1), "pathh": "/"}},
				}}},
			},
		},
	}}
	if err := d.create(ctx, bad, true); err == nil || !strings.Contains(err.Error(), "pathh") {
		t.Fatalf("the dry run accepted an unknown field (err %v): the test would not catch a wrong manifest", err)
	}

	total := 0
	for _, r := range renderings {
		t.Run(strings.ReplaceAll(r.name, "/", "_"), func(t *testing.T) {
			for _, o := range r.objs {
				if o.GetKind() != "Namespace" {
					continue
				}
				if err := d.create(ctx, o, false); err != nil && !apierrors.IsAlreadyExists(err) {
					t.Errorf("Namespace %s: %v", o.GetName(), err)
				}
				for _, w := range d.takeWarnings() {
					t.Errorf("Namespace %s: warning: %s", o.GetName(), w)
				}
			}
			for _, o := range r.objs {
				if o.GetKind() == "Namespace" {
					continue
				}
				err := d.create(ctx, o, true)
				if err != nil {
					t.Errorf("%s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
				}
				for _, w := range d.takeWarnings() {
					t.Errorf("%s %s/%s: warning: %s", o.GetKind(), o.GetNamespace(), o.GetName(), w)
				}
				total++
			}
		})
	}
	t.Logf("%d objects from %d renderings dry-run in %s (apiserver start included)", total, len(renderings), time.Since(start).Round(time.Millisecond))
}

func installCRD(ctx context.Context, t *testing.T, d *dryRunner, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &crd.Object); err != nil {
		t.Fatal(err)
	}
	if err := d.create(ctx, crd, false); err != nil {
		t.Fatalf("CRD %s: %v", crd.GetName(), err)
	}
	crds := d.dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	for {
		got, err := crds.Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				d.mapper.Reset()
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("CRD %s not established: %v", crd.GetName(), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestIdentityForwardingComponent: with components/identity-forwarding the frontend forwards
// verified client identities by impersonation, with the service account the ClusterRole is
// bound to; without it, the frontend forwards none. No cluster needed.
func TestIdentityForwardingComponent(t *testing.T) {
	modes := map[string]string{}
	for _, r := range renderAll(t) {
		for _, w := range workloads(t, r) {
			if w.name != "watchsan-frontend" {
				continue
			}
			for _, c := range w.tmpl.Spec.Containers {
				if !isWatchsan(c) {
					continue
				}
				cfg := watchsanConfig(t, r, w, c)
				modes[r.name] = cfg.IdentityForwarding
				if cfg.IdentityForwarding == "" {
					continue
				}
				crb := r.find("ClusterRoleBinding", "watchsan-identity-forwarding")
				if crb == nil {
					t.Fatalf("%s: identity forwarding without the impersonate binding", r.name)
				}
				b := convert[rbacv1.ClusterRoleBinding](t, crb)
				if len(b.Subjects) != 1 || b.Subjects[0].Name != w.tmpl.Spec.ServiceAccountName {
					t.Errorf("%s: the impersonate binding names %v, the frontend runs as %s", r.name, b.Subjects, w.tmpl.Spec.ServiceAccountName)
				}
			}
		}
	}
	if modes["overlays/ha+components/identity-forwarding"] != config.IdentityImpersonate || modes["overlays/ha-identity-forwarding"] != config.IdentityImpersonate ||
		modes["base/ha"] != "" || modes["overlays/ha"] != "" {
		t.Errorf("identity forwarding per rendering: %v; want impersonate with the component only", modes)
	}
}

// TestComponentsHaveUsage: a kustomize Component cannot be built alone, so every one under
// components/ is listed in the `components:` of a Kustomization under deploy/ (an overlay or an
// example the README points to), which renders and applies like the others. No cluster needed.
func TestComponentsHaveUsage(t *testing.T) {
	used := map[string]string{}
	components := 0
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "kustomization.yaml" {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var k struct {
			Kind       string
			Components []string
		}
		if err := yaml.Unmarshal(data, &k); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if k.Kind == "Component" {
			components++
			return nil
		}
		for _, c := range k.Components {
			used[filepath.Clean(filepath.Join(filepath.Dir(p), c))] = filepath.Dir(p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for c := range componentHosts {
		if _, ok := used[c]; !ok {
			t.Errorf("%s is listed by no kustomization under deploy/: add an overlay or example that uses it (a Component is never built alone)", c)
		}
	}
	if components != len(componentHosts) {
		t.Errorf("%d components under deploy/, %d in componentHosts", components, len(componentHosts))
	}
	t.Logf("components and where they are used: %v", used)
}

// The tier overlay's node-local proxies reach the frontend tier, not the apiservers: their one
// upstream is the frontends' Service by its cluster DNS name and port as rendered, verified with
// the frontends' CA (the ConfigMap watchsan-frontend-ca, which the overlay's comment says to
// create), and the frontends still reach the apiservers.
func TestTierOverlay(t *testing.T) {
	var tier *rendering
	for _, r := range renderAll(t) {
		if r.name == "overlays/tier" {
			tier = &r
		}
	}
	if tier == nil {
		t.Fatal("no overlays/tier rendered")
	}
	svc := tier.find("Service", "watchsan-frontend")
	if svc == nil {
		t.Fatal("overlays/tier renders no frontend Service")
	}
	s := convert[corev1.Service](t, svc)
	want := fmt.Sprintf("https://%s.%s.svc:%d", s.Name, s.Namespace, s.Spec.Ports[0].Port)
	sawNode, sawFrontend := false, false
	for _, w := range workloads(t, *tier) {
		for _, c := range w.tmpl.Spec.Containers {
			if !isWatchsan(c) {
				continue
			}
			cfg := watchsanConfig(t, *tier, w, c)
			switch w.kind {
			case "DaemonSet":
				sawNode = true
				if len(cfg.Upstreams) != 1 || cfg.Upstreams[0] != want {
					t.Errorf("the node-local proxy's upstreams are %v, want the frontends' Service %s", cfg.Upstreams, want)
				}
				ca := false
				for _, v := range w.tmpl.Spec.Volumes {
					if v.Name == "upstream-ca" && v.ConfigMap != nil && v.ConfigMap.Name == "watchsan-frontend-ca" {
						ca = true
					}
				}
				if !ca {
					t.Errorf("the node-local proxy does not verify its upstream with the frontends' CA (volume upstream-ca from ConfigMap watchsan-frontend-ca)")
				}
			case "Deployment":
				sawFrontend = true
				if len(cfg.Upstreams) == 0 || cfg.Upstreams[0] != "https://kubernetes.default.svc:443" {
					t.Errorf("the frontends' upstreams are %v, want the apiservers", cfg.Upstreams)
				}
			}
		}
	}
	if !sawNode || !sawFrontend {
		t.Errorf("overlays/tier should run a node-local DaemonSet (%v) and the frontends (%v)", sawNode, sawFrontend)
	}
}
