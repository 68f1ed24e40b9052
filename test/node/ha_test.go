package node_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/clustertest"
	"github.com/watchsan/watchsan/test/cluster/node"
	"github.com/watchsan/watchsan/test/cluster/node/nodetest"
)

// haReplicas names the two frontend replicas TestHAFrontendForReal runs.
var haReplicas = []string{"a", "b"}

// TestHAFrontendForReal runs deploy/overlays/ha's frontend on the real node as two replicas in
// front of three apiservers, with eight client-go informers on configmaps while a writer updates
// them: four through the frontend, four straight to the apiservers. Each group reaches its
// servers through a per-connection load balancer in the test that stands in for kube-proxy: the
// frontend's group picks among the ready endpoints of the overlay's Service (its EndpointSlices,
// as the controller manager writes them from the pods' readiness), the direct group among the
// apiservers. Three disruptions, one after the other, with both groups watching all along:
//
//   - rollout: a rolling update of the frontend (a pod-template annotation changed), the kubelet
//     replacing the pods one at a time;
//   - drain: the Eviction API on the frontend's pods one at a time, as `kubectl drain` does: the
//     second eviction, while the first pod's replacement is not Ready, must be refused (429) by
//     the overlay's PodDisruptionBudget;
//   - apiservers: a rolling restart of the three apiservers (SIGTERM, wait, start, Ready).
//
// The fair comparison: a client pointed at the apiservers directly sees nothing of a frontend
// rollout, so the direct group's numbers in the first two phases are the floor (what the same
// writes cost with no disruption at all), and its numbers in the third phase are what the same
// clients see when the servers they talk to are replaced one by one, which is what a frontend
// rollout is to the frontend's clients. Per phase and group the test logs client re-watches,
// relists (LISTs and watch-lists after the first sync) and the longest gap between events any one
// informer was handed, and it asserts that no event was lost: every informer was handed every
// write the writer made but those one of its own relists skips (haInformer.unexplained), and
// each one's store equals the apiserver's list at the end; and that the informers through
// watchsan did not relist in the rollout or the drain.
//
// Two replicas of one Deployment cannot share one host-network node (same host ports; the
// scheduler's NodePorts filter keeps the second Pending), so the overlay is rendered as two
// Deployments, watchsan-frontend-a and -b, one replica each with its own ports and config file,
// and a label of their own in their selectors (Deployments must not overlap). The Service and
// the PodDisruptionBudget are the overlay's, unchanged: they select both (the Service's named
// targetPort resolves per pod). On one node a surge pod cannot start either (the old pod holds
// the ports until it exits), so each Deployment's strategy is maxSurge 0, maxUnavailable 1, and
// the test rolls a then b, waiting for a's rollout to complete first: at most one of the two
// replicas is ever unavailable, what the overlay's maxUnavailable: 0 and its PDB promise the
// clients. Besides the patches TestFrontendPod makes (hostNetwork, ports, probes on loopback).
// Two replicas; the overlay itself asks three, under the same PDB
// (maxUnavailable 1), so a third would add run time and no other case.
func TestHAFrontendForReal(t *testing.T) {
	nodetest.Skip(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// The apiservers shut down as the frontend does, quickly: readyz failing for 1 s, then their
	// watches ended within 2 s (the default waits up to --request-timeout, 60 s, for them).
	c := clustertest.Start(t, cluster.Options{APIServers: 3, APIServerFlags: []string{
		"--shutdown-delay-duration=1s", "--shutdown-watch-termination-grace-period=2s", "--request-timeout=10s"}})
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
	ports, err := node.FreePorts(2 * len(haReplicas))
	if err != nil {
		t.Fatal(err)
	}
	var apiPorts []int
	for _, a := range c.APIServers {
		apiPorts = append(apiPorts, a.Port)
	}
	file := filepath.Join(c.Dir, "frontend-ha.yaml")
	if err := os.WriteFile(file, renderHA(t, wsRef, ports, apiPorts), 0o600); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(c.Dir, "admin.kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, stderr, err := c.Kubectl(ctx, kubeconfig, "apply", "-f", file); err != nil {
		t.Fatalf("kubectl apply: %v (%s)", err, stderr)
	}
	cert, key, err := c.CA.IssueServing("watchsan-frontend")
	if err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := c.Kubectl(ctx, kubeconfig, "-n", frontendNS, "create", "secret", "tls", "watchsan-frontend-tls", "--cert="+cert, "--key="+key); err != nil {
		t.Fatalf("kubectl create secret tls: %v (%s)", err, stderr)
	}
	// Every client of the control plane in the test (the writer, the endpoints poll) tries the
	// apiservers in turn, so the apiservers' rolling restart does not stop it.
	var api []kubernetes.Interface
	for i := range c.APIServers {
		cfg := c.RESTConfig(i, c.AdminToken)
		cfg.Timeout = 5 * time.Second
		k, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		api = append(api, k)
	}
	anyAPI := func(f func(kubernetes.Interface) error) error {
		var errs []error
		for _, k := range api {
			err := f(k)
			if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) || apierrors.IsTooManyRequests(err) {
				return err
			}
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}

	eps := &endpointsPoll{}
	pollCtx, stopPoll := context.WithCancel(ctx)
	defer stopPoll()
	go eps.run(pollCtx, anyAPI)
	if err := nodetest.Poll(ctx, func() error {
		if r := eps.ready(); len(r) != len(haReplicas) {
			return fmt.Errorf("ready endpoints %v", r)
		}
		return nil
	}); err != nil {
		t.Fatalf("the frontend's Service never had %d ready endpoints: %v\n%s", len(haReplicas), err, n.LogTails(20))
	}
	t.Logf("both frontend replicas Ready and in the Service's EndpointSlices %.1fs after kubectl apply", time.Since(t0).Seconds())

	viaFrontend := startLB(t, eps.ready)
	direct := startLB(t, func() []string {
		var out []string
		for _, a := range c.APIServers {
			if a.Running() {
				out = append(out, "127.0.0.1:"+strconv.Itoa(a.Port))
			}
		}
		return out
	})

	const ns, objects = "ha-watch", 8
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w := &cmWriter{ns: ns, api: anyAPI, written: map[string][]string{}, latest: map[string]int{}, sentAt: map[string]time.Time{}}
	for i := range objects {
		if err := w.write(ctx, "cm-"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	var group = map[string][]*haInformer{}
	for _, g := range []struct {
		name string
		lb   *tcpLB
	}{{"watchsan", viaFrontend}, {"direct", direct}} {
		for i := range 4 {
			cfg := c.RESTConfig(0, c.AdminToken)
			cfg.Host = "https://" + g.lb.addr
			group[g.name] = append(group[g.name], startHAInformer(ctx, t, fmt.Sprintf("%s-%d", g.name, i), cfg, ns))
		}
	}
	t.Logf("connections per frontend replica after the informers synced: %v", viaFrontend.perBackend())

	writerCtx, stopWriter := context.WithCancel(ctx)
	writerDone := make(chan error, 1)
	go func() { writerDone <- w.run(writerCtx, objects, 50*time.Millisecond) }()
	defer stopWriter()

	// Every phase starts and ends with the writer's writes flowing to every informer: each has
	// been handed each object's last write so far, or a later one. (Not a count of the writes
	// handed: an informer that relisted is handed each object's state at the list, not the
	// writes before it; which writes an informer missed is checked at the end.)
	settle := func(what string) {
		t.Helper()
		mark := w.latestSeqs()
		sctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		if err := nodetest.Poll(sctx, func() error {
			for _, g := range group {
				for _, inf := range g {
					if err := inf.caughtUp(mark); err != nil {
						return err
					}
				}
			}
			return nil
		}); err != nil {
			var state []string
			for _, g := range group {
				for _, inf := range g {
					state = append(state, inf.state())
				}
			}
			t.Fatalf("%s: %v\n%s\nconnections %v, ready endpoints %v", what, err, strings.Join(state, "\n"), viaFrontend.perBackend(), eps.ready())
		}
	}
	settle("before the disruptions")
	type phase struct {
		name       string
		start, end time.Time
		before     map[string]haCounts
		after      map[string]haCounts
		writerGap  time.Duration
	}
	snapshot := func() map[string]haCounts {
		out := map[string]haCounts{}
		for _, g := range group {
			for _, inf := range g {
				out[inf.name] = inf.counts()
			}
		}
		return out
	}
	var phases []*phase
	run := func(name string, f func()) {
		w.longestGap()
		p := &phase{name: name, start: time.Now(), before: snapshot()}
		f()
		settle("after " + name)
		p.end, p.after, p.writerGap = time.Now(), snapshot(), w.longestGap()
		phases = append(phases, p)
	}

	// The Service never lost its last ready endpoint (what maxUnavailable and the PDB promise).
	minReady := eps.watchMin()

	run("rollout", func() {
		for _, r := range haReplicas {
			rollDeployment(ctx, t, cs, "watchsan-frontend-"+r)
		}
	})
	run("drain", func() { drainFrontend(ctx, t, cs) })
	run("apiservers", func() {
		for _, a := range c.APIServers {
			t0 := time.Now()
			if err := a.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := a.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if err := a.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("apiserver %d restarted and Ready in %.1fs", a.Index, time.Since(t0).Seconds())
		}
	})
	if m := minReady(); m < 1 {
		t.Errorf("the frontend's Service had %d ready endpoints at some point of the disruptions; want at least 1", m)
	}
	stopWriter()
	if err := <-writerDone; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("writer: %v", err)
	}
	settle("at the end")

	// The numbers, in a form for the closing note.
	t.Logf("HA frontend (2 replicas, 3 apiservers), 4 informers per group, %d configmaps, %d writes at 20/s:", objects, w.count())
	sent := w.sent()
	for _, p := range phases {
		t.Logf("  %-10s writer   %5.1fs: longest time between two writes %.2fs", p.name, p.end.Sub(p.start).Seconds(), p.writerGap.Seconds())
		for _, g := range []string{"watchsan", "direct"} {
			var rewatch, relist, fail int64
			var gap, delay time.Duration
			for _, inf := range group[g] {
				b, a := p.before[inf.name], p.after[inf.name]
				rewatch += a.rewatches - b.rewatches
				relist += a.relists - b.relists
				fail += a.failures - b.failures
				gap = max(gap, inf.longestGap(p.start, p.end))
				delay = max(delay, inf.longestDelay(sent, p.start, p.end))
			}
			t.Logf("  %-10s %-8s %5.1fs: re-watches %d, relists %d, failed requests %d, longest gap between events %.2fs, longest write-to-event delay %.2fs",
				p.name, g, p.end.Sub(p.start).Seconds(), rewatch, relist, fail, gap.Seconds(), delay.Seconds())
			// The frontend's own moves must cost its clients no relist: a replica that stops
			// ends its watches cleanly and answers a re-watch that still reaches it 429 with
			// Retry-After on a closed connection (apistatus.ShuttingDown), never a 503 the
			// Reflector relists on. (The apiservers' restart may still force one through a 410
			// that no apiserver can serve; that is logged above, not asserted.)
			if g == "watchsan" && p.name != "apiservers" && relist > 0 {
				t.Errorf("%s: the informers through watchsan relisted %d times", p.name, relist)
			}
		}
	}
	t.Logf("connections per frontend endpoint over the test: %v", viaFrontend.perBackend())

	// No event lost: every informer was handed every write but those a relist of its own
	// explains, and its store is the apiserver's.
	var list *corev1.ConfigMapList
	if err := anyAPI(func(k kubernetes.Interface) (err error) {
		list, err = k.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: "watchsan.test/ha=writer"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, cm := range list.Items {
		want[cm.Name] = cm.ResourceVersion
	}
	for _, g := range group {
		for _, inf := range g {
			missed := inf.missed(w.all())
			for _, l := range inf.relistLog() {
				t.Log(l)
			}
			if lost := inf.unexplained(missed, sent, time.Minute); len(lost) > 0 {
				t.Errorf("informer %s was never handed %d writes that no relist of its own explains: %v", inf.name, len(lost), lost[:min(len(lost), 10)])
			} else if len(missed) > 0 {
				t.Logf("informer %s was not handed %d writes, all around its relists (the writes a relist skips): %v", inf.name, len(missed), missed[:min(len(missed), 10)])
			}
			got := map[string]string{}
			for _, o := range inf.informer.GetStore().List() {
				if cm := o.(*corev1.ConfigMap); cm.Labels["watchsan.test/ha"] == "writer" {
					got[cm.Name] = cm.ResourceVersion
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("informer %s's store %v, the apiserver's list %v", inf.name, got, want)
			}
		}
	}
}

// renderHA renders deploy/overlays/ha as two Deployments on this node (see
// TestHAFrontendForReal); ports holds each replica's listen and admin port in turn.
func renderHA(t *testing.T, image string, ports, apiserverPorts []int) []byte {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(repoRoot(t), "deploy", "overlays", "ha"))
	if err != nil {
		t.Fatalf("kustomize build deploy/overlays/ha: %v", err)
	}
	var out []byte
	emit := func(v any) {
		y, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		out = append(append(out, "---\n"...), y...)
	}
	var cm *corev1.ConfigMap
	var d *appsv1.Deployment
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
			emit(&ns)
		case "ConfigMap":
			cm = &corev1.ConfigMap{}
			mustUnmarshal(t, data, cm)
		case "Deployment":
			d = &appsv1.Deployment{}
			mustUnmarshal(t, data, d)
		default:
			var obj map[string]any
			mustUnmarshal(t, data, &obj)
			emit(obj)
		}
	}
	if cm == nil || d == nil {
		t.Fatal("deploy/overlays/ha renders no Deployment or no config ConfigMap")
	}
	zero, one := intstr.FromInt32(0), intstr.FromInt32(1)
	for i, r := range haReplicas {
		rcm := cm.DeepCopy()
		rcm.Name = cm.Name + "-" + r
		patchFrontendConfig(t, rcm, ports[2*i], ports[2*i+1], apiserverPorts)
		emit(rcm)
		rd := d.DeepCopy()
		rd.Name = d.Name + "-" + r
		patchFrontendDeployment(t, rd, image, ports[2*i], ports[2*i+1])
		rd.Spec.Selector.MatchLabels["watchsan.test/replica"] = r
		rd.Spec.Template.Labels["watchsan.test/replica"] = r
		rd.Spec.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{MaxSurge: &zero, MaxUnavailable: &one}
		found := false
		for j := range rd.Spec.Template.Spec.Volumes {
			if v := &rd.Spec.Template.Spec.Volumes[j]; v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
				v.ConfigMap.Name, found = rcm.Name, true
			}
		}
		if !found {
			t.Fatalf("deploy/overlays/ha: the Deployment mounts no ConfigMap %s", cm.Name)
		}
		emit(rd)
	}
	return out
}

// rollDeployment changes an annotation in the Deployment's pod template and waits until the
// rollout is complete: the new pod Ready, no old one left.
func rollDeployment(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	t0 := time.Now()
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"watchsan.test/rolled-at":%q}}}}}`, t0.Format(time.RFC3339Nano))
	d, err := cs.AppsV1().Deployments(frontendNS).Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gen := d.Generation
	if err := nodetest.Poll(ctx, func() error {
		d, err := cs.AppsV1().Deployments(frontendNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := d.Status
		if st.ObservedGeneration < gen || st.UpdatedReplicas != 1 || st.Replicas != 1 || st.ReadyReplicas != 1 || st.AvailableReplicas != 1 {
			return fmt.Errorf("status %+v", st)
		}
		pods, err := cs.CoreV1().Pods(frontendNS).List(ctx, metav1.ListOptions{LabelSelector: labelsOf(d.Spec.Selector.MatchLabels)})
		if err != nil {
			return err
		}
		if len(pods.Items) != 1 {
			return fmt.Errorf("%d pods", len(pods.Items))
		}
		return nil
	}); err != nil {
		t.Fatalf("the rollout of %s: %v", name, err)
	}
	t.Logf("rollout of %s complete in %.1fs", name, time.Since(t0).Seconds())
}

// drainFrontend evicts the frontend's pods one at a time through the Eviction API, as `kubectl
// drain` does, and checks the PodDisruptionBudget: a second eviction while the first pod's
// replacement is not Ready is refused with 429.
func drainFrontend(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	podOf := func(r string) *corev1.Pod {
		var pod *corev1.Pod
		if err := nodetest.Poll(ctx, func() error {
			pods, err := cs.CoreV1().Pods(frontendNS).List(ctx, metav1.ListOptions{LabelSelector: "watchsan.test/replica=" + r})
			if err != nil {
				return err
			}
			if len(pods.Items) != 1 || pods.Items[0].DeletionTimestamp != nil || !nodetest.PodReady(&pods.Items[0]) {
				return fmt.Errorf("%d pods of replica %s, want one Ready", len(pods.Items), r)
			}
			pod = &pods.Items[0]
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return pod
	}
	pdbAllows := func(n int32) {
		if err := nodetest.Poll(ctx, func() error {
			pdb, err := cs.PolicyV1().PodDisruptionBudgets(frontendNS).Get(ctx, "watchsan-frontend", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if pdb.Status.ObservedGeneration < pdb.Generation || pdb.Status.DisruptionsAllowed != n || pdb.Status.CurrentHealthy != 2 {
				return fmt.Errorf("PDB status %+v", pdb.Status)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	evict := func(p *corev1.Pod) error {
		return cs.PolicyV1().Evictions(frontendNS).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
	}
	for i, r := range haReplicas {
		pdbAllows(1)
		p := podOf(r)
		t0 := time.Now()
		if err := evict(p); err != nil {
			t.Fatalf("evicting %s: %v", p.Name, err)
		}
		if i == 0 {
			other := podOf(haReplicas[1])
			err := evict(other)
			if !apierrors.IsTooManyRequests(err) {
				t.Fatalf("evicting %s while %s's replacement is not Ready: %v, want 429 from the PodDisruptionBudget", other.Name, p.Name, err)
			}
			t.Logf("the second eviction, while the first pod's replacement was not Ready: refused, %v", err)
		}
		np := podOf(r)
		t.Logf("pod %s evicted, its replacement %s Ready %.1fs later", p.Name, np.Name, time.Since(t0).Seconds())
	}
	pdbAllows(1)
}

func labelsOf(m map[string]string) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// ---- the clients' side ----

// endpointsPoll keeps the ready endpoints of the frontend's Service, from its EndpointSlices,
// as loopback addresses (the pods are hostNetwork: each endpoint is the node's address and the
// pod's https port; nothing may connect to the node's address here).
type endpointsPoll struct {
	mu    sync.Mutex
	addrs []string
	mins  []*atomic.Int64
}

func (e *endpointsPoll) run(ctx context.Context, api func(func(kubernetes.Interface) error) error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		var slices *discoveryv1.EndpointSliceList
		if err := api(func(k kubernetes.Interface) (err error) {
			slices, err = k.DiscoveryV1().EndpointSlices(frontendNS).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=watchsan-frontend"})
			return err
		}); err == nil {
			var addrs []string
			for _, s := range slices.Items {
				port := 0
				for _, p := range s.Ports {
					if p.Name != nil && *p.Name == "https" && p.Port != nil {
						port = int(*p.Port)
					}
				}
				for _, ep := range s.Endpoints {
					if port != 0 && ep.Conditions.Ready != nil && *ep.Conditions.Ready {
						addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(port))
					}
				}
			}
			sort.Strings(addrs)
			e.mu.Lock()
			e.addrs = addrs
			for _, m := range e.mins {
				if int64(len(addrs)) < m.Load() {
					m.Store(int64(len(addrs)))
				}
			}
			e.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (e *endpointsPoll) ready() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.addrs...)
}

// watchMin starts recording the fewest ready endpoints seen; the function returns it so far.
func (e *endpointsPoll) watchMin() func() int64 {
	m := &atomic.Int64{}
	e.mu.Lock()
	m.Store(int64(len(e.addrs)))
	e.mins = append(e.mins, m)
	e.mu.Unlock()
	return m.Load
}

// tcpLB is a per-connection TCP load balancer on loopback, as kube-proxy is for a Service: each
// new connection goes to the next backend, in turn, of those backends() returns at that moment
// (the next one if a dial fails).
type tcpLB struct {
	addr     string
	backends func() []string
	next     atomic.Uint64
	mu       sync.Mutex
	counts   map[string]int
	conns    map[net.Conn]bool
}

func startLB(t *testing.T, backends func() []string) *tcpLB {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lb := &tcpLB{addr: ln.Addr().String(), backends: backends, counts: map[string]int{}, conns: map[net.Conn]bool{}}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go lb.serve(conn)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		lb.mu.Lock()
		for c := range lb.conns {
			c.Close()
		}
		lb.mu.Unlock()
	})
	return lb
}

func (lb *tcpLB) track(c net.Conn, on bool) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if on {
		lb.conns[c] = true
	} else {
		delete(lb.conns, c)
	}
}

func (lb *tcpLB) serve(conn net.Conn) {
	defer conn.Close()
	lb.track(conn, true)
	defer lb.track(conn, false)
	bs := lb.backends()
	start := lb.next.Add(1)
	var up net.Conn
	for k := range bs {
		addr := bs[(int(start)+k)%len(bs)]
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err == nil {
			up = c
			lb.mu.Lock()
			lb.counts[addr]++
			lb.mu.Unlock()
			break
		}
	}
	if up == nil {
		return
	}
	defer up.Close()
	lb.track(up, true)
	defer lb.track(up, false)
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, conn); done <- struct{}{} }()
	go func() { io.Copy(conn, up); done <- struct{}{} }()
	<-done
}

func (lb *tcpLB) perBackend() map[string]int {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	out := map[string]int{}
	for k, v := range lb.counts {
		out[k] = v
	}
	return out
}

// cmWriter updates configmaps in turn, each write with a sequence number in its data.
type cmWriter struct {
	ns  string
	api func(func(kubernetes.Interface) error) error

	mu      sync.Mutex
	seq     int
	n       int
	written map[string][]string  // name -> the seqs written, in order
	latest  map[string]int       // name -> the seq of its last write
	sentAt  map[string]time.Time // name@seq -> when the write was sent
	gap     time.Duration        // the longest time between two successful writes
	last    time.Time
}

func (w *cmWriter) write(ctx context.Context, name string) error {
	w.mu.Lock()
	w.seq++
	seq := strconv.Itoa(w.seq)
	w.mu.Unlock()
	sent := time.Now()
	err := w.api(func(k kubernetes.Interface) error {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"watchsan.test/ha": "writer"}}, Data: map[string]string{"seq": seq}}
		_, err := k.CoreV1().ConfigMaps(w.ns).Update(ctx, cm, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			_, err = k.CoreV1().ConfigMaps(w.ns).Create(ctx, cm, metav1.CreateOptions{})
		}
		return err
	})
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.written[name] = append(w.written[name], seq)
	w.latest[name], _ = strconv.Atoi(seq)
	w.sentAt[name+"@"+seq] = sent
	if !w.last.IsZero() {
		w.gap = max(w.gap, time.Since(w.last))
	}
	w.last = time.Now()
	w.n++
	w.mu.Unlock()
	return nil
}

