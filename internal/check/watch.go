package check

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/watchsan/watchsan/internal/stream"
)

// errWaitOver is what wireWatch.next returns when its deadline channel fired first.
var errWaitOver = errors.New("no event before the deadline")

// wireEvent is one event as it was on the wire (copied out of the reader's buffer).
type wireEvent struct {
	Type, Name, RV string
	RVInt          uint64
	RVIsInt        bool
	// Status is the message of an ERROR event's Status.
	Status string
}

// wireWatch is one raw watch of configmaps in a namespace, read by a goroutine of its own that
// ends when the stream ends or close is called.
type wireWatch struct {
	started time.Time
	events  chan wireEvent // closed after err is set
	err     error
	cancel  context.CancelFunc
	body    io.Closer
	once    sync.Once
	done    chan struct{}
}

// openWatch starts a JSON watch of configmaps in ns from rv, with labelSelector when it is
// not empty, asking for bookmarks when bookmarks is true and with timeoutSeconds when timeout
// is not zero. It returns once the response header arrived.
func (c *Checker) openWatch(ctx context.Context, o Options, ns, rv, labelSelector string, bookmarks bool, timeout time.Duration) (*wireWatch, error) {
	req := c.raw.Get().AbsPath("/api/v1/namespaces", ns, "configmaps").
		Param("watch", "true").Param("resourceVersion", rv).
		SetHeader("Accept", "application/json")
	if labelSelector != "" {
		req = req.Param("labelSelector", labelSelector)
	}
	if bookmarks {
		req = req.Param("allowWatchBookmarks", "true")
	}
	if timeout > 0 {
		req = req.Param("timeoutSeconds", strconv.Itoa(int(timeout/time.Second)))
	}
	wctx, cancel := context.WithCancel(ctx)
	// Only the wait for the response header is bounded by the step timeout.
	headerTimer := c.clock.AfterFunc(o.StepTimeout, cancel)
	body, err := req.Stream(wctx)
	if !headerTimer.Stop() {
		cancel()
		if err == nil {
			body.Close()
		}
		return nil, fmt.Errorf("watching configmaps in %s from %q: no answer within %v", ns, rv, o.StepTimeout)
	}
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watching configmaps in %s from %q: %w", ns, rv, err)
	}
	w := &wireWatch{started: c.clock.Now(), events: make(chan wireEvent), cancel: cancel, body: body, done: make(chan struct{})}
	c.log.Debug("watch started", zap.String("namespace", ns), zap.String("rv", rv), zap.Bool("bookmarks", bookmarks))
	go w.read(wctx, body)
	return w, nil
}

func (w *wireWatch) read(ctx context.Context, body io.Reader) {
	defer close(w.done)
	defer close(w.events)
	rd := stream.NewReader(stream.JSON, body, maxFrame)
	for {
		ev, err := rd.Next()
		if err != nil {
			w.err = err
			return
		}
		we := wireEvent{Type: ev.Type, Name: ev.Name, RV: ev.RV, RVInt: ev.RVInt, RVIsInt: ev.RVIsInt}
		if ev.Type == stream.Error {
			if st, err := stream.DecodeStatus(stream.JSON, ev); err == nil {
				we.Status = fmt.Sprintf("%d %s: %s", st.Code, st.Reason, st.Message)
			}
		}
		select {
		case w.events <- we:
		case <-ctx.Done():
			w.err = ctx.Err()
			return
		}
	}
}

// next returns the next event; io.EOF when the stream ended cleanly, errWaitOver when deadline
// fired first, ctx's error when it ended.
func (w *wireWatch) next(ctx context.Context, deadline <-chan time.Time) (wireEvent, error) {
	select {
	case ev, ok := <-w.events:
		if !ok {
			return wireEvent{}, w.err
		}
		return ev, nil
	case <-deadline:
		return wireEvent{}, errWaitOver
	case <-ctx.Done():
		return wireEvent{}, ctx.Err()
	}
}

// close ends the watch and waits for its reader. Safe to call more than once.
func (w *wireWatch) close() {
	w.once.Do(func() {
		w.cancel()
		w.body.Close()
		<-w.done
	})
}

func errorEventText(ev wireEvent) string {
	if ev.Status == "" {
		return "an ERROR event"
	}
	return ev.Status
}
