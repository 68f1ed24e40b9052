// Package node_test runs watchsan's deploy/ manifests on a real node (test/cluster/node): a
// real kubelet starts, probes and stops the pods, from the image `make image` builds.
// `make test-node` runs it; it needs root, runc and the binaries of hack/cluster-bins.sh.
package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/clustertest"
	"github.com/watchsan/watchsan/test/cluster/node"
	"github.com/watchsan/watchsan/test/cluster/node/nodetest"
)

const (
	sidecarNS         = "watchsan-example"
	sidecarDeployment = "example-controller"
	// shutdownDelay is the sidecar's --shutdown-delay in this test: its pod's deletion must take
	// at least this long after the controller has exited, and watchsan must exit 0 after it.
	shutdownDelay = 3 * time.Second
	kcmImage      = "watchsan.test/kube-controller-manager:v1.37.2"
)

// TestSidecarForReal applies deploy/overlays/sidecar to a real node with
// kube-controller-manager as the controller (its deployment controller only, its kubeconfig
// the overlay's, pointing at the sidecar), patched only where this machine needs it (below),
// and shows: the kubelet holds the controller back while watchsan is not ready (its upstream,
// a second apiserver, frozen), and starts it only after watchsan's /readyz turned 200 (native
// sidecar order); the controller, through watchsan, scales a Deployment after watchsan's
// upstream restarted and after it was frozen; deleting the pod stops the controller first and watchsan after it, which exits 0
// once its --shutdown-delay is over, all within the grace period.
func TestSidecarForReal(t *testing.T) {
	nodetest.Skip(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// --request-timeout bounds how long a SIGTERMed apiserver waits for open requests (the
	// controllers' watches) before it exits: 60 s by default.
	// Two apiservers: the kubelet, the scheduler, the cluster's controller manager and the test
	// talk to apiserver 0; the sidecar's watchsan has apiserver 1 as its upstream, which the
	// test freezes, restarts and freezes again.
	c := clustertest.Start(t, cluster.Options{APIServers: 2, APIServerFlags: []string{"--shutdown-delay-duration=1s", "--request-timeout=6s"}})
	n := nodetest.Start(t, c, node.Options{})
	cs, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartComponent(ctx, cluster.Scheduler, cluster.ComponentOptions{}); err != nil {
		t.Fatal(err)
	}
	// The cluster's own controller manager, every controller: it makes the sidecar
	// Deployment's ReplicaSet. Once that pod runs, it loses its deployment controller to the
	// one in the pod.
	kcm, err := c.StartComponent(ctx, cluster.ControllerManager, cluster.ComponentOptions{})
	if err != nil {
		t.Fatal(err)
	}

	t0 := time.Now()
	wsTar, wsRef, err := node.WatchsanImage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kcmBin, err := cluster.Binary(cluster.ControllerManager)
	if err != nil {
		t.Fatal(err)
	}
	kcmTar, err := node.Image(ctx, node.ImageOptions{Binary: kcmBin, Ref: kcmImage, Path: "/kube-controller-manager"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tar := range []string{wsTar, kcmTar} {
		if err := n.Import(ctx, tar); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("images (make image: %s; %s) built and imported in %.1fs", wsRef, kcmImage, time.Since(t0).Seconds())

	ports, err := node.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	listen, admin := ports[0], ports[1]
	manifests := renderSidecar(t, sidecarPatch{
		watchsanImage: wsRef, listenPort: listen, adminPort: admin,
		apiserverPort: c.APIServers[1].Port,
	})
	up := c.APIServers[1]
	kubeconfig := filepath.Join(c.Dir, "admin.kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(c.Dir, "sidecar.yaml")
	if err := os.WriteFile(file, manifests, 0o600); err != nil {
		t.Fatal(err)
	}

	// Watch watchsan's /readyz from the test from before the pod exists: the first 200 is when
	// the sidecar became ready, to compare with the controller's first log line.
	readyAt := make(chan time.Time, 1)
	go func() {
		url := "http://127.0.0.1:" + strconv.Itoa(admin) + "/readyz"
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if httpOK(ctx, url) == nil {
				readyAt <- time.Now()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	// Native sidecar order, made observable: watchsan's upstream is frozen (SIGSTOP) before the
	// pod exists, so its /readyz answers 503 and its startupProbe fails; the kubelet must hold
	// the controller back until the upstream is thawed and watchsan is ready.
	if err := up.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	tApply := time.Now()
	if _, stderr, err := c.Kubectl(ctx, kubeconfig, "apply", "-f", file); err != nil {
		t.Fatalf("kubectl apply: %v (%s)", err, stderr)
	}
	held := holdController(ctx, t, cs, n, up, "http://127.0.0.1:"+strconv.Itoa(admin))
	if held == nil {
		t.FailNow()
	}
	tThawed := time.Now()
	pod := waitDeploymentPod(ctx, t, cs, sidecarNS, sidecarDeployment)
	t.Logf("sidecar pod %s Ready %.1fs after kubectl apply, %.1fs after watchsan's upstream was thawed",
		pod.Name, time.Since(tApply).Seconds(), time.Since(tThawed).Seconds())

	var wsReady time.Time
	select {
	case wsReady = <-readyAt:
	case <-ctx.Done():
		t.Fatal("watchsan's /readyz never answered 200")
	}
	if !wsReady.After(tThawed) {
		t.Errorf("watchsan's /readyz answered 200 at %s, while its upstream was frozen (until %s): the hold proves nothing",
			wsReady.Format(time.RFC3339Nano), tThawed.Format(time.RFC3339Nano))
	}
	logs := newPodLogs(n, pod)
	var ctrlLines []logLine
	if err := nodetest.Poll(ctx, func() error {
		if ctrlLines = logs.read(t, "controller"); len(ctrlLines) == 0 {
			entries, _ := filepath.Glob(filepath.Join(logs.dir, "*", "*"))
			return fmt.Errorf("the controller has logged nothing yet (log files: %v)", entries)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctrlStart := ctrlLines[0].ts
	// When the kubelet asked containerd to start the controller's container.
	var ctrlID string
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == "controller" {
			ctrlID = strings.TrimPrefix(st.ContainerID, "containerd://")
		}
	}
	ctrlStarted, okStarted := containerdLogTime(t, n.ContainerdLog, `StartContainer for \"`+ctrlID+`\"`)
	if !okStarted {
		t.Errorf("containerd's log has no StartContainer for the controller (%q)", ctrlID)
	}
	t.Logf("native sidecar order: watchsan running at +%.3fs, held for %.1fs with its upstream frozen (/readyz 503, the controller not created); "+
		"upstream thawed at +%.3fs, watchsan ready at +%.3fs, containerd's StartContainer for the controller at +%.3fs, its first line at +%.3fs (after apply)",
		held.wsRunning.Sub(tApply).Seconds(), tThawed.Sub(held.wsRunning).Seconds(), tThawed.Sub(tApply).Seconds(),
		wsReady.Sub(tApply).Seconds(), ctrlStarted.Sub(tApply).Seconds(), ctrlStart.Sub(tApply).Seconds())
	if okStarted && !ctrlStarted.After(tThawed) {
		t.Errorf("containerd started the controller (%s) before watchsan's upstream was thawed (%s)", ctrlStarted.Format(time.RFC3339Nano), tThawed.Format(time.RFC3339Nano))
	}
	if !ctrlStart.After(wsReady) {
		t.Errorf("the controller started (%s) before watchsan was ready (%s)", ctrlStart.Format(time.RFC3339Nano), wsReady.Format(time.RFC3339Nano))
	}

	// What the manifests promise, as the kubelet and runc applied it to both containers.
	running, err := cs.CoreV1().Pods(sidecarNS).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"watchsan", "controller"} {
		t.Logf("running as the kubelet applied it: %s", checkRunning(ctx, t, n, running, name))
	}

	// From here the deployment controller is the pod's, talking through watchsan.
	if err := kcm.Restart(ctx, "--controllers=*,-deployment-controller"); err != nil {
		t.Fatal(err)
	}
	web := pauseDeployment("web", 1)
	if _, err := cs.AppsV1().Deployments("default").Create(ctx, web, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReplicas(ctx, t, cs, "web", 1)
	t.Log("the controller in the pod, through watchsan, made Deployment web's ReplicaSet and pod")

	// watchsan's upstream restarted (SIGTERM, then started again): the controller must see the
	// next scale through watchsan. Then frozen (SIGSTOP) for 5 s.
	a := up
	tRestart := time.Now()
	if err := a.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := a.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	tUp := time.Now()
	scale(ctx, t, cs, "web", 2)
	waitReplicas(ctx, t, cs, "web", 2)
	t.Logf("apiserver restart: down and up in %.1fs; Deployment web scaled 1->2 by the pod's controller %.1fs after the apiserver was ready again",
		tUp.Sub(tRestart).Seconds(), time.Since(tUp).Seconds())

	if err := a.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-time.After(5 * time.Second): // the freeze itself is what is measured against
	case <-ctx.Done():
	}
	if err := a.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	tThaw := time.Now()
	scale(ctx, t, cs, "web", 3)
	waitReplicas(ctx, t, cs, "web", 3)
	t.Logf("apiserver frozen 5s: Deployment web scaled 2->3 by the pod's controller %.1fs after SIGCONT", time.Since(tThaw).Seconds())

	cur, err := cs.CoreV1().Pods(sidecarNS).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range append(cur.Status.InitContainerStatuses, cur.Status.ContainerStatuses...) {
		if st.RestartCount != 0 {
			t.Errorf("container %s restarted %d times through the apiserver's restart and freeze", st.Name, st.RestartCount)
		}
	}

	// The probes the kubelet ran: liveness never failed through the restart and the freeze.
	t.Logf("the kubelet's failed probes of watchsan (Unhealthy events): %v", probeFailures(ctx, t, cs, cur, "watchsan"))

	// Deletion: the controller stops first, watchsan after it and after its shutdown delay,
	// exit 0, all within the grace period.
	grace := int64(30)
	if g := cur.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = *g
	}
	final := make(chan *corev1.Pod, 1)
	// A watch that resumes where it ended (the apiserver ends watches when it likes), from a
	// list's resourceVersion: the pod's own is older than what the restarted apiserver's watch
	// cache holds (410, docs/design.md section 6).
	list, err := cs.CoreV1().Pods(sidecarNS).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + pod.Name})
	if err != nil {
		t.Fatal(err)
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = "metadata.name=" + pod.Name
			return cs.CoreV1().Pods(sidecarNS).Watch(ctx, o)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer w.Stop()
		var last *corev1.Pod
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok {
				last = p
			} else {
				t.Logf("pod watch: %s %v", ev.Type, ev.Object)
			}
			if ev.Type == watch.Deleted {
				final <- last
				return
			}
		}
		final <- nil
	}()
	tDelete := time.Now()
	if err := cs.CoreV1().Pods(sidecarNS).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Keep the containers' logs while the kubelet still has them.
	stopCopy := logs.follow(t, "controller", "watchsan")
	var gone *corev1.Pod
	select {
	case gone = <-final:
	case <-ctx.Done():
		t.Fatal("the sidecar pod was never deleted")
	}
	tGone := time.Now()
	stopCopy()
	if gone == nil {
		t.Fatal("the pod watch ended before the pod was deleted")
	}
	t.Logf("pod deleted (grace %ds): gone from the API %.1fs after the delete", grace, tGone.Sub(tDelete).Seconds())
	if tGone.Sub(tDelete) > time.Duration(grace)*time.Second {
		t.Errorf("the pod took %.1fs to go, longer than its grace period %ds", tGone.Sub(tDelete).Seconds(), grace)
	}

	ctrl, ws := logs.saved("controller"), logs.saved("watchsan")
	if len(ctrl) == 0 || len(ws) == 0 {
		t.Fatalf("logs of the deleted pod missing: controller %d lines, watchsan %d", len(ctrl), len(ws))
	}
	// When each container stopped, from containerd's log (the kubelet's StopContainer calls,
	// to the nanosecond): the controller's returned (it exited) before watchsan's began.
	ids := map[string]string{}
	for _, st := range append(gone.Status.InitContainerStatuses, gone.Status.ContainerStatuses...) {
		ids[st.Name] = strings.TrimPrefix(st.ContainerID, "containerd://")
	}
	ctrlEnd, ok1 := containerdLogTime(t, n.ContainerdLog, `StopContainer for \"`+ids["controller"]+`\" returns successfully`)
	wsStopCalled, ok2 := containerdLogTime(t, n.ContainerdLog, `StopContainer for \"`+ids["watchsan"]+`\" with timeout`)
	if !ok1 || !ok2 {
		t.Fatalf("containerd's log has no StopContainer for the controller (%s: %v) or for watchsan (%s: %v)", ids["controller"], ok1, ids["watchsan"], ok2)
	}
	t.Logf("containerd: the controller stopped +%.2fs after the delete, watchsan's stop began +%.2fs",
		ctrlEnd.Sub(tDelete).Seconds(), wsStopCalled.Sub(tDelete).Seconds())
	if wsStopCalled.Before(ctrlEnd) {
		t.Errorf("the kubelet began stopping watchsan (%s) before the controller had stopped (%s): the sidecar must stop after the main container",
			wsStopCalled.Format(time.RFC3339Nano), ctrlEnd.Format(time.RFC3339Nano))
	}
	wsTerm, okTerm := findLine(ws, `"msg":"shutting down"`)
	wsStop, okStop := findLine(ws, `"msg":"stopped"`)
	if !okTerm || !okStop {
		t.Fatalf("watchsan's log has no shutdown (%v) or stop (%v) line; last lines:\n%s", okTerm, okStop, lastText(ws, 10))
	}
	t.Logf("after the delete: watchsan logged shutting down +%.2fs, stopped +%.2fs (--shutdown-delay=%s)",
		wsTerm.Sub(tDelete).Seconds(), wsStop.Sub(tDelete).Seconds(), shutdownDelay)
	if wsTerm.Before(ctrlEnd) {
		t.Errorf("watchsan began shutting down (%s) before the controller had stopped (%s)",
			wsTerm.Format(time.RFC3339Nano), ctrlEnd.Format(time.RFC3339Nano))
	}
	if d := wsStop.Sub(wsTerm); d < shutdownDelay {
		t.Errorf("watchsan stopped %.2fs after SIGTERM, before its --shutdown-delay=%s", d.Seconds(), shutdownDelay)
	}
	for _, st := range gone.Status.InitContainerStatuses {
		if st.Name != "watchsan" {
			continue
		}
		term := st.State.Terminated
		if term == nil {
			term = st.LastTerminationState.Terminated
		}
		if term == nil {
			t.Errorf("watchsan's last status has no termination: %+v", st.State)
			continue
		}
		t.Logf("watchsan exited %d (%s)", term.ExitCode, term.Reason)
		if term.ExitCode != 0 {
			t.Errorf("watchsan exited %d, want 0", term.ExitCode)
		}
	}
	for _, st := range gone.Status.ContainerStatuses {
		if term := st.State.Terminated; term != nil {
			t.Logf("%s exited %d (%s)", st.Name, term.ExitCode, term.Reason)
		}
	}
}

// sidecarPatch is what the test changes in deploy/overlays/sidecar, each for a reason of this
// machine, not of the manifests: see renderSidecar.
type sidecarPatch struct {
	watchsanImage         string
	listenPort, adminPort int
	apiserverPort         int
}

// renderSidecar renders deploy/overlays/sidecar with kustomize and patches it for this machine:
//   - hostNetwork (no CNI plugin here), so the namespace's Pod Security level is privileged,
//     and watchsan's listeners on free ports (the host's ports are shared): the main listener
//     and the controller's kubeconfig follow, the admin listener on 127.0.0.1 (nothing may
//     connect to the node's address, which is where the kubelet would probe a host-network pod
//     without a host), its probes with host 127.0.0.1;
//   - KUBERNETES_SERVICE_HOST/PORT set to the apiserver on loopback: no kube-proxy runs, so the
//     kubernetes Service's address leads nowhere (watchsan still uses the in-cluster config: the
//     pod's service account token and the cluster CA from kube-root-ca.crt);
//   - the image `make image` built, and --shutdown-delay;
//   - the controller: kube-controller-manager's deployment controller with the overlay's
//     kubeconfig, a memory limit it fits in, and a ClusterRoleBinding to cluster-admin for the
//     service account (RBAC for a whole controller manager is not what is tested).
func renderSidecar(t *testing.T, p sidecarPatch) []byte {
	t.Helper()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(root, "deploy", "overlays", "sidecar"))
	if err != nil {
		t.Fatalf("kustomize build deploy/overlays/sidecar: %v", err)
	}
	var docs [][]byte
	var sawDeployment, sawKubeconfig bool
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
			data = mustMarshal(t, &ns)
		case "ConfigMap":
			var cm corev1.ConfigMap
			mustUnmarshal(t, data, &cm)
			if kc, ok := cm.Data["kubeconfig"]; ok {
				sawKubeconfig = true
				want := "http://127.0.0.1:8001"
				if !strings.Contains(kc, want) {
					t.Fatalf("the sidecar's kubeconfig does not name %s:\n%s", want, kc)
				}
				cm.Data["kubeconfig"] = strings.ReplaceAll(kc, want, "http://127.0.0.1:"+strconv.Itoa(p.listenPort))
			}
			data = mustMarshal(t, &cm)
		case "Deployment":
			var d appsv1.Deployment
			mustUnmarshal(t, data, &d)
			patchSidecarDeployment(t, &d, p)
			sawDeployment = true
			data = mustMarshal(t, &d)
		}
		docs = append(docs, data)
	}
	if !sawDeployment || !sawKubeconfig {
		t.Fatalf("deploy/overlays/sidecar: Deployment %v, kubeconfig ConfigMap %v", sawDeployment, sawKubeconfig)
	}
	crb := &rbacv1.ClusterRoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: "watchsan-test-example-controller-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sidecarDeployment, Namespace: sidecarNS}},
	}
	docs = append(docs, mustMarshal(t, crb))
	var out []byte
	for _, d := range docs {
		y, err := yaml.JSONToYAML(d)
		if err != nil {
			t.Fatal(err)
		}
		out = append(append(out, "---\n"...), y...)
	}
	return out
}