// run writes the objects in turn, one write every interval, until ctx ends. A write that
// fails (every apiserver refused it) is retried with the next sequence number.
func (w *cmWriter) run(ctx context.Context, objects int, interval time.Duration) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if err := w.write(ctx, "cm-"+strconv.Itoa(i%objects)); err != nil && ctx.Err() == nil {
			i-- // the same object again
		}
	}
}

// latestSeqs returns the seq of each object's last write so far.
func (w *cmWriter) latestSeqs() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int, len(w.latest))
	for k, v := range w.latest {
		out[k] = v
	}
	return out
}

func (w *cmWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// longestGap returns the longest time between two successful writes so far, and resets it.
func (w *cmWriter) longestGap() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := w.gap
	w.gap = 0
	return g
}

// sent returns when each write was sent, by name@seq.
func (w *cmWriter) sent() map[string]time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]time.Time, len(w.sentAt))
	for k, v := range w.sentAt {
		out[k] = v
	}
	return out
}

func (w *cmWriter) all() map[string][]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string][]string{}
	for k, v := range w.written {
		out[k] = append([]string(nil), v...)
	}
	return out
}

// haCounts are the requests one informer sent for its configmaps, counted as they leave
// client-go (below its retries); the idea of test/e2e's clientRequests.
type haCounts struct {
	rewatches int64 // watches from the last resourceVersion
	relists   int64 // LISTs, and watch-lists (sendInitialEvents) after the first sync
	failures  int64 // answers other than 2xx, and transport errors
}

