// Package nodetest starts a real node (test/cluster/node) for a Go test.
package nodetest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/watchsan/watchsan/test/cluster"
	"github.com/watchsan/watchsan/test/cluster/node"
)

// RequireEnv names the environment variable that turns a machine unable to run a node (not
// root, no runc, ...) from a skip into a failure: CI sets it (make test-node), so that a node
// test never passes there by not running.
const RequireEnv = "WATCHSAN_REQUIRE_NODE"

// Skip skips the test (or fails it, with RequireEnv=1) if this machine cannot run a node, or
// in -short mode.
func Skip(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a real node; skipped in -short mode")
	}
	if err := node.Check(); err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("%s=1 and this machine cannot run a node: %v", RequireEnv, err)
		}
		t.Skipf("this machine cannot run a node (set %s=1 to fail instead): %v", RequireEnv, err)
	}
}

// Start starts a node for cluster c (see Skip for when it skips), closes it in t.Cleanup and
// logs the tails of containerd's and the kubelet's logs first if the test failed. Start it
// after the cluster, so that it is closed before the cluster stops.
func Start(t testing.TB, c *cluster.Cluster, o node.Options) *node.Node {
	t.Helper()
	Skip(t)
	ctx, cancel := context.WithTimeout(context.Background(), node.DefaultStartTimeout)
	defer cancel()
	n, err := node.Start(ctx, c, o)
	if err != nil {
		t.Fatalf("starting the node: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node logs (tails):\n%s", n.LogTails(40))
		}
		n.Close()
	})
	return n
}

// Poll runs f every 100 ms until it returns nil or ctx ends; the error then carries f's last.
func Poll(ctx context.Context, f func() error) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// PodReady reports whether the pod's Ready condition is True.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
