package cli

import (
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/watchsan/watchsan/internal/config"
)

// reloader applies the configuration again, live, on SIGHUP and when the --config file
// changes: the flags and the file are loaded, validated and completed as at the
// start, and the server applies what can change live (the upstream set). An invalid new
// configuration is logged and ignored: the old one stays.
type reloader struct {
	args   []string
	file   string
	every  time.Duration
	apply  func(*config.Completed) error
	log    *zap.Logger
	hup    chan os.Signal
	digest [32]byte
}

// newReloader starts catching SIGHUP at once (its default action ends the process).
func newReloader(args []string, c *config.Completed, apply func(*config.Completed) error, log *zap.Logger) *reloader {
	r := &reloader{args: args, file: c.ConfigFile, every: c.ConfigCheckInterval, apply: apply, log: log.Named("reload"),
		hup: make(chan os.Signal, 1)}
	signal.Notify(r.hup, syscall.SIGHUP)
	r.digest, _ = fileDigest(r.file)
	return r
}

// run reloads until ctx ends, then ignores SIGHUP, saying so, until stopped is closed (the
// server has shut down): its default action would end the process at once, cutting the open
// watches that shutdown is ending cleanly (exit 129 mid-stream).
func (r *reloader) run(ctx context.Context, stopped <-chan struct{}) {
	defer r.ignoreUntil(stopped)
	var tick <-chan time.Time
	if r.file != "" && r.every > 0 {
		t := time.NewTicker(r.every)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.hup:
			if ctx.Err() != nil { // both ready: shutdown has begun
				r.log.Info("SIGHUP during shutdown: ignored; shutdown goes on")
				return
			}
			r.digest, _ = fileDigest(r.file)
			r.reload("SIGHUP")
		case <-tick:
			d, err := fileDigest(r.file)
			if err != nil || d == r.digest {
				continue // a file being replaced may be missing for a moment
			}
			r.digest = d
			r.reload("the --config file changed")
		}
	}
}

// ignoreUntil logs and ignores every SIGHUP until stopped is closed, and every one after
// (the process is about to exit).
func (r *reloader) ignoreUntil(stopped <-chan struct{}) {
	for {
		select {
		case <-r.hup:
			r.log.Info("SIGHUP during shutdown: ignored; shutdown goes on")
		case <-stopped:
			signal.Ignore(syscall.SIGHUP)
			signal.Stop(r.hup)
			return
		}
	}
}

func (r *reloader) reload(why string) {
	cfg, err := config.Load(r.args)
	var c *config.Completed
	if err == nil {
		c, err = cfg.Complete()
	} else if verr := cfg.Validate(); verr != nil {
		err = errors.Join(err, verr)
	}
	if err != nil {
		r.log.Error("invalid configuration; the running one stays", zap.String("why", why), zap.Error(err))
		return
	}
	r.log.Info("reloading the configuration", zap.String("why", why))
	if err := r.apply(c); err != nil {
		r.log.Error("the configuration could not be applied; the running one stays", zap.Error(err))
	}
}

func fileDigest(path string) ([32]byte, error) {
	if path == "" {
		return [32]byte{}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return [32]byte{}, err
	}
	return sha256.Sum256(data), nil
}
