package node_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/clustertest"
	"github.com/watchsan/watchsan/test/cluster/node"
	"github.com/watchsan/watchsan/test/cluster/node/nodetest"
)

const nodeLocalNS = "watchsan-node"

// leaseDuration is the kubelet's node lease duration (its default, 40 s): a renewal later than
// this after the apiserver came back means the node was, for the control plane, gone.
const leaseDuration = 40 * time.Second

// TestNodeLocalKubelet runs deploy/overlays/node-local's watchsan as a static pod (the
// DaemonSet's pod, its ConfigMap and Secrets as files: a static pod may not reference API
// objects) and points the node's own kubelet at it, as OpenYurt's yurthub is used, and a
// DaemonSet's pod (cmwatch, an informer) too. Through two apiserver restarts the node stays
// Ready, its lease keeps being renewed and the informer keeps seeing a ConfigMap's updates
// through watchsan; then watchsan itself is stopped and started again from its manifest, and
// upgraded (its static pod's spec changed), and the test measures how long the kubelet goes
// without renewing its lease and the informer without seeing updates.
func TestNodeLocalKubelet(t *testing.T) {
	nodetest.Skip(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// --request-timeout bounds how long a SIGTERMed apiserver waits for open requests (the
	// watches) before it exits: 60 s by default.
	c := clustertest.Start(t, cluster.Options{APIServerFlags: []string{"--shutdown-delay-duration=1s", "--request-timeout=6s"}})
	n := nodetest.Start(t, c, node.Options{})
	cs, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	// The node lifecycle controller marks a node whose lease is not renewed NotReady.
	for _, name := range []string{cluster.Scheduler, cluster.ControllerManager} {
		if _, err := c.StartComponent(ctx, name, cluster.ComponentOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	wsTar, wsRef, err := node.WatchsanImage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tar := range []string{wsTar, buildCmwatch(ctx, t)} {
		if err := n.Import(ctx, tar); err != nil {
			t.Fatal(err)
		}
	}
	ports, err := node.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	listen, admin := ports[0], ports[1]
	manifest, ns := renderNodeLocal(t, c, n, nodeLocalPatch{image: wsRef, listenPort: listen, adminPort: admin, apiserverPort: c.APIServers[0].Port})
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	manifestPath := filepath.Join(n.StaticPodDir, "watchsan-node-local.yaml")
	if err := os.WriteFile(manifestPath, manifest, 0o644); err != nil {
		t.Fatal(err)
	}
	mirror := "watchsan-node-local-" + n.Name
	waitPodReadyIn(ctx, t, cs, nodeLocalNS, mirror)
	adminURL := "http://127.0.0.1:" + strconv.Itoa(admin)
	if p, err := cs.CoreV1().Pods(nodeLocalNS).Get(ctx, mirror, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("running as the kubelet applied it: %s", checkRunning(ctx, t, n, p, "watchsan"))
	}

	// The kubelet through watchsan: same token, watchsan's serving certificate verified with
	// the cluster CA, which signed it.
	before := requestCount(ctx, t, adminURL)
	if err := n.RestartKubelet(ctx, "https://127.0.0.1:"+strconv.Itoa(listen), c.CAFile, ""); err != nil {
		t.Fatal(err)
	}
	if err := n.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	// A Deployment's pod on the node, to show its pods keep running.
	if _, err := cs.AppsV1().Deployments("default").Create(ctx, pauseDeployment("web", 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReplicas(ctx, t, cs, "web", 1)

	// A DaemonSet's pod as the node's other client: an informer on default's ConfigMaps
	// through watchsan, while the test writes ConfigMap tick every 250 ms at the apiserver.
	cmw := startCmwatch(ctx, t, cs, listen)
	cmLogs := newPodLogs(n, cmw)
	if err := nodetest.Poll(ctx, func() error {
		want := "synced via https://127.0.0.1:" + strconv.Itoa(listen)
		if _, ok := findLine(cmLogs.read(t, "watch"), want); !ok {
			return fmt.Errorf("cmwatch has not logged %q", want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	tk := startTicks(ctx, t, cs, cmLogs)
	defer tk.stop()
	t.Logf("the DaemonSet's watcher (pod %s) synced through watchsan; a tick shown %.0fms after it was sent",
		cmw.Name, tk.waitCaughtUp(ctx, t, 30*time.Second).Seconds()*1000)

	mon := watchNode(ctx, t, cs, n.Name)
	// The kubelet renews its lease every 10 s (a quarter of its 40 s duration): wait for one
	// renewal through watchsan before the restarts.
	mon.waitRenewal(ctx, t, time.Now())
	if after := requestCount(ctx, t, adminURL); after <= before {
		t.Fatalf("watchsan served no request after the kubelet was pointed at it (%v -> %v)", before, after)
	}
	t.Logf("the kubelet talks through watchsan: its requests counted %v -> %v, watches open %v",
		before, requestCount(ctx, t, adminURL), metric(ctx, t, adminURL, "watchsan_open_watches"))

	a := c.APIServers[0]
	for i := 1; i <= 2; i++ {
		tDown := time.Now()
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
		renewed := mon.waitRenewal(ctx, t, tUp)
		caught := tk.waitCaughtUp(ctx, t, time.Minute)
		worst, at := tk.maxDelay(t, tDown, time.Now())
		t.Logf("apiserver restart %d: down %.1fs; the kubelet's lease renewed through watchsan %.1fs after the apiserver was ready again; "+
			"the DaemonSet's watcher caught up (last tick shown %.1fs after sent), its longest tick delay %.1fs (tick %d)",
			i, tUp.Sub(tDown).Seconds(), renewed.Sub(tUp).Seconds(), caught.Seconds(), worst.Seconds(), at)
		if d := renewed.Sub(tUp); d > leaseDuration {
			t.Errorf("apiserver restart %d: the lease was renewed only %.1fs after the apiserver was back, past its %s duration", i, d.Seconds(), leaseDuration)
		}
	}

	// watchsan itself stopped and started again: the manifest removed (the kubelet stops the
	// pod), then written back (it starts it again; it needs no apiserver for that).
	tStop := time.Now()
	if err := os.Remove(manifestPath); err != nil {
		t.Fatal(err)
	}
	if err := nodetest.Poll(ctx, func() error {
		if httpOK(ctx, adminURL+"/healthz") == nil {
			return errNotYet
		}
		return nil
	}); err != nil {
		t.Fatalf("watchsan never stopped after its manifest was removed: %v", err)
	}
	tStopped := time.Now()
	if err := os.WriteFile(manifestPath, manifest, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := nodetest.Poll(ctx, func() error { return httpOK(ctx, adminURL+"/readyz") }); err != nil {
		t.Fatalf("watchsan never came back: %v", err)
	}
	tBack := time.Now()
	renewed := mon.waitRenewal(ctx, t, tBack)
	tk.waitCaughtUp(ctx, t, time.Minute)
	worst, _ := tk.maxDelay(t, tStop, time.Now())
	t.Logf("watchsan restarted as a static pod: stopped %.1fs after its manifest went, ready again %.1fs after it came back; the lease renewed %.1fs after that; "+
		"the DaemonSet's watcher's longest tick delay %.1fs",
		tStopped.Sub(tStop).Seconds(), tBack.Sub(tStopped).Seconds(), renewed.Sub(tBack).Seconds(), worst.Seconds())
	if d := renewed.Sub(tBack); d > leaseDuration {
		t.Errorf("the lease was renewed only %.1fs after watchsan was back, past its %s duration", d.Seconds(), leaseDuration)
	}

	// watchsan upgraded: its static pod's spec changed (an annotation and an argument), which
	// the kubelet carries out as a new pod replacing the old. The lease and the DaemonSet's
	// watch go without service from the old pod's stop until the new one serves.
	upgraded := upgradeManifest(t, manifest)
	startBefore := watchsanStart(ctx, adminURL)
	if startBefore == 0 {
		t.Fatal("watchsan's process_start_time_seconds is unreadable before the upgrade")
	}
	renewedBefore := mon.lastRenewal()
	tUpgrade := time.Now()
	if err := os.WriteFile(manifestPath, upgraded, 0o644); err != nil {
		t.Fatal(err)
	}
	var tOldGone time.Time
	uctx, ucancel := context.WithTimeout(ctx, 2*time.Minute)
	defer ucancel()
	if err := nodetest.Poll(uctx, func() error {
		st := watchsanStart(uctx, adminURL)
		if st == 0 && tOldGone.IsZero() {
			tOldGone = time.Now()
		}
		if st == 0 || st == startBefore {
			return fmt.Errorf("watchsan not replaced yet (start time %v)", st)
		}
		return httpOK(uctx, adminURL+"/readyz")
	}); err != nil {
		t.Fatalf("the upgraded watchsan never served: %v", err)
	}
	tUpgraded := time.Now()
	renewed = mon.waitRenewal(ctx, t, tUpgraded)
	tk.waitCaughtUp(ctx, t, time.Minute)
	worst, at := tk.maxDelay(t, tUpgrade, time.Now())
	leaseGap := renewed.Sub(renewedBefore)
	t.Logf("watchsan upgraded (static pod spec changed): the old one stopped answering %.1fs after the new manifest, the new one ready %.1fs after it "+
		"(%.1fs without watchsan); the lease's renewals around it %.1fs apart, the next %.1fs after the new one was ready; the DaemonSet's watcher's longest tick delay %.1fs (tick %d)",
		tOldGone.Sub(tUpgrade).Seconds(), tUpgraded.Sub(tUpgrade).Seconds(), tUpgraded.Sub(tOldGone).Seconds(),
		leaseGap.Seconds(), renewed.Sub(tUpgraded).Seconds(), worst.Seconds(), at)
	if tOldGone.IsZero() {
		t.Error("the test never saw the old watchsan stop: the upgrade replaced nothing it could see")
	}
	if leaseGap > leaseDuration {
		t.Errorf("the lease went %.1fs without a renewal through the upgrade, past its %s duration", leaseGap.Seconds(), leaseDuration)
	}
	if p, err := cs.CoreV1().Pods(nodeLocalNS).Get(ctx, mirror, metav1.GetOptions{}); err == nil && p.Annotations[revisionAnnotation] != "2" {
		t.Logf("the mirror pod does not show the upgrade yet (annotations %v)", p.Annotations)
	}
	waitReplicas(ctx, t, cs, "web", 1)
	gap, notReady := mon.stop()
	t.Logf("through it all: the longest time between two lease renewals %.1fs; Node Ready went false %d times", gap.Seconds(), notReady)
	if gap > leaseDuration {
		t.Errorf("the lease went %.1fs without a renewal, past its %s duration", gap.Seconds(), leaseDuration)
	}
	if notReady > 0 {
		t.Errorf("the Node went NotReady %d times", notReady)
	}
	web, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app in (web," + cmwatchName + ")"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range web.Items {
		for _, st := range p.Status.ContainerStatuses {
			if st.RestartCount != 0 {
				t.Errorf("pod %s container %s restarted %d times", p.Name, st.Name, st.RestartCount)
			}
		}
	}
}

const revisionAnnotation = "watchsan.test/revision"

// upgradeManifest is the static pod's manifest with a new revision: an annotation and an
// argument (--log-level set to the default it has anyway) changed, as a rollout changes a
// pod spec.
func upgradeManifest(t *testing.T, manifest []byte) []byte {
	t.Helper()
	var p corev1.Pod
	if err := yaml.Unmarshal(manifest, &p); err != nil {
		t.Fatal(err)
	}
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[revisionAnnotation] = "2"
	p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, "--log-level=info")
	b, err := yaml.Marshal(&p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type nodeLocalPatch struct {
	image                 string
	listenPort, adminPort int
	apiserverPort         int
}

// renderNodeLocal renders deploy/overlays/node-local and makes a static pod of its DaemonSet's
// pod: its ConfigMap and Secret volumes become host paths (a static pod may not reference API
// objects, its service account included), with watchsan's config from the overlay's ConfigMap
// patched for this machine: the listeners on free ports (the host's ports are shared), the
// upstream the apiserver on loopback (no kube-proxy here, so the kubernetes Service's address
// leads nowhere, as the config's comment warns). Returns the manifest and the namespace.
func renderNodeLocal(t *testing.T, c *cluster.Cluster, n *node.Node, p nodeLocalPatch) ([]byte, *corev1.Namespace) {
	t.Helper()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(root, "deploy", "overlays", "node-local"))
	if err != nil {
		t.Fatalf("kustomize build deploy/overlays/node-local: %v", err)
	}
	var ds *appsv1.DaemonSet
	var ns *corev1.Namespace
	var config string
	for _, res := range m.Resources() {
		data, err := res.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		switch res.GetKind() {
		case "DaemonSet":
			ds = &appsv1.DaemonSet{}
			mustUnmarshal(t, data, ds)
		case "Namespace":
			ns = &corev1.Namespace{}
			mustUnmarshal(t, data, ns)
		case "ConfigMap":
			var cm corev1.ConfigMap
			mustUnmarshal(t, data, &cm)
			config = cm.Data["config.yaml"]
		}
	}
	if ds == nil || ns == nil || config == "" {
		t.Fatalf("deploy/overlays/node-local: DaemonSet %v, Namespace %v, config.yaml %v", ds != nil, ns != nil, config != "")
	}
	ns.ResourceVersion = ""

	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(config), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["listen"] = "127.0.0.1:" + strconv.Itoa(p.listenPort)
	cfg["admin-listen"] = "127.0.0.1:" + strconv.Itoa(p.adminPort)
	cfg["upstream"] = []any{"https://127.0.0.1:" + strconv.Itoa(p.apiserverPort)}

	// The volumes' contents, as files readable by the pod's user.
	files := filepath.Join(n.Dir, "node-local")
	cert, key, err := c.CA.IssueServing("watchsan-node-local")
	if err != nil {
		t.Fatal(err)
	}
	cfgYAML, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	uid, gid := int(*ds.Spec.Template.Spec.SecurityContext.RunAsUser), int(*ds.Spec.Template.Spec.SecurityContext.RunAsGroup)
	volumes := map[string]map[string][]byte{
		"config":      {"config.yaml": cfgYAML},
		"tls":         {"tls.crt": mustRead(t, cert), "tls.key": mustRead(t, key)},
		"upstream-ca": {"ca.crt": c.CAData},
	}
	for vol, fs := range volumes {
		dir := filepath.Join(files, vol)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range fs {
			f := filepath.Join(dir, name)
			if err := os.WriteFile(f, b, 0o440); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(f, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}

	spec := ds.Spec.Template.Spec
	spec.ServiceAccountName = ""
	spec.DeprecatedServiceAccount = ""
	for i, v := range spec.Volumes {
		if _, ok := volumes[v.Name]; !ok {
			t.Fatalf("deploy/overlays/node-local: volume %s unknown to the test", v.Name)
		}
		dir := corev1.HostPathDirectory
		spec.Volumes[i].VolumeSource = corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: filepath.Join(files, v.Name), Type: &dir}}
	}
	ct := &spec.Containers[0]
	ct.Image = p.image
	for _, pr := range []*corev1.Probe{ct.ReadinessProbe, ct.LivenessProbe, ct.StartupProbe} {
		if pr != nil && pr.HTTPGet != nil {
			pr.HTTPGet.Port.IntVal = int32(p.adminPort)
		}
	}
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "watchsan-node-local", Namespace: nodeLocalNS, Labels: ds.Spec.Template.Labels},
		Spec:       spec,
	}
	b, err := yaml.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	return b, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.Name, Labels: ns.Labels}}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func waitPodReadyIn(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name string) {
	t.Helper()
	if err := nodetest.Poll(ctx, func() error {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !nodetest.PodReady(p) {
			return fmt.Errorf("pod %s: %s", name, statusSummary(p))
		}
		return nil
	}); err != nil {
		t.Fatalf("pod %s/%s never Ready: %v", ns, name, err)
	}
}

// nodeMonitor watches the Node's Ready condition and its Lease's renewals, straight at the
// apiserver (not through watchsan), every 200 ms.
type nodeMonitor struct {
	mu       sync.Mutex
	renewals []time.Time // when a new renewTime was seen, with the renewTime itself
	notReady int
	done     chan struct{}
	wg       sync.WaitGroup
}

func watchNode(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string) *nodeMonitor {
	m := &nodeMonitor{done: make(chan struct{})}
	m.wg.Go(func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		var last time.Time
		ready := true
		for {
			if l, err := cs.CoordinationV1().Leases("kube-node-lease").Get(ctx, name, metav1.GetOptions{}); err == nil && l.Spec.RenewTime != nil {
				if rt := l.Spec.RenewTime.Time; !rt.Equal(last) {
					last = rt
					m.mu.Lock()
					m.renewals = append(m.renewals, rt)
					m.mu.Unlock()
				}
			}
			if nd, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err == nil {
				now := true
				for _, c := range nd.Status.Conditions {
					if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
						now = false
					}
				}
				if ready && !now {
					m.mu.Lock()
					m.notReady++
					m.mu.Unlock()
					t.Logf("Node %s not Ready", name)
				}
				ready = now
			}
			select {
			case <-m.done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	return m
}

// waitRenewal waits for a lease renewal whose renewTime is after since, and returns it.
func (m *nodeMonitor) waitRenewal(ctx context.Context, t *testing.T, since time.Time) time.Time {
	t.Helper()
	var at time.Time
	if err := nodetest.Poll(ctx, func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, r := range m.renewals {
			// renewTime is the kubelet's clock in microseconds; this machine has one clock.
			if r.After(since) {
				at = r
				return nil
			}
		}
		return errNotYet
	}); err != nil {
		t.Fatalf("the kubelet's lease was not renewed after %s: %v", since.Format(time.RFC3339Nano), err)
	}
	return at
}

// lastRenewal is the latest renewal seen so far.
func (m *nodeMonitor) lastRenewal() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.renewals) == 0 {
		return time.Time{}
	}
	return m.renewals[len(m.renewals)-1]
}

// stop ends the monitor and returns the longest gap between renewals and how often the Node
// went NotReady.
func (m *nodeMonitor) stop() (time.Duration, int) {
	close(m.done)
	m.wg.Wait()
	m.mu.Lock()
	defer m.mu.Unlock()
	var gap time.Duration
	for i := 1; i < len(m.renewals); i++ {
		gap = max(gap, m.renewals[i].Sub(m.renewals[i-1]))
	}
	return gap, m.notReady
}

// requestCount is the sum of watchsan_request_duration_seconds_count, every request it served.
func requestCount(ctx context.Context, t *testing.T, adminURL string) float64 {
	return metric(ctx, t, adminURL, "watchsan_request_duration_seconds_count")
}

// metric sums a metric's samples from watchsan's /metrics.
func metric(ctx context.Context, t *testing.T, adminURL, name string) float64 {
	t.Helper()
	v, err := metricErr(ctx, adminURL, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func metricErr(ctx context.Context, adminURL, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, adminURL+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("watchsan /metrics: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("watchsan /metrics: %s", resp.Status)
	}
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum, nil
}