func patchSidecarDeployment(t *testing.T, d *appsv1.Deployment, p sidecarPatch) {
	t.Helper()
	spec := &d.Spec.Template.Spec
	spec.HostNetwork = true
	var ws, ctrl *corev1.Container
	for i := range spec.InitContainers {
		if spec.InitContainers[i].Name == "watchsan" {
			ws = &spec.InitContainers[i]
		}
	}
	for i := range spec.Containers {
		if spec.Containers[i].Name == "controller" {
			ctrl = &spec.Containers[i]
		}
	}
	if ws == nil || ctrl == nil {
		t.Fatalf("deploy/overlays/sidecar: no watchsan init container (%v) or controller container (%v)", ws != nil, ctrl != nil)
	}
	if ws.RestartPolicy == nil || *ws.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Fatal("deploy/overlays/sidecar: watchsan is not a native sidecar (restartPolicy: Always)")
	}
	ws.Image = p.watchsanImage
	for i, a := range ws.Args {
		switch {
		case strings.HasPrefix(a, "--listen="):
			ws.Args[i] = "--listen=127.0.0.1:" + strconv.Itoa(p.listenPort)
		case strings.HasPrefix(a, "--admin-listen="):
			ws.Args[i] = "--admin-listen=127.0.0.1:" + strconv.Itoa(p.adminPort)
		}
	}
	ws.Args = append(ws.Args, "--shutdown-delay="+shutdownDelay.String())
	ws.Env = append(ws.Env,
		corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: "127.0.0.1"},
		corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: strconv.Itoa(p.apiserverPort)})
	for i := range ws.Ports {
		ws.Ports[i].ContainerPort = int32(p.adminPort)
	}
	for _, pr := range []*corev1.Probe{ws.StartupProbe, ws.ReadinessProbe, ws.LivenessProbe} {
		if pr != nil && pr.HTTPGet != nil {
			pr.HTTPGet.Host = "127.0.0.1"
			pr.HTTPGet.Port = intstr.FromInt32(int32(p.adminPort))
		}
	}

	kubeconfig := ""
	for _, e := range ctrl.Env {
		if e.Name == "KUBECONFIG" {
			kubeconfig = e.Value
		}
	}
	if kubeconfig == "" {
		t.Fatal("deploy/overlays/sidecar: the controller has no KUBECONFIG")
	}
	ctrl.Image = kcmImage
	ctrl.Command = nil
	ctrl.Args = []string{
		// kube-controller-manager reads no $KUBECONFIG: without the flag it would use the
		// in-cluster config and go around watchsan.
		"--kubeconfig=" + kubeconfig,
		"--controllers=deployment-controller",
		"--leader-elect=false",
		"--secure-port=0",
		"--v=2",
	}
	ctrl.Resources.Limits[corev1.ResourceMemory] = mustQuantity("512Mi")
}

