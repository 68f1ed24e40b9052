// Package cli is watchsan's command line, the Kubernetes way (spf13/cobra and pflag):
// `watchsan [flags]` runs the proxy; `watchsan version`, `watchsan help [command]` and
// `watchsan completion bash|zsh|fish|powershell` are subcommands, and `watchsan check` checks
// whether a cluster (or the path to it) needs watchsan.
//
// A subcommand plugs in as a constructor in commands (below): it returns a *cobra.Command whose
// RunE does the work and sets the exit code through the pointer it is given; its flags go on
// cmd.Flags() (a pflag.FlagSet, or a stdlib one through AddGoFlagSet), and help, completion and
// docs/flags.md (make docs) pick them up from there.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/watchsan/watchsan/internal/check"
	"github.com/watchsan/watchsan/internal/config"
	"github.com/watchsan/watchsan/internal/logging"
	"github.com/watchsan/watchsan/internal/server"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the proxy failed while running
	exitUsage = 2 // bad flags or configuration, a listen address that cannot be bound
)

// Main runs watchsan with args (without the program name) and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	code := exitOK
	root := NewCommand(stdout, stderr, &code)
	// The proxy's flags are parsed by config.Load (every problem at once, the --config file
	// under them); cobra parses them only to complete them in a shell.
	completing := len(args) > 0 && strings.HasPrefix(args[0], cobra.ShellCompRequestCmd)
	root.DisableFlagParsing = !completing
	root.SetArgs(args)
	if err := root.Execute(); err != nil { // a subcommand's usage: unknown command, bad flags
		fmt.Fprintf(stderr, "watchsan: %v\nRun 'watchsan --help' for usage.\n", err)
		return exitUsage
	}
	return code
}

// NewCommand returns the watchsan command tree; its RunE functions set *code.
func NewCommand(stdout, stderr io.Writer, code *int) *cobra.Command {
	root := &cobra.Command{
		Use:   "watchsan [flags]",
		Short: "a kube-apiserver proxy that makes watches trustworthy",
		Long: "watchsan is a reverse proxy in front of kube-apiservers: it never lets a watch client see a\n" +
			"resourceVersion go backwards, a replayed event or a lost one, and keeps watches alive across\n" +
			"apiserver failures. Everything else passes through untouched.",
		Example: "  # a sidecar: the kubeconfig's server and identity, served on 127.0.0.1:8001\n" +
			"  watchsan --kubeconfig ~/.kube/config\n\n" +
			"  # a frontend for clients with their own credentials\n" +
			"  watchsan --listen 0.0.0.0:6443 --tls-cert-file tls.crt --tls-private-key-file tls.key \\\n" +
			"    --upstream https://10.0.0.10:6443 --upstream-ca-file ca.crt --no-credentials",
		Args:                       cobra.ArbitraryArgs,
		SuggestionsMinimumDistance: 2,
		SilenceErrors:              true,
		SilenceUsage:               true,
		RunE: func(cmd *cobra.Command, args []string) error {
			*code = runProxy(cmd, args, stdout, stderr)
			return nil
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	def := config.Default()
	root.Flags().SortFlags = false // registration order, in groups
	root.Flags().AddFlagSet(config.FlagSet(&def))
	root.Flags().BoolP("help", "h", false, "show this help")
	root.Flags().Bool("version", false, "print the version and exit")
	for _, name := range []string{"help", "version"} {
		_ = root.Flags().SetAnnotation(name, config.GroupAnnotation, []string{"General"})
	}
	completeFlags(root)
	defaultHelp := root.HelpFunc()
	root.SetHelpFunc(func(cmd *cobra.Command, args []string) {
		if cmd == root {
			writeHelp(cmd.OutOrStdout(), root)
			return
		}
		defaultHelp(cmd, args)
	})
	root.AddCommand(commands(stdout, stderr, code)...)
	strictCompletion(root)
	return root
}

// completionShells are the shells cobra's completion command writes a script for.
var completionShells = []string{"bash", "zsh", "fish", "powershell"}

// strictCompletion makes `watchsan completion SHELL` refuse a shell it has no script for
// (tcsh) and a missing shell, exit code 2: cobra's own command has no Run, so cobra answered
// both with its help and exit code 0, as if a script had been written.
func strictCompletion(root *cobra.Command) {
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() != "completion" {
			continue
		}
		want := strings.Join(completionShells, ", ")
		c.Args = func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("completion %q: not a shell watchsan writes a script for; want one of %s", args[0], want)
			}
			return nil
		}
		c.RunE = func(*cobra.Command, []string) error {
			return fmt.Errorf("completion: name the shell, one of %s (e.g. `source <(watchsan completion bash)`)", want)
		}
	}
}

