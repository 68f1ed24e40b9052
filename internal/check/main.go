package check

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Exit codes of `watchsan check`.
const (
	ExitClean    = 0 // no problem found
	ExitAffected = 1 // a problem found
	ExitError    = 2 // bad flags or kubeconfig, or the check could not run to its end
)

// Main runs `watchsan check` with args (after "check") and returns its exit code. The report
// goes to stdout, progress and errors to stderr. SIGINT and SIGTERM end the check; the
// namespace it created is deleted first.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("watchsan check", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default $KUBECONFIG, ~/.kube/config, in-cluster)")
	kubeContext := fs.String("context", "", "kubeconfig context (default: its current one)")
	server := fs.String("server", "", "talk to this URL instead of the kubeconfig's server, with the kubeconfig's credentials (a gateway or proxy in front of the apiserver)")
	output := fs.StringP("output", "o", "text", "report format: text or json")
	bookmarkWait := fs.Duration("bookmark-wait", 70*time.Second, fmt.Sprintf("how long a quiet watch waits for bookmarks (apiservers send one about every 60s, and one 2s before the watch's deadline); 0 skips, else at least %v", MinBookmarkWait))
	idleWait := fs.Duration("idle-wait", 70*time.Second, "how long an idle watch is kept open to see whether the path cuts it (runs alongside the bookmark wait); 0 skips")
	timeout := fs.Duration("timeout", 0, "bound the whole check (default: the longer wait plus 2m)")
	prefix := fs.String("namespace-prefix", defaultPrefix, "the temporary namespace's name prefix (5 random characters follow)")
	objects := fs.Int("objects", defaultObjects, "how many objects to create between a and its delete (1-100)")
	verbose := fs.Bool("verbose", false, "log what the check does to stderr")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: watchsan check [flags]\n\n"+
			"Checks whether a cluster, or the path to it (a gateway, a proxy), needs watchsan: in a\n"+
			"temporary namespace it reproduces kubernetes#58545 (create a, create others, delete a,\n"+
			"while watching) and reports whether the DELETED event's resourceVersion goes backwards\n"+
			"and a re-watch replays events, whether bookmarks arrive, whether an idle watch is cut,\n"+
			"and whether the apiserver's version is in the affected ranges (%s).\n\n"+
			"Exit codes: 0 no problem found, 1 a problem found, 2 bad flags or kubeconfig, or the\n"+
			"check could not run to its end. The namespace (label %s=%s) is deleted in every case.\n\nFlags:\n",
			AffectedRangesText, ManagedByLabel, ManagedByValue)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return ExitClean
		}
		fmt.Fprintf(stderr, "watchsan check: %v\nRun 'watchsan check --help' for the flags.\n", err)
		return ExitError
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "watchsan check: "+format+"\n", a...)
		return ExitError
	}
	if fs.NArg() > 0 {
		return usage("unexpected arguments: %v", fs.Args())
	}
	if *output != "text" && *output != "json" {
		return usage("--output %q: want text or json", *output)
	}
	o := Options{NamespacePrefix: *prefix, Objects: *objects, BookmarkWait: *bookmarkWait, IdleWait: *idleWait}
	if *objects == 0 {
		return usage("--objects 0: want 1 to 100")
	}
	if err := o.Validate(); err != nil {
		return usage("%v", err)
	}
	if *timeout < 0 {
		return usage("--timeout %v: want 0 (default) or positive", *timeout)
	}
	if *timeout == 0 {
		*timeout = max(*bookmarkWait, *idleWait) + 2*time.Minute
	}

	rc, err := restConfig(*kubeconfig, *kubeContext, *server)
	if err != nil {
		return usage("%v", err)
	}
	client, err := NewClient(rc)
	if err != nil {
		return usage("kubeconfig: %v", err)
	}

	log := zap.NewNop()
	if *verbose {
		enc := zap.NewDevelopmentEncoderConfig()
		log = zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.Lock(zapcore.AddSync(stderr)), zap.DebugLevel)).Named("watchsan")
		defer func() { _ = log.Sync() }()
	} else {
		// client-go logs through klog's global logger (warnings, throttling); keep the report readable.
		klog.SetOutput(io.Discard)
		klog.LogToStderr(false)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	chk := New(client, rc.Host, clock.RealClock{}, NewProgress(stderr, isTerminal(stderr)), log)
	rep, err := chk.Run(ctx, o)
	if rep.Namespace != "" && !rep.Cleanup.Deleted {
		fmt.Fprintf(stderr, "watchsan check: could not delete namespace %s: %s\n  delete leftovers with: kubectl delete namespace -l %s=%s\n",
			rep.Namespace, rep.Cleanup.Error, ManagedByLabel, ManagedByValue)
	}
	if err != nil {
		switch {
		case errors.Is(err, context.Canceled):
			fmt.Fprintln(stderr, "watchsan check: interrupted")
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil:
			fmt.Fprintf(stderr, "watchsan check: timed out after %v (--timeout)\n", *timeout)
		default:
			fmt.Fprintf(stderr, "watchsan check: could not run: %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
		}
		if rep.Namespace != "" && rep.Cleanup.Deleted {
			fmt.Fprintf(stderr, "watchsan check: namespace %s deleted\n", rep.Namespace)
		}
		return ExitError
	}
	if *output == "json" {
		if err := rep.WriteJSON(stdout); err != nil {
			fmt.Fprintf(stderr, "watchsan check: writing the report: %v\n", err)
			return ExitError
		}
	} else {
		rep.WriteText(stdout)
	}
	if rep.Affected {
		return ExitAffected
	}
	return ExitClean
}

// restConfig loads the kubeconfig as kubectl does (explicit path, else $KUBECONFIG, else
// ~/.kube/config, else in-cluster), with server replacing its server when not empty.
func restConfig(path, kubeContext, server string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	overrides := &clientcmd.ConfigOverrides{CurrentContext: kubeContext}
	overrides.ClusterInfo.Server = server
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	return rc, nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