type haCountingRT struct {
	next http.RoundTripper
	path string
	inf  *haInformer
}

func (rt *haCountingRT) RoundTrip(req *http.Request) (*http.Response, error) {
	ours := req.URL.Path == rt.path && req.Method == http.MethodGet
	if ours {
		q := req.URL.Query()
		rt.inf.mu.Lock()
		switch watch, _ := strconv.ParseBool(q.Get("watch")); {
		case !watch:
			rt.inf.relisted()
		case q.Get("sendInitialEvents") == "true":
			if rt.inf.synced {
				rt.inf.relisted()
			}
			rt.inf.synced = true
		default:
			rt.inf.c.rewatches++
		}
		rt.inf.mu.Unlock()
	}
	resp, err := rt.next.RoundTrip(req)
	if ours && (err != nil || resp.StatusCode >= 300) {
		rt.inf.mu.Lock()
		rt.inf.c.failures++
		rt.inf.mu.Unlock()
	}
	return resp, err
}

// haInformer is a client-go shared informer on the writer's configmaps that records when each
// write reached its handlers.
type haInformer struct {
	name     string
	informer cache.SharedIndexInformer

	mu      sync.Mutex
	c       haCounts
	synced  bool
	lastErr string
	relists []haRelist                 // every relist after the first sync
	seen    map[string]map[string]bool // name -> seqs handed to the handlers
	newest  map[string]int             // name -> the highest seq handed
	first   map[string]time.Time       // name@seq -> when it was first handed
	n       int                        // distinct writes handed
	at      []time.Time                // when each change (not a relist's unchanged object) arrived
}

