package node_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/clustertest"
	"github.com/watchsan/watchsan/test/cluster/node"
	"github.com/watchsan/watchsan/test/cluster/node/nodetest"
)

// TestNodeLocalREADME follows deploy/README.md's node-local instructions on a real node as
// they are written, nothing patched: the image as "The image" says for a containerd node
// (`make image`, for this machine's platform only, then the README's `ctr -n k8s.io images
// import bin/image.tar` line, ctr pointed at the node's containerd by CONTAINERD_ADDRESS),
// then the first block of "### Run it" in a directory holding a copy of deploy/ and what the
// reader brings (tls.crt and tls.key for 127.0.0.1 and localhost, ca.crt, APISERVER, kubectl as
// an admin), then its check command. So the DaemonSet runs with the kustomizations' own image
// reference, its ports 7443 and 9091, its probes; and the test checks the running container
// against the manifest's promises (checkRunning) and that no liveness probe failed.
func TestNodeLocalREADME(t *testing.T) {
	nodetest.Skip(t)
	readme := filepath.Join(repoRoot(t), "deploy", "README.md")
	blocks, err := cluster.MarkdownBlocks(readme, "### Run it")
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) < 2 || blocks[0].Lang != "sh" || blocks[1].Lang != "sh" {
		t.Fatalf(`deploy/README.md, "### Run it": want two sh blocks (the steps, the check), got %+v`, blocks)
	}
	imageBlocks, err := cluster.MarkdownBlocks(readme, "## The image")
	if err != nil {
		t.Fatal(err)
	}
	var importLine string
	for _, b := range imageBlocks {
		for _, l := range strings.Split(b.Text, "\n") {
			if strings.HasPrefix(l, "ctr ") && strings.Contains(l, "images import") {
				importLine = l
			}
		}
	}
	if importLine == "" {
		t.Fatal(`deploy/README.md, "The image": no ctr ... images import line for a containerd node`)
	}
	// The DaemonSet's fixed ports, on this shared machine.
	for _, addr := range []string{"127.0.0.1:7443", "127.0.0.1:9091"} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("deploy/base/node-local listens on %s, which something on this machine holds: %v", addr, err)
		}
		l.Close()
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := clustertest.Start(t, cluster.Options{})
	n := nodetest.Start(t, c, node.Options{})
	cs, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	// The DaemonSet controller and the root CA publisher (kube-root-ca.crt), and the scheduler
	// that binds DaemonSet pods.
	for _, name := range []string{cluster.Scheduler, cluster.ControllerManager} {
		if _, err := c.StartComponent(ctx, name, cluster.ComponentOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := filepath.Join(c.Dir, "admin.kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, c.APIServers[0].URL, c.AdminToken, c.CAFile); err != nil {
		t.Fatal(err)
	}

	t0 := time.Now()
	_, builtRef, err := node.WatchsanImage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Shell(ctx, repoRoot(t), kubeconfig, importLine, "CONTAINERD_ADDRESS="+n.ContainerdSocket); err != nil {
		t.Fatal(err)
	}
	t.Logf("make image and the README's %q: %.1fs", importLine, time.Since(t0).Seconds())

	// What the reader brings: the serving certificate and its CA, in the directory the commands
	// run in, next to their checkout's deploy/.
	dir := t.TempDir()
	if out, err := exec.Command("cp", "-r", filepath.Join(repoRoot(t), "deploy"), dir).CombinedOutput(); err != nil {
		t.Fatalf("cp deploy: %v: %s", err, out)
	}
	cert, key, err := c.CA.IssueServing("watchsan-node-local")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"tls.crt": mustRead(t, cert), "tls.key": mustRead(t, key), "ca.crt": c.CAData} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t1 := time.Now()
	stdout, stderr, err := c.Shell(ctx, dir, kubeconfig, blocks[0].Text, "APISERVER="+c.APIServers[0].URL)
	if err != nil {
		t.Fatalf("deploy/README.md line %d: %v\n%s", blocks[0].Line, err, stdout)
	}
	for _, l := range strings.Split(string(stderr), "\n") {
		if strings.HasPrefix(l, "Warning:") {
			t.Errorf("deploy/README.md line %d: %s", blocks[0].Line, l)
		}
	}
	t.Logf("the README's steps, rollout status included: %.1fs\n%s", time.Since(t1).Seconds(), stdout)

	out, _, err := c.Shell(ctx, dir, kubeconfig, blocks[1].Text)
	if err != nil {
		t.Fatalf("deploy/README.md line %d: %v", blocks[1].Line, err)
	}
	if !strings.Contains(string(out), n.Name) {
		t.Errorf("the README's check through the node-local watchsan printed no node %s:\n%s", n.Name, out)
	}

	pods, err := cs.CoreV1().Pods(nodeLocalNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=node-local"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("%d node-local pods, want 1", len(pods.Items))
	}
	pod := &pods.Items[0]
	// The kustomizations' reference, unpatched, resolved to the image make image built (the
	// runtime reports it by either of its two tags).
	for _, c := range pod.Spec.Containers {
		if c.Image != node.WatchsanDevImage {
			t.Errorf("container %s: image %s, want the kustomizations' %s", c.Name, c.Image, node.WatchsanDevImage)
		}
	}
	for _, st := range pod.Status.ContainerStatuses {
		if st.Image != node.WatchsanDevImage && st.Image != builtRef {
			t.Errorf("container %s runs image %s, not the one make image built (%s, %s)", st.Name, st.Image, builtRef, node.WatchsanDevImage)
		}
		if st.RestartCount != 0 {
			t.Errorf("container %s restarted %d times", st.Name, st.RestartCount)
		}
	}
	t.Logf("running as the kubelet applied it: %s", checkRunning(ctx, t, n, pod, "watchsan"))
	t.Logf("the kubelet's failed probes of watchsan (Unhealthy events): %v", probeFailures(ctx, t, cs, pod, "watchsan"))
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}
