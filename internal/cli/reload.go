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
// changes (issue 9): the flags and the file are loaded, validated and completed as at the
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

// run reloads until ctx ends.
func (r *reloader) run(ctx context.Context) {
	defer signal.Stop(r.hup)
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