// commands are watchsan's subcommands besides help and completion (cobra's own).
func commands(stdout, stderr io.Writer, code *int) []*cobra.Command {
	checkCmd := &cobra.Command{
		Use:   "check [flags]",
		Short: "Check whether a cluster, or the path to it, needs watchsan (exit 1 when it does)",
		// package check parses its own flags, reporting every problem at once.
		DisableFlagParsing: true,
		Run:                func(_ *cobra.Command, args []string) { *code = runCheck(args, stdout, stderr) },
	}
	// `watchsan help check` shows what `watchsan check --help` does, not cobra's stub of a
	// command whose flags it never sees.
	checkCmd.SetHelpFunc(func(*cobra.Command, []string) { check.WriteHelp(stdout) })
	return []*cobra.Command{
		{
			Use:   "version",
			Short: "Print the version",
			Args:  cobra.NoArgs,
			Run:   func(*cobra.Command, []string) { fmt.Fprintln(stdout, "watchsan", version()) },
		},
		checkCmd,
		{
			Use:   "flags",
			Short: "Print every flag with its full description",
			Args:  cobra.NoArgs,
			Run: func(cmd *cobra.Command, _ []string) {
				fmt.Fprintln(stdout, "watchsan's flags, in full (also in docs/flags.md):")
				writeFlagGroups(stdout, cmd.Root().Flags(), false)
			},
		},
		{
			Use:                "demo",
			Short:              "The demo is the command watchsan-demo (make demo)",
			Hidden:             true,
			DisableFlagParsing: true,
			Run: func(*cobra.Command, []string) {
				fmt.Fprintln(stderr, "watchsan: the demo is a command of its own, so that watchsan does not link it: run `make demo` or `go run ./cmd/watchsan-demo`")
				*code = exitUsage
			},
		},
	}
}

// completeFlags tells shell completion what the proxy's enumerated and file flags take.
func completeFlags(root *cobra.Command) {
	for name, values := range map[string][]string{
		"log-level":          {"debug", "info", "warn", "error"},
		"log-format":         {"json", "console"},
		"fix-mode":           {"repair", "observe"},
		"upstream-discovery": {config.DiscoveryEndpoints},
	} {
		_ = root.RegisterFlagCompletionFunc(name, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp))
	}
	for name, exts := range map[string][]string{
		"config": {"yaml", "yml"}, "kubeconfig": nil, "tls-cert-file": nil, "tls-private-key-file": nil, "upstream-ca-file": nil,
	} {
		_ = root.MarkFlagFilename(name, exts...)
	}
}

// writeHelp writes the root command's help: kubectl's layout, flags in their groups, each
// with its one-line description (config.ShortUsage); `watchsan flags` and docs/flags.md have
// them in full.
func writeHelp(w io.Writer, root *cobra.Command) {
	fmt.Fprintf(w, "%s\n\nUsage:\n  watchsan [flags]\n  watchsan [command]\n\nExamples:\n%s\n\nCommands:\n", root.Long, root.Example)
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() || c.Name() == "help" {
			fmt.Fprintf(w, "  %-11s %s\n", c.Name(), c.Short)
		}
	}
	writeFlagGroups(w, root.Flags(), true)
	fmt.Fprint(w, "\nEvery flag in full: `watchsan flags`, or docs/flags.md. Every flag can also be set in\n"+
		"the --config file, under its name; flags win.\n"+
		"Use \"watchsan [command] --help\" for more about a command.\n")
}

