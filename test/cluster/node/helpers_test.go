package node_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchsan/watchsan/test/cluster/node"
	"github.com/watchsan/watchsan/test/cluster/node/nodetest"
)

var errNotYet = errors.New("not yet")

// pausePod is a host-network pod running the node's sandbox image as its one container.
func pausePod(name string) *corev1.Pod {
	grace := int64(5)
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "pause",
				Image:           node.SandboxImage,
				ImagePullPolicy: corev1.PullNever,
			}},
		},
	}
}

func waitPodReady(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	if err := nodetest.Poll(ctx, func() error {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !nodetest.PodReady(p) {
			return fmt.Errorf("pod %s/%s phase %s, not Ready", ns, name, p.Status.Phase)
		}
		pod = p
		return nil
	}); err != nil {
		t.Fatalf("pod %s/%s never Ready: %v", ns, name, err)
	}
	return pod
}

// mountsUnder lists the mount points at or under dir.
func mountsUnder(t *testing.T, dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

// cgroupsLeft lists /sys/fs/cgroup/*/<name> directories that exist.
func cgroupsLeft(t *testing.T, name string) []string {
	m, err := filepath.Glob("/sys/fs/cgroup/*/" + name)
	if err != nil {
		t.Fatal(err)
	}
	top, _ := filepath.Glob("/sys/fs/cgroup/" + name)
	return append(m, top...)
}

// shimsOf lists the pids of containerd-shim-runc-v2 processes started for address.
func shimsOf(t *testing.T, address string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), "containerd-shim") && strings.Contains(string(b), address) {
			pids = append(pids, pid)
		}
	}
	return pids
}
