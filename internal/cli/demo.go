package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"syscall"

	"go.uber.org/zap"
	"k8s.io/klog/v2"

	"github.com/watchsan/watchsan/internal/demo"
	"github.com/watchsan/watchsan/internal/logging"
)

// runDemo runs `watchsan demo [flags]`: the 1.7-1.9 DELETED-event incident, reproduced with and
// without watchsan, reported on stdout. Exit 0 when the demo showed what it should, 1 when it
// did not or could not run, 2 on bad flags.
func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("watchsan demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	useReal := fs.Bool("real", false, "run against a real etcd and kube-apiserver from the test harness (binaries built by make cluster-bins) instead of the in-memory apiserver")
	objects := fs.Int("objects", 3, "how many objects to create between a and its delete (1-200)")
	timeout := fs.Duration("timeout", 0, "bound the whole run (default 30s, or 3m with --real)")
	verbose := fs.Bool("verbose", false, "log what the components do (watchsan, the fault layers, client-go) to stderr")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: watchsan demo [flags]\n\n"+
			"Reproduces the Kubernetes 1.7-1.9 bug where DELETED watch events carried an old\n"+
			"resourceVersion (kubernetes#58545): one client-go informer reads the buggy apiserver\n"+
			"directly, one through watchsan; the report compares what their handlers saw.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "watchsan demo: unexpected arguments: %v\n", fs.Args())
		return exitUsage
	}
	if *objects < 1 || *objects > 200 {
		fmt.Fprintf(stderr, "watchsan demo: --objects %d: want 1 to 200\n", *objects)
		return exitUsage
	}

	log := zap.NewNop()
	if *verbose {
		l, err := NewLogger("info", "console", stderr)
		if err != nil {
			fmt.Fprintln(stderr, "watchsan demo:", err)
			return exitError
		}
		log = l
		defer func() { _ = log.Sync() }()
		logging.RouteKlog(log)
	} else {
		// client-go also logs through klog's global logger; keep the report readable.
		klog.SetOutput(io.Discard)
		klog.LogToStderr(false)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *useReal {
		if err := demo.CheckReal(); err != nil {
			fmt.Fprintf(stderr, "watchsan demo --real: %v\nRun `watchsan demo` without --real for the in-memory apiserver.\n", err)
			return exitError
		}
		fmt.Fprintln(stdout, "Starting etcd and kube-apiserver from the test harness...")
	}
	res, err := demo.Run(ctx, demo.Options{Real: *useReal, Objects: *objects, Timeout: *timeout, Log: log})
	if err != nil {
		fmt.Fprintf(stderr, "watchsan demo: %v\n", err)
		return exitError
	}
	res.WriteReport(stdout)
	if !res.OK() {
		return exitError
	}
	return exitOK
}
