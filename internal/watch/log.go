package watch

import (
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// watchLog is one watch's logger: the Handler's with the watch's fields (its client's address
// and requestID), made only when a line is about to be written, which most watches never do.
// A logger made at once for every watch (zap's WithLazy: a Logger clone and a lazy core) was
// about 200 bytes of every idle watch; this is the base logger and the two strings, which the
// request holds anyway. Safe for concurrent use (the watchdog's timer and a move's goroutine
// log too).
type watchLog struct {
	base              *zap.Logger
	remote, requestID string
	l                 atomic.Pointer[zap.Logger] // base with the fields, once made
}

func newWatchLog(base *zap.Logger, remote, requestID string) *watchLog {
	return &watchLog{base: base, remote: remote, requestID: requestID}
}

// Check is zap's Logger.Check: nil when lvl is not logged (the base's level, which may change
// at run time, decides), without making the watch's logger.
func (w *watchLog) Check(lvl zapcore.Level, msg string) *zapcore.CheckedEntry {
	if !w.base.Core().Enabled(lvl) {
		return nil
	}
	l := w.l.Load()
	if l == nil {
		l = w.base.With(zap.String("remote", w.remote), zap.String("requestID", w.requestID))
		if !w.l.CompareAndSwap(nil, l) {
			l = w.l.Load()
		}
	}
	return l.Check(lvl, msg)
}

func (w *watchLog) log(lvl zapcore.Level, msg string, fields []zap.Field) {
	if ce := w.Check(lvl, msg); ce != nil {
		ce.Write(fields...)
	}
}

func (w *watchLog) Debug(msg string, fields ...zap.Field) { w.log(zapcore.DebugLevel, msg, fields) }
func (w *watchLog) Info(msg string, fields ...zap.Field)  { w.log(zapcore.InfoLevel, msg, fields) }
func (w *watchLog) Warn(msg string, fields ...zap.Field)  { w.log(zapcore.WarnLevel, msg, fields) }