func pauseDeployment(name string, replicas int32) *appsv1.Deployment {
	grace := int64(2)
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					HostNetwork:                   true,
					TerminationGracePeriodSeconds: &grace,
					Containers: []corev1.Container{{
						Name: "pause", Image: node.SandboxImage, ImagePullPolicy: corev1.PullNever,
					}},
				},
			},
		},
	}
}

// scale sets the Deployment's replicas (straight at the apiserver, as a user would).
func scale(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string, replicas int32) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	if err := nodetest.Poll(ctx, func() error {
		_, err := cs.AppsV1().Deployments("default").Patch(ctx, name, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{})
		return err
	}); err != nil {
		t.Fatalf("scale %s to %d: %v", name, replicas, err)
	}
}

// waitReplicas waits until the Deployment has replicas ready pods: its ReplicaSet, which only
// the deployment controller changes, has been scaled, and the pods run.
func waitReplicas(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string, replicas int32) {
	t.Helper()
	if err := nodetest.Poll(ctx, func() error {
		d, err := cs.AppsV1().Deployments("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ReadyReplicas != replicas || d.Status.UpdatedReplicas != replicas {
			return fmt.Errorf("%s: %d ready, %d updated, want %d", name, d.Status.ReadyReplicas, d.Status.UpdatedReplicas, replicas)
		}
		return nil
	}); err != nil {
		t.Fatalf("Deployment %s: %v", name, err)
	}
}

