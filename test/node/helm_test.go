package node_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/clustertest"
	"github.com/watchsan/watchsan/test/cluster/node"
	"github.com/watchsan/watchsan/test/cluster/node/nodetest"
)

// TestHelmChartNodeLocal installs deploy/helm/watchsan on the real node with the real Helm CLI
// (`helm install`, mode node-local, against the node's apiserver) and checks what a user
// would: the DaemonSet's pod becomes Ready through the probes the chart renders, runs the
// image the release names, as its manifest promises (checkRunning), and serves a watch: a
// client with its own token watches ConfigMaps through the node's loopback listener and sees
// one created at the apiserver. Values a user sets for such a node: the image `make image`
// built, free ports (the probes and the --config file follow them), the apiserver by address
// (no kube-proxy or DNS here).
func TestHelmChartNodeLocal(t *testing.T) {
	nodetest.Skip(t)
	helm, err := cluster.Binary("helm")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := clustertest.Start(t, cluster.Options{})
	n := nodetest.Start(t, c, node.Options{})
	cs, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	// The DaemonSet controller and the root CA publisher (kube-root-ca.crt), and the scheduler.
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
	colon := strings.LastIndex(wsRef, ":")
	repo, tag := wsRef[:colon], wsRef[colon+1:]
	ports, err := node.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	listen, admin := ports[0], ports[1]
	kubeconfig := filepath.Join(c.Dir, "admin.kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}

	// The namespace and the serving certificate first, as the chart's NOTES say; then the
	// release.
	const ns = "watchsan-helm"
	cert, key, err := c.CA.IssueServing("watchsan-node-local")
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	chart := filepath.Join(repoRoot(t), "deploy", "helm", "watchsan")
	script := fmt.Sprintf(`kubectl create namespace %[1]s
kubectl -n %[1]s create secret tls watchsan-node-local-tls --cert=%[2]s --key=%[3]s
%[4]s install watchsan %[5]s --namespace %[1]s --kubeconfig "$KUBECONFIG" \
  --set mode=node-local --set image.repository=%[6]s --set image.tag=%[7]s \
  --set nodeLocal.port=%[8]d --set nodeLocal.adminPort=%[9]d --set-json 'upstreams=["%[10]s"]'
`, ns, cert, key, helm, chart, repo, tag, listen, admin, c.APIServers[0].URL)
	stdout, stderr, err := c.Shell(ctx, c.Dir, kubeconfig, script, "HELM_CACHE_HOME="+filepath.Join(c.Dir, "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(c.Dir, "helm", "config"), "HELM_DATA_HOME="+filepath.Join(c.Dir, "helm", "data"))
	if err != nil {
		t.Fatalf("helm install: %v\n%s\n%s", err, stdout, stderr)
	}
	for _, l := range strings.Split(string(stderr), "\n") {
		if strings.HasPrefix(l, "Warning:") || strings.HasPrefix(l, "WARNING") {
			t.Errorf("helm install: %s", l)
		}
	}

	var pod *corev1.Pod
	if err := nodetest.Poll(ctx, func() error {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=node-local"})
		if err != nil {
			return err
		}
		if len(pods.Items) != 1 {
			return fmt.Errorf("%d node-local pods", len(pods.Items))
		}
		if !nodetest.PodReady(&pods.Items[0]) {
			return fmt.Errorf("pod %s: %s", pods.Items[0].Name, statusSummary(&pods.Items[0]))
		}
		pod = &pods.Items[0]
		return nil
	}); err != nil {
		t.Fatalf("the chart's DaemonSet never had a Ready pod: %v", err)
	}
	t.Logf("helm install to a Ready pod (%s): %.1fs", pod.Name, time.Since(t0).Seconds())
	if got := pod.Spec.Containers[0].Image; got != wsRef {
		t.Errorf("the pod runs %s, the release named %s", got, wsRef)
	}
	if pod.Labels["app.kubernetes.io/name"] != "watchsan" {
		t.Errorf("pod labels %v", pod.Labels)
	}
	t.Logf("running as the kubelet applied it: %s", checkRunning(ctx, t, n, pod, "watchsan"))

	// A watch through the node-local listener, with the client's own token.
	cfg := c.RESTConfig(0, c.AdminToken)
	cfg.Host = "https://127.0.0.1:" + strconv.Itoa(listen)
	through, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	adminURL := "http://127.0.0.1:" + strconv.Itoa(admin)
	before := metric(ctx, t, adminURL, "watchsan_open_watches")
	w, err := through.CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("a watch through the chart's watchsan: %v", err)
	}
	defer w.Stop()
	if err := nodetest.Poll(ctx, func() error {
		if v := metric(ctx, t, adminURL, "watchsan_open_watches"); v <= before {
			return fmt.Errorf("watchsan_open_watches %v", v)
		}
		return nil
	}); err != nil {
		t.Fatalf("watchsan never counted the watch: %v", err)
	}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "through-helm"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	seen := false
	for !seen {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch through watchsan ended before the ConfigMap was seen")
			}
			if cm, isCM := ev.Object.(*corev1.ConfigMap); isCM && ev.Type == watch.Added && cm.Name == "through-helm" {
				seen = true
			}
		case <-ctx.Done():
			t.Fatal("the ConfigMap created at the apiserver never reached the watch through watchsan")
		}
	}
	t.Logf("a ConfigMap watch through the chart's watchsan (https://127.0.0.1:%d) saw a create; open watches %v -> %v",
		listen, before, metric(ctx, t, adminURL, "watchsan_open_watches"))
	t.Logf("the kubelet's failed probes of watchsan (Unhealthy events): %v", probeFailures(ctx, t, cs, pod, "watchsan"))
}
