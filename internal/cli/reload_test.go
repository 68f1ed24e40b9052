package cli

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/watchsan/watchsan/internal/config"
	"github.com/watchsan/watchsan/internal/testutil"
)

// a change of the --config file, or SIGHUP, applies the configuration again
// (loaded, validated and completed as at the start); an invalid one is logged and not applied.
func TestReloadOnFileChangeAndSIGHUP(t *testing.T) {
	file := filepath.Join(t.TempDir(), "watchsan.yaml")
	write := func(s string) {
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write("upstream: [\"https://a:6443\"]\n")
	args := []string{"--config", file, "--config-check-interval=50ms"}
	cfg, err := config.Load(args)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cfg.Complete()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var applied [][]string
	apply := func(c *config.Completed) error {
		var us []string
		for _, u := range c.Upstreams {
			us = append(us, u.String())
		}
		mu.Lock()
		applied = append(applied, us)
		mu.Unlock()
		return nil
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(applied) }
	core, logs := observer.New(zap.InfoLevel)
	r := newReloader(args, c, apply, zap.New(core))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() { r.run(ctx, stopped); close(done) }()
	defer func() { cancel(); close(stopped); <-done }()

	write("upstream: [\"https://a:6443\", \"https://b:6443\"]\n")
	testutil.Eventually(t, 5*time.Second, "the file change applied", func() bool { return count() == 1 })
	write("upstream: [\"ftp://nope\"]\n")
	testutil.Eventually(t, 5*time.Second, "the invalid file reported", func() bool {
		return logs.FilterMessageSnippet("invalid configuration").Len() == 1
	})
	write("upstream: [\"https://c:6443\"]\n")
	testutil.Eventually(t, 5*time.Second, "the fixed file applied", func() bool { return count() == 2 })
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "SIGHUP applied", func() bool { return count() == 3 })
	mu.Lock()
	defer mu.Unlock()
	if len(applied[0]) != 2 || applied[1][0] != "https://c:6443" || applied[2][0] != "https://c:6443" {
		t.Fatalf("applied %v", applied)
	}
}

// SIGHUP after shutdown began killed watchsan at once (exit 129, its watches
// cut mid-stream), the reloader having stopped catching it. It is now logged and ignored
// until the server has stopped; nothing is reloaded.
func TestSIGHUPDuringShutdownIgnored(t *testing.T) {
	cfg, err := config.Load([]string{"--upstream=https://127.0.0.1:1", "--no-credentials"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cfg.Complete()
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	applied := 0
	r := newReloader(nil, c, func(*config.Completed) error { applied++; return nil }, zap.New(core))
	ctx, cancel := context.WithCancel(context.Background())
	stopped, done := make(chan struct{}), make(chan struct{})
	go func() { r.run(ctx, stopped); close(done) }()
	cancel() // shutdown begins
	for i := 0; i < 2; i++ {
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 5*time.Second, "the SIGHUP during shutdown logged", func() bool {
			return logs.FilterMessageSnippet("SIGHUP during shutdown").Len() == i+1
		})
	}
	close(stopped)
	<-done
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil { // ignored, not fatal
		t.Fatal(err)
	}
	if applied != 0 {
		t.Fatalf("a SIGHUP during shutdown reloaded the configuration %d times", applied)
	}
}