// waitDeploymentPod waits for the one pod of a Deployment to be Ready and returns it.
func waitDeploymentPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	if err := nodetest.Poll(ctx, func() error {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + name})
		if err != nil {
			return err
		}
		if len(pods.Items) != 1 {
			return fmt.Errorf("%d pods", len(pods.Items))
		}
		p := &pods.Items[0]
		if !nodetest.PodReady(p) {
			return fmt.Errorf("pod %s: phase %s, not Ready: %s", p.Name, p.Status.Phase, statusSummary(p))
		}
		pod = p
		return nil
	}); err != nil {
		t.Fatalf("Deployment %s/%s: %v", ns, name, err)
	}
	return pod
}

func statusSummary(p *corev1.Pod) string {
	var parts []string
	for _, st := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		s := st.Name + ":"
		switch {
		case st.State.Waiting != nil:
			s += "waiting " + st.State.Waiting.Reason + " " + st.State.Waiting.Message
		case st.State.Running != nil:
			s += fmt.Sprintf("running ready=%v restarts=%d", st.Ready, st.RestartCount)
		case st.State.Terminated != nil:
			s += fmt.Sprintf("terminated %d %s", st.State.Terminated.ExitCode, st.State.Terminated.Reason)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// podLogs reads a pod's container logs where the kubelet writes them (CRI format: a timestamp,
// the stream, a tag, the line), and keeps copies while it still has them.
type podLogs struct {
	dir    string
	mu     sync.Mutex
	copies map[string][]logLine
}

type logLine struct {
	ts   time.Time
	text string
}

func newPodLogs(n *node.Node, p *corev1.Pod) *podLogs {
	return &podLogs{
		dir:    filepath.Join(n.PodLogsDir, p.Namespace+"_"+p.Name+"_"+string(p.UID)),
		copies: map[string][]logLine{},
	}
}

// read returns every line the container has logged so far (all its restarts' files).
func (l *podLogs) read(t *testing.T, container string) []logLine {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(l.dir, container, "*.log"))
	var out []logLine
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			parts := strings.SplitN(line, " ", 4)
			if len(parts) < 4 {
				continue
			}
			ts, err := time.Parse(time.RFC3339Nano, parts[0])
			if err != nil {
				continue
			}
			out = append(out, logLine{ts: ts, text: parts[3]})
		}
	}
	if len(out) > 0 {
		l.mu.Lock()
		if len(out) >= len(l.copies[container]) {
			l.copies[container] = out
		}
		l.mu.Unlock()
	}
	return out
}

