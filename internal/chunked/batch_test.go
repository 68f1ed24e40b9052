package chunked

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/watchsan/watchsan/internal/budget"
)

// countingWriter is a ResponseWriter that counts its Writes.
type countingWriter struct {
	*httptest.ResponseRecorder
	writes int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes++
	return w.ResponseRecorder.Write(p)
}

// A batch holds frames until it is flushed, then hands them to the ResponseWriter in one
// Write, its buffer charged to the budget account meanwhile; an account the budget refuses
// gets every frame written as it comes, unbatched, and the bytes are the same.
func TestBatchChargesItsBuffer(t *testing.T) {
	bud := budget.New(1 << 20)
	for _, refused := range []bool{false, true} {
		acc := bud.Open()
		var hog *budget.Account
		if refused {
			hog = bud.OpenCommon()
			hog.Force(budget.Frames, 1<<20)
		}
		w := &countingWriter{ResponseRecorder: httptest.NewRecorder()}
		b := NewBatch(w, http.NewResponseController(w), time.Minute, acc)
		for _, f := range []string{"a\n", "bb\n", "ccc\n"} {
			if _, err := b.Write([]byte(f)); err != nil {
				t.Fatal(err)
			}
		}
		switch held := acc.Held(); {
		case !refused && held != BatchSize:
			t.Errorf("a batch holding frames holds %d of the budget, want %d", held, BatchSize)
		case refused && held != 0:
			t.Errorf("refused, the writer holds %d of the budget", held)
		}
		if err := b.Flush(); err != nil {
			t.Fatal(err)
		}
		if held := acc.Held(); held != 0 {
			t.Errorf("refused=%v: %d of the budget held after the flush", refused, held)
		}
		wantWrites := 1
		if refused {
			wantWrites = 3
		}
		if w.writes != wantWrites || w.Body.String() != "a\nbb\nccc\n" || !w.Flushed {
			t.Errorf("refused=%v: %d writes of %q (flushed %v), want %d of the three frames", refused, w.writes, w.Body, w.Flushed, wantWrites)
		}
		acc.Close()
		if hog != nil {
			hog.Close()
		}
	}
}

// Once it owns the connection, a batch is one chunk per flush; Finish ends the body and
// releases the connection.
func TestBatchOwnsTheConnection(t *testing.T) {
	var set Set
	addr, got := serve(t, Options{WriteTimeout: time.Minute, Set: &set}, false)
	c := dial(t, addr, false, false)
	tk := next(t, got)
	w := httptest.NewRecorder()
	b := NewBatch(w, http.NewResponseController(w), time.Minute, nil)
	b.Own(tk.c)
	if b.Conn() != tk.c {
		t.Fatal("Conn is not the owned connection")
	}
	for _, f := range []string{"a\n", "bb\n", "ccc\n"} {
		_, _ = b.Write([]byte(f))
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", BatchSize) // too big for a batch: a chunk of its own
	_, _ = b.Write([]byte(big))
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	b.Finish()
	if b.Err() != nil || b.Slow() {
		t.Errorf("Err %v, Slow %v", b.Err(), b.Slow())
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body = nil // read the chunks raw
	raw, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	want := "9\r\na\nbb\nccc\n\r\n10000\r\n" + big + "\r\n0\r\n\r\n"
	if string(raw) != want {
		t.Errorf("the chunks are %.60q..., want %.60q...", raw, want)
	}
	if n := <-tk.told; n != int64(9+len(big)) {
		t.Errorf("told %d bytes", n)
	}
	if w.Body.Len() != 0 {
		t.Errorf("%d bytes went to the ResponseWriter after Own", w.Body.Len())
	}
	if n := set.Len(0); n != 0 {
		t.Errorf("%d in the set after Finish", n)
	}
}
