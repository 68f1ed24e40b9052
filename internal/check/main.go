package check

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/watchsan/watchsan/internal/config"
	"github.com/watchsan/watchsan/internal/reqinfo"
)

// Exit codes of `watchsan check`.
const (
	ExitClean    = 0 // no problem found
	ExitAffected = 1 // a problem found
	ExitError    = 2 // bad flags or kubeconfig, or the check could not run to its end
)

// checkFlags are `watchsan check`'s flags' values.
type checkFlags struct {
	kubeconfig, context, server, output, prefix *string
	config                                      *string
	bookmarkWait, idleWait, timeout             *time.Duration
	objects                                     *int
	verbose                                     *bool
}

func newFlags() (*pflag.FlagSet, checkFlags) {
	fs := pflag.NewFlagSet("watchsan check", pflag.ContinueOnError)
	fs.SortFlags = false
	var f checkFlags
	f.kubeconfig = fs.String("kubeconfig", "", "kubeconfig file (default $KUBECONFIG, ~/.kube/config, in-cluster)")
	f.context = fs.String("context", "", "kubeconfig context (default: its current one)")
	f.server = fs.String("server", "", "talk to this URL instead of the kubeconfig's server, with the kubeconfig's credentials (a gateway or proxy in front of the apiserver)")
	f.output = fs.StringP("output", "o", "text", "report format: text or json")
	f.bookmarkWait = fs.Duration("bookmark-wait", 70*time.Second, fmt.Sprintf("how long a quiet watch waits for bookmarks (apiservers send one about every 60s, and one 2s before the watch's deadline); 0 skips, else at least %v", MinBookmarkWait))
	f.idleWait = fs.Duration("idle-wait", 70*time.Second, "how long an idle watch is kept open to see whether the path cuts it (runs alongside the bookmark wait); 0 skips")
	f.timeout = fs.Duration("timeout", 0, "bound the whole check (default: the longer wait plus 2m)")
	f.prefix = fs.String("namespace-prefix", defaultPrefix, "the temporary namespace's name prefix (5 random characters follow)")
	f.objects = fs.Int("objects", defaultObjects, "how many objects to create between a and its delete (1-100)")
	f.verbose = fs.Bool("verbose", false, "log what the check does to stderr")
	f.config = fs.String("config", "", "also check a watchsan --config file's resources (fix-exempt-resource, share-exclude-resource) against the cluster's discovery: one the cluster does not serve is an error (exit 2)")
	return fs, f
}

// validate reports every flag value the check cannot run with, each naming its flag (the
// limits are Options.Validate's, which names none).
func (f checkFlags) validate() []error {
	var errs []error
	if *f.output != "text" && *f.output != "json" {
		errs = append(errs, fmt.Errorf("--output %q: want text or json", *f.output))
	}
	if *f.objects < 1 || *f.objects > 100 {
		errs = append(errs, fmt.Errorf("--objects %d: want 1 to 100", *f.objects))
	}
	if w := *f.bookmarkWait; w < 0 || (w > 0 && w < MinBookmarkWait) {
		errs = append(errs, fmt.Errorf("--bookmark-wait %v: want 0 (skip) or at least %v", w, MinBookmarkWait))
	}
	if *f.idleWait < 0 {
		errs = append(errs, fmt.Errorf("--idle-wait %v: want 0 (skip) or positive", *f.idleWait))
	}
	if *f.timeout < 0 {
		errs = append(errs, fmt.Errorf("--timeout %v: want 0 (default) or positive", *f.timeout))
	}
	return errs
}

// configResource is a resource a watchsan --config file names.
type configResource struct {
	flag, value string // as the file gives it
	gr          string // reqinfo.ParseGroupResource's form
}

// loadConfigResources reads a watchsan --config file as watchsan does and returns the
// resources it names, each refused offline (reqinfo.CheckBuiltin) as watchsan would refuse it.
func loadConfigResources(path string) ([]configResource, []error) {
	cfg, err := config.Load([]string{"--config", path})
	if err != nil {
		return nil, []error{err}
	}
	var out []configResource
	var errs []error
	for _, l := range []struct {
		flag   string
		values []string
	}{{"fix-exempt-resource", cfg.FixExemptResources}, {"share-exclude-resource", cfg.ShareExcludeResources}} {
		for _, v := range l.values {
			gr, err := reqinfo.ParseGroupResource(v)
			if err == nil {
				err = reqinfo.CheckBuiltin(gr)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("--config %s: %s %q: %w", path, l.flag, v, err))
				continue
			}
			out = append(out, configResource{flag: l.flag, value: v, gr: gr})
		}
	}
	return out, errs
}

