package node_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/clustertest"
	"github.com/watchsan/watchsan/test/cluster/node"
	"github.com/watchsan/watchsan/test/cluster/node/nodetest"
)

const frontendNS = "watchsan-system"

// TestFrontendPod runs deploy/overlays/ha's frontend on the real node, one replica, and checks
// it as the kubelet runs it: Ready through its probes, its TLS Secret (mode 0440, readable
// through fsGroup) and the cluster CA mounted and read by the nonroot user, a client's request
// served through it with the client's own token, and the container against what the manifest
// promises (checkRunning). Patched only for this machine: hostNetwork with free ports and
// probes on 127.0.0.1 (no CNI; nothing may connect to the node's address), so the namespace's
// Pod Security level is privileged; one replica (host ports); the upstream the apiserver on
// loopback (no kube-proxy).
func TestFrontendPod(t *testing.T) {
	nodetest.Skip(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := clustertest.Start(t, cluster.Options{})
	n := nodetest.Start(t, c, node.Options{})
	cs, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{cluster.Scheduler, cluster.ControllerManager} {
		if _, err := c.StartComponent(ctx, name, cluster.ComponentOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	wsTar, wsRef, err := node.WatchsanImage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Import(ctx, wsTar); err != nil {
		t.Fatal(err)
	}
	ports, err := node.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	listen, admin := ports[0], ports[1]
	manifests := renderFrontend(t, wsRef, listen, admin, c.APIServers[0].Port)
	kubeconfig := filepath.Join(c.Dir, "admin.kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(c.Dir, "frontend.yaml")
	if err := os.WriteFile(file, manifests, 0o600); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, stderr, err := c.Kubectl(ctx, kubeconfig, "apply", "-f", file); err != nil {
		t.Fatalf("kubectl apply: %v (%s)", err, stderr)
	}
	// The serving certificate, as the README says: a kubernetes.io/tls Secret.
	cert, key, err := c.CA.IssueServing("watchsan-frontend")
	if err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := c.Kubectl(ctx, kubeconfig, "-n", frontendNS, "create", "secret", "tls", "watchsan-frontend-tls", "--cert="+cert, "--key="+key); err != nil {
		t.Fatalf("kubectl create secret tls: %v (%s)", err, stderr)
	}
	pod := waitDeploymentPod(ctx, t, cs, frontendNS, "watchsan")
	t.Logf("frontend pod %s Ready %.1fs after kubectl apply", pod.Name, time.Since(t0).Seconds())

	// A client with its own token, through the frontend's TLS listener.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.CAData)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://127.0.0.1:"+strconv.Itoa(listen)+"/api/v1/namespaces/"+frontendNS, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.AdminToken)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("a request through the frontend: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a request through the frontend: %s", resp.Status)
	}

	running, err := cs.CoreV1().Pods(frontendNS).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("running as the kubelet applied it: %s", checkRunning(ctx, t, n, running, "watchsan"))
	t.Logf("the kubelet's failed probes of watchsan (Unhealthy events): %v", probeFailures(ctx, t, cs, running, "watchsan"))

	// The probes do what the manifest says when watchsan stops answering: frozen (SIGSTOP),
	// readiness (every 2 s, 2 failures, 1 s timeout) takes the pod out of the Service within
	// seconds; liveness (every 10 s, 3 failures) has the kubelet restart it within about 30 s.
	// Then SIGCONT: watchsan finds the kubelet's SIGTERM, ends (after --shutdown-delay) and
	// is started again.
	var id string
	for _, st := range running.Status.ContainerStatuses {
		if st.Name == "watchsan" {
			id = st.ContainerID
		}
	}
	pid, err := n.ContainerPid(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	tStop := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	continued := false
	defer func() {
		if !continued {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}()
	waitPod(ctx, t, cs, frontendNS, pod.Name, "NotReady", func(p *corev1.Pod) bool { return !nodetest.PodReady(p) })
	tNotReady := time.Now()
	if err := nodetest.Poll(ctx, func() error {
		if probeEvents(ctx, t, cs, running, "watchsan")["Killing"] == 0 {
			return errNotYet
		}
		return nil
	}); err != nil {
		t.Fatalf("the kubelet never decided to restart the frozen watchsan: %v", err)
	}
	tKill := time.Now()
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	continued = true
	back := waitPod(ctx, t, cs, frontendNS, pod.Name, "restarted and Ready", func(p *corev1.Pod) bool {
		for _, st := range p.Status.ContainerStatuses {
			if st.Name == "watchsan" && st.RestartCount == 1 {
				return nodetest.PodReady(p)
			}
		}
		return false
	})
	t.Logf("watchsan frozen: NotReady after %.1fs, the kubelet's liveness restart decided after %.1fs, restarted and Ready %.1fs after SIGCONT; probe failures %v",
		tNotReady.Sub(tStop).Seconds(), tKill.Sub(tStop).Seconds(), time.Since(tKill).Seconds(), probeEvents(ctx, t, cs, back, "watchsan"))
	if d := tNotReady.Sub(tStop); d > 10*time.Second {
		t.Errorf("the pod went NotReady %.1fs after watchsan froze; its readiness probe (2 s, 2 failures) should take under 10 s", d.Seconds())
	}
	if d := tKill.Sub(tStop); d > 45*time.Second {
		t.Errorf("the kubelet decided to restart the frozen watchsan after %.1fs; its liveness probe (10 s, 3 failures) should take under 45 s", d.Seconds())
	}
}

// waitPod waits until the pod satisfies ok and returns it.
func waitPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name, what string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	if err := nodetest.Poll(ctx, func() error {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !ok(p) {
			return fmt.Errorf("pod %s: %s", name, statusSummary(p))
		}
		pod = p
		return nil
	}); err != nil {
		t.Fatalf("pod %s/%s never %s: %v", ns, name, what, err)
	}
	return pod
}

// renderFrontend renders deploy/overlays/ha and patches it for this machine (see
// TestFrontendPod).
func renderFrontend(t *testing.T, image string, listen, admin, apiserverPort int) []byte {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(repoRoot(t), "deploy", "overlays", "ha"))
	if err != nil {
		t.Fatalf("kustomize build deploy/overlays/ha: %v", err)
	}
	var out []byte
	sawDeployment := false
	for _, res := range m.Resources() {
		data, err := res.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		switch res.GetKind() {
		case "Namespace":
			var ns corev1.Namespace
			mustUnmarshal(t, data, &ns)
			ns.Labels["pod-security.kubernetes.io/enforce"] = "privileged"
			delete(ns.Labels, "pod-security.kubernetes.io/warn")
			data = mustMarshal(t, &ns)
		case "ConfigMap":
			var cm corev1.ConfigMap
			mustUnmarshal(t, data, &cm)
			patchFrontendConfig(t, &cm, listen, admin, []int{apiserverPort})
			data = mustMarshal(t, &cm)
		case "Deployment":
			var d appsv1.Deployment
			mustUnmarshal(t, data, &d)
			patchFrontendDeployment(t, &d, image, listen, admin)
			sawDeployment = true
			data = mustMarshal(t, &d)
		}
		y, err := yaml.JSONToYAML(data)
		if err != nil {
			t.Fatal(err)
		}
		out = append(append(out, "---\n"...), y...)
	}
	if !sawDeployment {
		t.Fatal("deploy/overlays/ha renders no Deployment")
	}
	return out
}

// patchFrontendConfig points the frontend's config file (in its generated ConfigMap) at this
// machine: its listeners on loopback at the given ports, the apiservers on loopback as its
// upstreams.
func patchFrontendConfig(t *testing.T, cm *corev1.ConfigMap, listen, admin int, apiserverPorts []int) {
	t.Helper()
	cfgText, ok := cm.Data["config.yaml"]
	if !ok {
		return
	}
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(cfgText), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["listen"] = "127.0.0.1:" + strconv.Itoa(listen)
	cfg["admin-listen"] = "127.0.0.1:" + strconv.Itoa(admin)
	var ups []any
	for _, p := range apiserverPorts {
		ups = append(ups, "https://127.0.0.1:"+strconv.Itoa(p))
	}
	cfg["upstream"] = ups
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["config.yaml"] = string(b)
}

// patchFrontendDeployment makes the frontend's Deployment run here: one replica, hostNetwork,
// the given ports, the probes on 127.0.0.1, the image the test built.
func patchFrontendDeployment(t *testing.T, d *appsv1.Deployment, image string, listen, admin int) {
	t.Helper()
	one := int32(1)
	d.Spec.Replicas = &one
	spec := &d.Spec.Template.Spec
	spec.HostNetwork = true
	if len(spec.Containers) != 1 {
		t.Fatalf("deploy/overlays/ha: %d containers, want 1", len(spec.Containers))
	}
	ct := &spec.Containers[0]
	ct.Image = image
	for i := range ct.Ports {
		switch ct.Ports[i].Name {
		case "https":
			ct.Ports[i].ContainerPort = int32(listen)
		case "admin":
			ct.Ports[i].ContainerPort = int32(admin)
		default:
			t.Fatalf("deploy/overlays/ha: port %s unknown to the test", ct.Ports[i].Name)
		}
	}
	for _, pr := range []*corev1.Probe{ct.StartupProbe, ct.ReadinessProbe, ct.LivenessProbe} {
		if pr != nil && pr.HTTPGet != nil {
			if pr.HTTPGet.Port != intstr.FromString("admin") {
				t.Fatalf("deploy/overlays/ha: a probe goes to port %s, not admin", pr.HTTPGet.Port.String())
			}
			pr.HTTPGet.Host = "127.0.0.1"
		}
	}
}
