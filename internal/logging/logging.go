// Package logging is the one home of how watchsan logs: the zap logger's encoding (durations
// with units) and the route that sends client-go's klog output through it.
package logging

import (
	"io"
	"os"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"
	"k8s.io/klog/v2"
)

// ResolveFormat is the log format to write to w: format when given ("json" or "console"); for
// "" (--log-format's default), console when w is a terminal, where a person reads it, and json
// otherwise (a file, a pipe, a container's log), where a program does.
func ResolveFormat(format string, w io.Writer) string {
	if format != "" {
		return format
	}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return "console"
	}
	return "json"
}

// EncoderConfig is the encoder configuration of every watchsan logger: ISO 8601 times and
// durations as Go prints them ("1.5s", "250ms"), never as bare floats whose unit a reader has
// to guess.
func EncoderConfig() zapcore.EncoderConfig {
	c := zap.NewProductionEncoderConfig()
	c.EncodeTime = zapcore.ISO8601TimeEncoder
	c.EncodeDuration = zapcore.StringDurationEncoder
	return c
}

// Logr is log, named "client-go", as a logr.Logger: what client-go logs (through klog, or the
// logger in a context given to a reflector) comes out as watchsan's own lines. logr's V(0) is
// Info, V(1) Debug; higher verbosities are below zap's Debug and never written.
func Logr(log *zap.Logger) logr.Logger {
	return zapr.NewLogger(log.Named("client-go"))
}

// RouteKlog sends klog's global output (client-go's, when it logs without a context: watch
// errors, throttling, deprecation warnings) through log instead of klog's own stderr format.
// klog's verbosity (-v, 0 by default) still filters before log sees anything.
func RouteKlog(log *zap.Logger) {
	klog.SetLogger(Logr(log))
}