// checkConfigResources reports each of rs the cluster's discovery does not serve; ok is false
// (and code the exit code) when there is one or discovery could not be read.
func checkConfigResources(ctx context.Context, client rest.Interface, path string, rs []configResource, stderr io.Writer) (code int, ok bool) {
	grs := make([]string, len(rs))
	for i, r := range rs {
		grs[i] = r.gr
	}
	unknown, err := UnknownResources(ctx, client, grs)
	if err != nil {
		fmt.Fprintf(stderr, "watchsan check: reading the cluster's discovery for --config %s: %v\n", path, err)
		return ExitError, false
	}
	if len(unknown) == 0 {
		return ExitClean, true
	}
	fmt.Fprintf(stderr, "watchsan check: --config %s names resources this cluster does not serve (watchsan would match no watch with them):\n", path)
	for _, r := range rs {
		if slices.Contains(unknown, r.gr) {
			fmt.Fprintf(stderr, "  - %s %q\n", r.flag, r.value)
		}
	}
	return ExitError, false
}

// WriteHelp writes `watchsan check`'s help to w, as --help does (`watchsan help check`).
func WriteHelp(w io.Writer) {
	fs, _ := newFlags()
	writeHelp(w, fs)
}

// helpWidth is the column the help is wrapped at (as the main command's flags are).
const helpWidth = 100

func writeHelp(w io.Writer, fs *pflag.FlagSet) {
	about := fmt.Sprintf("Checks whether a cluster, or the path to it (a gateway, a proxy), needs watchsan: in a "+
		"temporary namespace it reproduces kubernetes#58545 (create a, create others, delete a, "+
		"while watching) and reports whether the DELETED event's resourceVersion goes backwards "+
		"and a re-watch replays events, whether bookmarks arrive, whether an idle watch is cut, "+
		"and whether the apiserver's version is in the affected ranges (%s).", AffectedRangesText)
	exits := fmt.Sprintf("Exit codes: 0 no problem found, 1 a problem found, 2 bad flags or kubeconfig, or the "+
		"check could not run to its end. The namespace (label %s=%s) is deleted in every case.", ManagedByLabel, ManagedByValue)
	fmt.Fprintf(w, "Usage:\n  watchsan check [flags]\n\n%s\n\n%s\n\nFlags:\n%s", wrap(about, helpWidth), wrap(exits, helpWidth), fs.FlagUsagesWrapped(helpWidth))
}

// wrap breaks s into lines of at most width columns, between words.
func wrap(s string, width int) string {
	var b strings.Builder
	col := 0
	for _, word := range strings.Fields(s) {
		switch {
		case col == 0:
		case col+1+len(word) > width:
			b.WriteByte('\n')
			col = 0
		default:
			b.WriteByte(' ')
			col++
		}
		b.WriteString(word)
		col += len(word)
	}
	return b.String()
}

// Main runs `watchsan check` with args (after "check") and returns its exit code. The report
// goes to stdout, progress and errors to stderr. SIGINT and SIGTERM end the check; the
// namespace it created is deleted first.
func Main(args []string, stdout, stderr io.Writer) int {
	fs, f := newFlags()
	errs := config.ParseFlags(fs, args)
	if len(errs) == 1 && errors.Is(errs[0], config.ErrHelp) {
		writeHelp(stdout, fs)
		return ExitClean
	}
	errs = append(errs, f.validate()...)
	var fileResources []configResource
	if *f.config != "" {
		var ferrs []error
		fileResources, ferrs = loadConfigResources(*f.config)
		errs = append(errs, ferrs...)
	}
	if len(errs) > 0 {
		fmt.Fprintln(stderr, "watchsan check: invalid flags:")
		for _, err := range errs {
			fmt.Fprintln(stderr, "  -", err)
		}
		fmt.Fprintln(stderr, "Run 'watchsan check --help' for the flags.")
		return ExitError
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "watchsan check: "+format+"\n", a...)
		return ExitError
	}
	o := Options{NamespacePrefix: *f.prefix, Objects: *f.objects, BookmarkWait: *f.bookmarkWait, IdleWait: *f.idleWait}
	if *f.timeout == 0 {
		*f.timeout = max(*f.bookmarkWait, *f.idleWait) + 2*time.Minute
	}

	rc, err := restConfig(*f.kubeconfig, *f.context, *f.server)
	if err != nil {
		return usage("%v", err)
	}
	client, err := NewClient(rc)
	if err != nil {
		return usage("kubeconfig: %v", err)
	}

	log := zap.NewNop()
	if *f.verbose {
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
	ctx, cancel := context.WithTimeout(ctx, *f.timeout)
	defer cancel()

	if len(fileResources) > 0 {
		if code, ok := checkConfigResources(ctx, client, *f.config, fileResources, stderr); !ok {
			return code
		}
	}

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
			fmt.Fprintf(stderr, "watchsan check: timed out after %v (--timeout)\n", *f.timeout)
		default:
			fmt.Fprintf(stderr, "watchsan check: could not run: %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
		}
		if rep.Namespace != "" && rep.Cleanup.Deleted {
			fmt.Fprintf(stderr, "watchsan check: namespace %s deleted\n", rep.Namespace)
		}
		return ExitError
	}
	if *f.output == "json" {
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
	rc, err := config.LoadKubeconfig(path, kubeContext, server)
	var none *config.NoKubeconfigError
	if errors.As(err, &none) {
		return nil, fmt.Errorf("no kubeconfig: pass --kubeconfig FILE (and --server URL to check a path other than its server); %w", err)
	}
	return rc, err
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
