package stream

import (
	"fmt"
	"io"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A Writer writes watch events in one format to a client's response. Each event goes out in a
// single Write call, so a failed write never leaves half a frame behind for a later one to
// follow. The Writer does not flush; the caller flushes after each event (or burst).
//
// A Writer is not safe for concurrent use.
type Writer struct {
	format Format
	dst    io.Writer
	// buf holds a rewritten frame; reused, so steady-state writes do not allocate.
	buf []byte
}

// NewWriter returns a Writer of f-formatted events to w.
func NewWriter(f Format, w io.Writer) *Writer {
	return &Writer{format: f, dst: w}
}

// Format returns the format the Writer writes.
func (w *Writer) Format() Format { return w.format }

// Write writes ev.Raw unchanged, byte for byte. The one exception is a JSON event whose
// newline had not arrived yet when it was read (the Reader never waits for it): the newline
// is written after it, as the apiserver wrote it.
func (w *Writer) Write(ev *Event) error {
	if len(ev.Raw) == 0 {
		return fmt.Errorf("%w: event has no raw bytes", ErrMalformed)
	}
	if w.format == JSON && ev.Raw[len(ev.Raw)-1] != '\n' {
		w.buf = append(append(w.buf[:0], ev.Raw...), '\n')
		return w.write(w.buf)
	}
	return w.write(ev.Raw)
}

// WriteWithRV writes ev with its object's metadata.resourceVersion replaced by rv, and every
// other byte as it was (for protobuf, every length that encloses the resourceVersion is
// re-encoded). ev must come from a Reader of the Writer's format; an event whose object has
// no resourceVersion field cannot be rewritten (an error wrapping ErrMalformed), nor can a
// JSON event or a CBOR text string take an rv that is not valid UTF-8.
func (w *Writer) WriteWithRV(ev *Event, rv string) error {
	loc := &ev.rv
	if loc.format == 0 || loc.end > len(ev.Raw) || loc.start > loc.end {
		return fmt.Errorf("%w: no resourceVersion to rewrite", ErrMalformed)
	}
	if loc.format != w.format {
		return fmt.Errorf("stream: cannot rewrite a %s event with a %s writer", loc.format, w.format)
	}
	var err error
	b := w.buf[:0]
	switch w.format {
	case JSON:
		if !utf8.ValidString(rv) {
			return fmt.Errorf("%w: resourceVersion %q is not valid UTF-8 for a JSON string", ErrMalformed, rv)
		}
		b = append(b, ev.Raw[:loc.start]...)
		b = appendJSONString(b, rv)
		b = append(b, ev.Raw[loc.end:]...)
		if b[len(b)-1] != '\n' {
			b = append(b, '\n')
		}
	case Protobuf:
		b, err = rewriteProtobuf(b, ev.Raw, loc, rv)
	case CBOR:
		b, err = rewriteCBOR(b, ev.Raw, loc, rv)
	}
	if err != nil {
		return err
	}
	w.buf = b
	return w.write(b)
}

// WriteStatus writes a well-formed ERROR event carrying st, the way the apiserver ends a watch
// it cannot continue (a 410 Expired makes a client relist). st needs no TypeMeta.
func (w *Writer) WriteStatus(st *metav1.Status) error {
	b, err := EncodeEvent(w.format, Error, st)
	if err != nil {
		return err
	}
	return w.write(b)
}

func (w *Writer) write(b []byte) error {
	if _, err := w.dst.Write(b); err != nil {
		return fmt.Errorf("stream: writing watch event: %w", err)
	}
	return nil
}