func startHAInformer(ctx context.Context, t *testing.T, name string, cfg *rest.Config, ns string) *haInformer {
	t.Helper()
	inf := &haInformer{name: name, seen: map[string]map[string]bool{}, newest: map[string]int{}, first: map[string]time.Time{}}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 100, 200
	// A dialer of its own: client-go then gives the informer its own transport and so its own
	// connection (through the load balancer), instead of sharing one HTTP/2 connection.
	d := &net.Dialer{Timeout: 5 * time.Second}
	cfg.Dial = d.DialContext
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return &haCountingRT{next: rt, path: "/api/v1/namespaces/" + ns + "/configmaps", inf: inf}
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	inf.informer = coreinformers.NewFilteredConfigMapInformer(cs, ns, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.LabelSelector = "watchsan.test/ha=writer"
	})
	if err := inf.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		inf.mu.Lock()
		inf.lastErr = time.Now().Format("15:04:05.000") + " " + err.Error()
		inf.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	record := func(obj any, change bool) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return
		}
		inf.mu.Lock()
		defer inf.mu.Unlock()
		if change {
			inf.at = append(inf.at, time.Now())
		}
		s := inf.seen[cm.Name]
		if s == nil {
			s = map[string]bool{}
			inf.seen[cm.Name] = s
		}
		if seq := cm.Data["seq"]; !s[seq] {
			s[seq] = true
			if n, err := strconv.Atoi(seq); err == nil {
				inf.newest[cm.Name] = max(inf.newest[cm.Name], n)
			}
			inf.first[cm.Name+"@"+seq] = time.Now()
			inf.n++
		}
	}
	if _, err := inf.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { record(obj, true) },
		UpdateFunc: func(old, obj any) {
			record(obj, old.(*corev1.ConfigMap).ResourceVersion != obj.(*corev1.ConfigMap).ResourceVersion)
		},
	}); err != nil {
		t.Fatal(err)
	}
	ictx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		inf.informer.RunWithContext(ictx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("informer %s did not stop within 10s", name)
		}
	})
	if err := nodetest.Poll(ctx, func() error {
		if !inf.informer.HasSynced() {
			return errNotYet
		}
		return nil
	}); err != nil {
		t.Fatalf("informer %s never synced: %v", name, err)
	}
	return inf
}