// writeFlagGroups writes fs's flags in their groups, each with its one-line description
// (short) or in full.
func writeFlagGroups(w io.Writer, flags *pflag.FlagSet, short bool) {
	for _, g := range config.Groups(flags) {
		fs := pflag.NewFlagSet(g.Title, pflag.ContinueOnError)
		for _, f := range g.Flags {
			if short {
				c := *f
				c.Usage = config.ShortUsage(f)
				f = &c
			}
			fs.AddFlag(f)
		}
		fmt.Fprintf(w, "\n%s flags:\n%s", g.Title, fs.FlagUsagesWrapped(100))
	}
}

// runProxy is `watchsan [flags]`: it loads the configuration and runs the proxy until SIGTERM.
func runProxy(cmd *cobra.Command, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(stderr, "watchsan: unknown command %q", args[0])
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			fmt.Fprintf(stderr, "; did you mean %q?", s[0])
		}
		fmt.Fprintln(stderr, "\nRun 'watchsan --help' for usage.")
		return exitUsage
	}
	end := len(args)
	if i := slices.Index(args, "--"); i >= 0 {
		end = i
	}
	if slices.Contains(args[:end], "--version") {
		fmt.Fprintln(stdout, "watchsan", version())
		return exitOK
	}
	cfg, err := config.Load(args)
	if errors.Is(err, config.ErrHelp) {
		writeHelp(stdout, cmd)
		return exitOK
	}
	var completed *config.Completed
	if err == nil {
		completed, err = cfg.Complete()
	} else if verr := cfg.Validate(); verr != nil {
		err = errors.Join(err, verr)
	}
	if err != nil {
		reportConfigErrors(stderr, err)
		return exitUsage
	}
	log, err := NewLogger(completed.LogLevel, completed.LogFormat, stderr)
	if err != nil {
		reportConfigErrors(stderr, err)
		return exitUsage
	}
	defer func() { _ = log.Sync() }()
	logging.RouteKlog(log) // client-go's own lines (watch errors, throttling) as watchsan's
	for _, w := range completed.Warnings {
		log.Warn(w)
	}
	srv, err := server.New(completed, log)
	if err != nil { // the kubeconfig's TLS or credential settings: configuration too
		reportStartError(stderr, err)
		return exitUsage
	}
	b := currentBuild()
	srv.Metrics().SetVersion(b.Version, b.Revision) // watchsan_build_info
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	stopped := make(chan struct{})
	defer close(stopped)
	go newReloader(args, completed, srv.Reload, log).run(ctx, stopped) // SIGHUP, --config changes
	if err := srv.Run(ctx); err != nil {
		var le *server.ListenError
		if errors.As(err, &le) {
			reportStartError(stderr, le)
			return exitUsage
		}
		log.Error("stopped with an error", zap.Error(err))
		return exitError
	}
	return exitOK
}

// reportStartError reports a configuration problem found only when starting (an address in
// use, kubeconfig credentials that do not load) as one line, as an operator reads it.
func reportStartError(w io.Writer, err error) {
	fmt.Fprintf(w, "watchsan: cannot start: %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
}

func reportConfigErrors(w io.Writer, err error) {
	fmt.Fprintln(w, "watchsan: invalid configuration:")
	for _, line := range strings.Split(err.Error(), "\n") {
		fmt.Fprintln(w, "  -", line)
	}
	fmt.Fprintln(w, "Run 'watchsan --help' for the flags.")
}

// NewLogger builds the process logger: level debug|info|warn|error, format json|console, or
// "" for console when w is a terminal and json otherwise.
func NewLogger(level, format string, w io.Writer) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	encCfg := logging.EncoderConfig()
	var enc zapcore.Encoder
	switch logging.ResolveFormat(format, w) {
	case "json":
		enc = zapcore.NewJSONEncoder(encCfg)
	case "console":
		encCfg.EncodeLevel = zapcore.CapitalLevelEncoder
		enc = zapcore.NewConsoleEncoder(encCfg)
	default:
		return nil, fmt.Errorf("--log-format %q: want console or json", format)
	}
	core := zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), lvl)
	return zap.New(core).Named("watchsan"), nil
}
