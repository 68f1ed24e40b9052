package check

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// Progress tells a person what the check is doing while it waits: on a terminal one line,
// rewritten in place; otherwise (a log, a pipe) plain lines, a waiting one at most every
// plainEvery. A nil *Progress says nothing.
type Progress struct {
	w   io.Writer
	tty bool

	mu       sync.Mutex
	open     bool      // a TTY line is on screen without its newline
	lastWait time.Time // when the last plain waiting line was written
}

// plainEvery spaces the waiting lines written to a non-terminal.
const plainEvery = 10 * time.Second

// NewProgress writes progress to w (stderr, usually); tty says w is a terminal.
func NewProgress(w io.Writer, tty bool) *Progress {
	return &Progress{w: w, tty: tty}
}

// Step says that a new step started.
func (p *Progress) Step(format string, args ...any) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.line(fmt.Sprintf(format, args...))
	p.lastWait = time.Time{}
}

// Waiting says how long a wait has run of its bound; now is the checker's clock.
func (p *Progress) Waiting(now time.Time, what string, elapsed, bound time.Duration) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.tty && !p.lastWait.IsZero() && now.Sub(p.lastWait) < plainEvery {
		return
	}
	p.lastWait = now
	p.line(fmt.Sprintf("%s: %ds of %ds", what, int(elapsed.Seconds()), int(bound.Seconds())))
}

// Done ends the progress output, so what follows starts on a line of its own.
func (p *Progress) Done() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open {
		fmt.Fprint(p.w, "\r\033[K")
		p.open = false
	}
}

func (p *Progress) line(s string) {
	s = "watchsan check: " + s
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K"+s) // carriage return, erase the line
		p.open = true
		return
	}
	fmt.Fprintln(p.w, s)
}
