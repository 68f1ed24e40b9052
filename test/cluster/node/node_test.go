package node_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/clustertest"
	"github.com/watchsan/watchsan/test/cluster/node"
	"github.com/watchsan/watchsan/test/cluster/node/nodetest"
)

// TestNodeRunsPods starts a real node (containerd, runc, kubelet) with a scheduler and a
// controller manager, and runs a static pod and a Deployment's pod from the node's own sandbox
// image until both are Ready. Close must leave nothing behind: no process, mount or cgroup.
func TestNodeRunsPods(t *testing.T) {
	nodetest.Skip(t)
	c := clustertest.Start(t, cluster.Options{})
	hostDirs := map[string]bool{} // what the node may create outside its Dir, and must remove
	for _, d := range []string{"/run/containerd", "/var/lib/kubelet"} {
		_, err := os.Stat(d)
		hostDirs[d] = err == nil
	}
	t0 := time.Now()
	n := nodetest.Start(t, c, node.Options{})
	t.Logf("node Ready %.1fs after start", time.Since(t0).Seconds())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(c.RESTConfig(0, c.AdminToken))
	if err != nil {
		t.Fatal(err)
	}

	// A static pod: the kubelet runs it from its manifest directory, and posts its mirror pod.
	static := pausePod("static-pause")
	static.Namespace = "default"
	b, err := yaml.Marshal(static)
	if err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	if err := os.WriteFile(filepath.Join(n.StaticPodDir, "static-pause.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	waitPodReady(ctx, t, cs, "default", "static-pause-"+n.Name)
	t.Logf("static pod Ready %.1fs after its manifest was written", time.Since(t1).Seconds())

	// A Deployment: the controller manager makes its ReplicaSet and pod, the scheduler binds it.
	for _, name := range []string{cluster.Scheduler, cluster.ControllerManager} {
		if _, err := c.StartComponent(ctx, name, cluster.ComponentOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	one := int32(1)
	pod := pausePod("web")
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec:       pod.Spec,
			},
		},
	}
	t2 := time.Now()
	if err := nodetest.Poll(ctx, func() error {
		_, err := cs.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := nodetest.Poll(ctx, func() error {
		got, err := cs.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.Status.ReadyReplicas != 1 {
			return errNotYet
		}
		return nil
	}); err != nil {
		t.Fatalf("Deployment web never had a Ready replica: %v", err)
	}
	t.Logf("Deployment pod Ready %.1fs after create", time.Since(t2).Seconds())

	// Close leaves nothing: no mount under its directory, no cgroup, no shim.
	dir := n.Dir
	n.Close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("after Close, %s: %v (want it gone)", dir, err)
	}
	if m := mountsUnder(t, dir); len(m) > 0 {
		t.Errorf("after Close, mounts left under %s: %v", dir, m)
	}
	if left := cgroupsLeft(t, filepath.Base(dir)); len(left) > 0 {
		t.Errorf("after Close, cgroups left: %v", left)
	}
	for d, had := range hostDirs {
		if _, err := os.Stat(d); !had && !os.IsNotExist(err) {
			t.Errorf("after Close, %s exists (it did not before the node started): %v", d, err)
		}
	}
	if shims := shimsOf(t, filepath.Join(dir, "containerd.sock")); len(shims) > 0 {
		t.Errorf("after Close, shims left: %v", shims)
	}
}