// haRelist is one relist of an informer: when its request left, and the informer's last watch
// error before it (why the reflector relisted).
type haRelist struct {
	at    time.Time
	after string
}

// relisted records a relist; inf.mu is held.
func (inf *haInformer) relisted() {
	inf.c.relists++
	inf.relists = append(inf.relists, haRelist{at: time.Now(), after: inf.lastErr})
}

// caughtUp says whether the informer has been handed each object's write of seq want[name] or
// a later one: what an informer that relisted in between converges to as well as one that
// watched throughout.
func (inf *haInformer) caughtUp(want map[string]int) error {
	inf.mu.Lock()
	defer inf.mu.Unlock()
	for name, seq := range want {
		if got := inf.newest[name]; got < seq {
			return fmt.Errorf("informer %s handed %s up to seq %d of %d", inf.name, name, got, seq)
		}
	}
	return nil
}

// unexplained returns the missed writes (name@seq) that no relist of the informer explains. A
// relist hands the informer each object's state at the list, so the writes between its last
// watch event and the list are never handed to it, by design (client-go's Reflector replaces its
// store); a write is taken as one of those when it was sent within window before a relist's
// request or up to 10 s after it (the list is answered and the next watch opened within that).
// Every other missed write is an event lost.
func (inf *haInformer) unexplained(missed []string, sent map[string]time.Time, window time.Duration) []string {
	inf.mu.Lock()
	defer inf.mu.Unlock()
	var out []string
	for _, k := range missed {
		at, explained := sent[k], false
		for _, r := range inf.relists {
			if at.After(r.at.Add(-window)) && at.Before(r.at.Add(10*time.Second)) {
				explained = true
				break
			}
		}
		if !explained {
			out = append(out, k)
		}
	}
	return out
}