// follow copies the containers' logs every 100 ms until the returned function is called.
func (l *podLogs) follow(t *testing.T, containers ...string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, c := range containers {
				l.read(t, c)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
		for _, c := range containers { // a last look, if the files are still there
			l.read(t, c)
		}
	}
}

func (l *podLogs) saved(container string) []logLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.copies[container]
}

// containerdLogTime returns the time of the first line of containerd's log that contains
// substr (as the log writes it: quotes in msg escaped).
func containerdLogTime(t *testing.T, path, substr string) (time.Time, bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, substr) || !strings.HasPrefix(line, `time="`) {
			continue
		}
		end := strings.IndexByte(line[6:], '"')
		if end < 0 {
			continue
		}
		if ts, err := time.Parse(time.RFC3339Nano, line[6:6+end]); err == nil {
			return ts, true
		}
	}
	return time.Time{}, false
}

func findLine(lines []logLine, substr string) (time.Time, bool) {
	for _, l := range lines {
		if strings.Contains(l.text, substr) {
			return l.ts, true
		}
	}
	return time.Time{}, false
}

func lastText(lines []logLine, n int) string {
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l.text + "\n")
	}
	return b.String()
}

func mustUnmarshal(t *testing.T, data []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatal(err)
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// holdWindow is how long the test watches the controller being held back while watchsan runs
// with its upstream frozen: its startupProbe fails every second meanwhile.
const holdWindow = 5 * time.Second

type heldPod struct {
	pod       *corev1.Pod
	wsRunning time.Time // when the test saw watchsan's container running
}

// holdController waits for the sidecar pod's watchsan container to run while its upstream is
// frozen, then for holdWindow checks, every 100 ms, that the kubelet holds the controller
// back: watchsan's /readyz is not 200, the controller's status is Waiting and it has no log
// file. Then it thaws the upstream. It returns nil (having reported why) if the controller
// started, or watchsan got ready, during the hold.
func holdController(ctx context.Context, t *testing.T, cs kubernetes.Interface, n *node.Node, up *cluster.APIServer, adminURL string) *heldPod {
	t.Helper()
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if err := up.Signal(syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	defer thaw()
	status := func(p *corev1.Pod, name string) *corev1.ContainerStatus {
		for _, st := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			if st.Name == name {
				return &st
			}
		}
		return nil
	}
	var h heldPod
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := nodetest.Poll(pctx, func() error {
		pods, err := cs.CoreV1().Pods(sidecarNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + sidecarDeployment})
		if err != nil {
			return err
		}
		if len(pods.Items) != 1 {
			return fmt.Errorf("%d pods", len(pods.Items))
		}
		p := &pods.Items[0]
		if st := status(p, "watchsan"); st == nil || st.State.Running == nil {
			return fmt.Errorf("watchsan not running yet: %s", statusSummary(p))
		}
		h.pod, h.wsRunning = p, time.Now()
		return nil
	}); err != nil {
		t.Errorf("the sidecar's watchsan never ran: %v", err)
		return nil
	}
	logs := newPodLogs(n, h.pod)
	end := time.Now().Add(holdWindow)
	checks := 0
	for time.Now().Before(end) {
		if httpOK(ctx, adminURL+"/readyz") == nil {
			t.Errorf("watchsan's /readyz answered 200 %.1fs into the hold, its upstream frozen", time.Since(h.wsRunning).Seconds())
			return nil
		}
		p, err := cs.CoreV1().Pods(sidecarNS).Get(ctx, h.pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("pod %s: %v", h.pod.Name, err)
			return nil
		}
		if st := status(p, "controller"); st == nil || st.State.Waiting == nil {
			t.Errorf("the controller is not Waiting %.1fs into the hold, watchsan not ready: %s", time.Since(h.wsRunning).Seconds(), statusSummary(p))
			return nil
		}
		if files, _ := filepath.Glob(filepath.Join(logs.dir, "controller", "*.log")); len(files) > 0 {
			t.Errorf("the controller has a log file %.1fs into the hold, watchsan not ready: %v", time.Since(h.wsRunning).Seconds(), files)
			return nil
		}
		checks++
		select {
		case <-ctx.Done():
			t.Error(ctx.Err())
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Logf("held: for %s (%d checks) watchsan ran with its upstream frozen, /readyz not 200, the controller Waiting with no log", holdWindow, checks)
	thaw()
	return &h
}
