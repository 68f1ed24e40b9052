// Package clustertest starts the real control plane of test/cluster for a Go test. It is apart
// from test/cluster so that programs using the harness (watchsan-demo --real) do not link the
// testing package.
package clustertest

import (
	"context"
	"testing"

	"github.com/watchsan/watchsan/test/cluster"
)

// Start starts a cluster for a test: it fails the test (with the log tail) if the cluster does
// not start, stops the cluster in t.Cleanup, and logs every process's log tail first if the test
// failed. Missing binaries fail the test too, with how to build them; in -short mode the test is
// skipped instead.
func Start(t testing.TB, o cluster.Options) *cluster.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a real control plane; skipped in -short mode")
	}
	ctx, cancel := context.WithTimeout(context.Background(), cluster.DefaultStartTimeout)
	defer cancel()
	c, err := cluster.Start(ctx, o)
	if err != nil {
		t.Fatalf("starting the test cluster: %v", err)
	}
	t.Cleanup(func() {
		if tails := c.LogTails(30); t.Failed() && tails != "" {
			t.Logf("test cluster logs (tails):\n%s", tails)
		}
		c.Stop()
	})
	return c
}