// relistLog describes the informer's relists, for the log.
func (inf *haInformer) relistLog() []string {
	inf.mu.Lock()
	defer inf.mu.Unlock()
	var out []string
	for _, r := range inf.relists {
		out = append(out, fmt.Sprintf("%s relisted at %s after %q", inf.name, r.at.Format("15:04:05.000"), r.after))
	}
	return out
}

// state describes the informer for a failure: its counts, its last watch error, and the
// resourceVersion its store is at.
func (inf *haInformer) state() string {
	inf.mu.Lock()
	defer inf.mu.Unlock()
	return fmt.Sprintf("%s: %d writes handed, newest seqs %v, %+v, last watch error %q, store at %s", inf.name, inf.n, inf.newest, inf.c, inf.lastErr, inf.informer.LastSyncResourceVersion())
}

func (inf *haInformer) counts() haCounts {
	inf.mu.Lock()
	defer inf.mu.Unlock()
	return inf.c
}

// longestGap returns the longest time between changes handed to the handlers within [from, to]
// (the ends count as events: a phase that delivered nothing has a gap as long as itself).
func (inf *haInformer) longestGap(from, to time.Time) time.Duration {
	inf.mu.Lock()
	defer inf.mu.Unlock()
	last, gap := from, time.Duration(0)
	for _, at := range inf.at {
		if at.Before(from) || at.After(to) {
			continue
		}
		gap = max(gap, at.Sub(last))
		last = at
	}
	return max(gap, to.Sub(last))
}

// longestDelay returns the longest time from sending a write to its reaching the handlers, of
// the writes sent within [from, to].
func (inf *haInformer) longestDelay(sent map[string]time.Time, from, to time.Time) time.Duration {
	inf.mu.Lock()
	defer inf.mu.Unlock()
	var d time.Duration
	for k, at := range sent {
		if at.Before(from) || at.After(to) {
			continue
		}
		if got, ok := inf.first[k]; ok {
			d = max(d, got.Sub(at))
		}
	}
	return d
}

// missed returns the writes that never reached the handlers, as name@seq.
func (inf *haInformer) missed(written map[string][]string) []string {
	inf.mu.Lock()
	defer inf.mu.Unlock()
	var out []string
	for name, seqs := range written {
		for _, s := range seqs {
			if !inf.seen[name][s] {
				out = append(out, name+"@"+s)
			}
		}
	}
	sort.Strings(out)
	return out
}
