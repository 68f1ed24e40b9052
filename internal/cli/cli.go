// Package cli is watchsan's command line: `watchsan [flags]` runs the proxy, `watchsan version`
// prints the version, `watchsan demo` runs the incident demo.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

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

// Version is set at build time (-ldflags "-X github.com/watchsan/watchsan/internal/cli.Version=...");
// otherwise the module's build info is used.
var Version = ""

// Main runs watchsan with args (without the program name) and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "version":
			fmt.Fprintln(stdout, "watchsan", version())
			return exitOK
		case "demo":
			return runDemo(args[1:], stdout, stderr)
		}
	}
	cfg, err := config.Load(args)
	if errors.Is(err, config.ErrHelp) {
		config.Usage(stdout)
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
	srv.Metrics().SetVersion(Version) // watchsan_build_info
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go newReloader(args, completed, srv.Reload, log).run(ctx) // SIGHUP, --config changes
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

func version() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		v := bi.Main.Version
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " " + s.Value[:12]
			}
		}
		return v
	}
	return "unknown"
}

// NewLogger builds the process logger: level debug|info|warn|error, format json|console.
func NewLogger(level, format string, w io.Writer) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	encCfg := logging.EncoderConfig()
	var enc zapcore.Encoder
	switch format {
	case "json":
		enc = zapcore.NewJSONEncoder(encCfg)
	case "console":
		encCfg.EncodeLevel = zapcore.CapitalLevelEncoder
		enc = zapcore.NewConsoleEncoder(encCfg)
	default:
		return nil, fmt.Errorf("--log-format %q: want json or console", format)
	}
	core := zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), lvl)
	return zap.New(core).Named("watchsan"), nil
}
