// Command watchsan-demo reproduces the Kubernetes 1.7-1.9 DELETED-event incident
// (kubernetes#58545) with and without watchsan and reports what client-go informers saw
// (`make demo`). It is a command of its own so that the production binary, watchsan, does not
// link the in-memory apiserver, the fault layers or the test harness it needs.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"k8s.io/klog/v2"

	"github.com/watchsan/watchsan/internal/cli"
	"github.com/watchsan/watchsan/internal/demo"
	"github.com/watchsan/watchsan/internal/logging"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// Exit codes, as watchsan's.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// run runs the demo: exit 0 when it showed what it should, 1 when it did not or could not run,
// 2 on bad flags.
func run(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("watchsan-demo", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.SortFlags = false
	useReal := fs.Bool("real", false, "run against a real etcd and kube-apiserver from the test harness (binaries built by make cluster-bins) instead of the in-memory apiserver")
	objects := fs.Int("objects", 3, "how many objects to create between a and its delete (1-200)")
	timeout := fs.Duration("timeout", 0, "bound the whole run (default 30s, or 3m with --real)")
	verbose := fs.Bool("verbose", false, "log what the components do (watchsan, the fault layers, client-go) to stderr")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: watchsan-demo [flags]\n\n"+
			"Reproduces the Kubernetes 1.7-1.9 bug where DELETED watch events carried an old\n"+
			"resourceVersion (kubernetes#58545): one client-go informer reads the buggy apiserver\n"+
			"directly, one through watchsan; the report compares what their handlers saw.\n\nFlags:\n")
		fmt.Fprint(stderr, fs.FlagUsagesWrapped(100))
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "watchsan-demo: unexpected arguments: %v\n", fs.Args())
		return exitUsage
	}
	if *objects < 1 || *objects > 200 {
		fmt.Fprintf(stderr, "watchsan-demo: --objects %d: want 1 to 200\n", *objects)
		return exitUsage
	}

	log := zap.NewNop()
	if *verbose {
		l, err := cli.NewLogger("info", "console", stderr)
		if err != nil {
			fmt.Fprintln(stderr, "watchsan-demo:", err)
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
			fmt.Fprintf(stderr, "watchsan-demo --real: %v\nRun `watchsan-demo` without --real for the in-memory apiserver.\n", err)
			return exitError
		}
		fmt.Fprintln(stdout, "Starting etcd and kube-apiserver from the test harness...")
	}
	res, err := demo.Run(ctx, demo.Options{Real: *useReal, Objects: *objects, Timeout: *timeout, Log: log})
	if err != nil {
		fmt.Fprintf(stderr, "watchsan-demo: %v\n", err)
		return exitError
	}
	res.WriteReport(stdout)
	if !res.OK() {
		return exitError
	}
	return exitOK
}
