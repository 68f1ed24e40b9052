package stream

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"k8s.io/apimachinery/pkg/watch"
)

// frameEnds returns the offsets in stream where each frame ends (for JSON, where the value
// ends, newline excluded).
func frameEnds(t *testing.T, f Format, stream []byte) []int {
	evs, err := readAll(f, bytes.NewReader(stream), 0)
	if err != nil {
		t.Fatal(err)
	}
	var ends []int
	off := 0
	for _, ev := range evs {
		off += len(ev.Raw)
		end := off
		if f == JSON && bytes.HasSuffix(ev.Raw, []byte("\n")) {
			end--
		}
		ends = append(ends, end)
	}
	return ends
}

// TestReaderTruncation cuts a stream at every byte: the events wholly before the cut are read,
// then io.EOF when the cut is between frames and io.ErrUnexpectedEOF when it is inside one.
func TestReaderTruncation(t *testing.T) {
	evs := []testEvent{
		{watch.Added, configMap("default", "a", "u1", "10")},
		{watch.Bookmark, bookmark("10", true)},
		{watch.Deleted, configMap("default", "a", "u1", "11")},
	}
	for _, f := range formats {
		stream := apiStream(t, f, evs, false)
		ends := frameEnds(t, f, stream)
		for cut := 0; cut <= len(stream); cut++ {
			whole, clean := 0, cut == 0
			for _, e := range ends {
				if e <= cut {
					whole++
				}
				// A JSON value's newline is not part of the frame's need.
				if cut == e || (f == JSON && cut == e+1) {
					clean = true
				}
			}
			rd := NewReader(f, iotest.HalfReader(bytes.NewReader(stream[:cut])), 0)
			n := 0
			var err error
			for {
				if _, err = rd.Next(); err != nil {
					break
				}
				n++
			}
			wantErr := io.ErrUnexpectedEOF
			if clean {
				wantErr = io.EOF
			}
			if n != whole || err != wantErr {
				t.Fatalf("%s cut at %d/%d: %d events then %v; want %d then %v", f, cut, len(stream), n, err, whole, wantErr)
			}
			// Errors are final.
			if _, again := rd.Next(); again != err {
				t.Fatalf("%s cut at %d: error not sticky: %v then %v", f, cut, err, again)
			}
		}
	}
}

type errAfter struct {
	data []byte
	err  error
}

func (e *errAfter) Read(p []byte) (int, error) {
	if len(e.data) == 0 {
		return 0, e.err
	}
	n := copy(p, e.data)
	e.data = e.data[n:]
	return n, nil
}

func TestReaderReadErrorsWrapped(t *testing.T) {
	boom := errors.New("connection reset by peer")
	for _, f := range formats {
		stream := apiStream(t, f, []testEvent{{watch.Added, configMap("ns", "a", "u", "5")}}, false)
		for _, cut := range []int{len(stream), len(stream) / 2} {
			rd := NewReader(f, &errAfter{data: stream[:cut], err: boom}, 0)
			ev, err := rd.Next()
			if cut == len(stream) {
				if err != nil || ev.Name != "a" {
					t.Fatalf("%s: first event: %v", f, err)
				}
				_, err = rd.Next()
			}
			if !errors.Is(err, boom) {
				t.Fatalf("%s cut %d: got %v, want it to wrap %v", f, cut, err, boom)
			}
		}
		// An unexpected EOF from below (a chunked body cut off) stays recognisable.
		rd := NewReader(f, &errAfter{data: stream[:3], err: io.ErrUnexpectedEOF}, 0)
		if _, err := rd.Next(); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("%s: got %v", f, err)
		}
	}
}

func TestReaderNoProgress(t *testing.T) {
	rd := NewReader(JSON, iotest.ErrReader(nil), 0) // (0, nil) forever
	if _, err := rd.Next(); !errors.Is(err, io.ErrNoProgress) {
		t.Fatalf("got %v", err)
	}
}

// countingReader counts what was read from it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// endless repeats a pattern forever after a prefix.
type endless struct {
	prefix  []byte
	pattern byte
}

func (e *endless) Read(p []byte) (int, error) {
	n := copy(p, e.prefix)
	e.prefix = e.prefix[n:]
	for i := n; i < len(p); i++ {
		p[i] = e.pattern
	}
	return len(p), nil
}

// TestFrameTooLarge: an oversized frame fails with ErrFrameTooLarge after reading no more than
// the limit and one read's worth, whatever its format.
func TestFrameTooLarge(t *testing.T) {
	const limit = 64 << 10
	cases := []struct {
		name string
		f    Format
		src  io.Reader
	}{
		{"json-endless-string", JSON, &endless{prefix: []byte(`{"type":"ADDED","object":{"data":"`), pattern: 'x'}},
		{"json-endless-nesting", JSON, &endless{prefix: []byte(`{"a":`), pattern: ' '}},
		{"protobuf-header", Protobuf, &endless{prefix: []byte{0, 1, 0, 1}, pattern: 0}},
		{"protobuf-max-header", Protobuf, &endless{prefix: []byte{0xff, 0xff, 0xff, 0xff}, pattern: 0}},
		{"cbor-long-string-head", CBOR, &endless{prefix: []byte{0xd9, 0xd9, 0xf7, 0xa1, 0x5b, 0, 0, 0, 1, 0, 0, 0, 0}, pattern: 0}},
		{"cbor-huge-map-count", CBOR, &endless{prefix: []byte{0xbb, 0, 0, 1, 0, 0, 0, 0, 0}, pattern: 0}},
		{"cbor-endless-array", CBOR, &endless{prefix: []byte{0x9f}, pattern: 0x01}},
		{"cbor-endless-indefinite-string", CBOR, &endless{prefix: []byte{0x5f}, pattern: 0x40}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cr := &countingReader{r: c.src}
			_, err := NewReader(c.f, cr, limit).Next()
			if !errors.Is(err, ErrFrameTooLarge) {
				t.Fatalf("got %v, want ErrFrameTooLarge", err)
			}
			if cr.n > limit+frameSlack+minRead+busyBufSize {
				t.Fatalf("read %d bytes for a %d-byte limit", cr.n, limit)
			}
		})
	}
	// At the limit exactly: fine; one byte over: too large.
	for _, f := range formats {
		ev := apiStream(t, f, []testEvent{{watch.Added, configMap("ns", "a", "u", "5")}}, false)
		size := len(ev)
		switch f {
		case Protobuf:
			size -= 4
		case JSON:
			size-- // the newline
		}
		if _, err := NewReader(f, bytes.NewReader(ev), size).Next(); err != nil {
			t.Fatalf("%s at the limit: %v", f, err)
		}
		if _, err := NewReader(f, iotest.OneByteReader(bytes.NewReader(ev)), size-1).Next(); !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("%s one over the limit: %v", f, err)
		}
	}
}

// TestReaderBufferBounded: a long stream of small events keeps the buffer small.
func TestReaderBufferBounded(t *testing.T) {
	for _, f := range formats {
		one := apiStream(t, f, []testEvent{{watch.Modified, configMap("ns", "a", "u", "5")}}, false)
		stream := bytes.Repeat(one, 2000)
		rd := NewReader(f, newSplitReader(stream, 1, 3000), 0)
		for {
			if _, err := rd.Next(); err != nil {
				if err != io.EOF {
					t.Fatal(err)
				}
				break
			}
		}
		if len(rd.buf) > busyBufSize {
			t.Fatalf("%s: buffer grew to %d for %d-byte events", f, len(rd.buf), len(one))
		}
	}
}

func TestUnknownFormat(t *testing.T) {
	if _, err := NewReader(Format(0), strings.NewReader("{}"), 0).Next(); err == nil {
		t.Fatal("no error for an unknown format")
	}
	if _, err := EncodeEvent(Format(9), Added, expired()); err == nil {
		t.Fatal("no error for an unknown format")
	}
}

// checkHandmade reads a hand-built stream with the reader and with the oracle, and asserts
// they agree event for event (or that both reject it). Each event is also rewritten and read
// back.
func checkHandmade(t *testing.T, f Format, stream []byte) []*Event {
	t.Helper()
	want, oerr := decodeOracle(t, f, stream)
	got, err := readAll(f, iotest.OneByteReader(bytes.NewReader(stream)), 0)
	if oerr != nil {
		if err == nil {
			t.Fatalf("oracle rejects the stream (%v), the reader accepts it", oerr)
		}
		return nil
	}
	if err != nil {
		t.Fatalf("reader: %v", err)
	}
	if len(got) != len(want) {
		t.Fatalf("read %d events, oracle %d", len(got), len(want))
	}
	for i := range got {
		exp := expected(t, want[i])
		if err := sameFields(got[i], &exp); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if got[i].CanRewriteRV() {
			var out bytes.Buffer
			if err := NewWriter(f, &out).WriteWithRV(got[i], "424242"); err != nil {
				t.Fatalf("event %d: rewrite: %v", i, err)
			}
			re, err := decodeOracle(t, f, out.Bytes())
			if err != nil || len(re) != 1 || rvOf(t, re[0]) != "424242" {
				t.Fatalf("event %d: rewritten event decodes as %v, %v", i, re, err)
			}
		}
	}
	return got
}

func TestJSONShapes(t *testing.T) {
	ok := map[string]string{
		"no newlines": `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"n","uid":"u","resourceVersion":"5"}}}` +
			`{"type":"DELETED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"n","uid":"u","resourceVersion":"6"}}}`,
		"whitespace everywhere": " \r\n\t{ \"type\" : \"ADDED\" ,\n \"object\" : { \"kind\":\"ConfigMap\",\"apiVersion\":\"v1\", \"metadata\" : { \"name\" : \"a\" , \"resourceVersion\" : \"5\" } } }\r\n \n",
		"object before type":    `{"object":{"metadata":{"resourceVersion":"7","name":"b"},"kind":"ConfigMap","apiVersion":"v1"},"type":"MODIFIED"}`,
		"escapes": `{"type":"\u0041DDED","object":{"kind":"ConfigMap","apiVersion":"v1","data":{"k":"}]\"{[\\"},` +
			`"metadata":{"na\u006de":"x\"y\\z\/\u00e9\ud83d\ude00","names":"no","resourceVersion":"\u0031\u0032","annotations":{"k8s.io\/initial-events-end":"tr\u0075e"}}}}`,
		"nested brackets in strings":           `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","data":{"a":"{{{[[[","b":"]]]}}}"},"metadata":{"resourceVersion":"9"}}}`,
		"duplicate keys, last wins":            `{"type":"ADDED","type":"MODIFIED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"1","name":"a","resourceVersion":"2"}}}`,
		"metadata merges":                      `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","resourceVersion":"3"},"metadata":{"namespace":"n"}}}`,
		"object replaces":                      `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","uid":"u"}},"object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"b","resourceVersion":"4"}}}`,
		"replaced object read wrong":           `{"type":"ADDED","object":{"metadata":{"name":{},"annotations":[]}},"object":"x","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"b"}}}`,
		"nulls":                                `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","resourceVersion":"5","uid":null,"annotations":null,"labels":null},"data":null}}`,
		"numbers and literals":                 `{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","resourceVersion":"5","generation":-15,"deletionGracePeriodSeconds":30},"spec":{"hostNetwork":true,"containers":[]},"status":{}}}`,
		"bookmark annotation not true":         `{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"5","annotations":{"k8s.io/initial-events-end":"false"}}}}`,
		"initial-events-end on a non-bookmark": `{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"5","annotations":{"a":"b","k8s.io/initial-events-end":"true"}}}}`,
	}
	for name, s := range ok {
		t.Run(name, func(t *testing.T) {
			if got := checkHandmade(t, JSON, []byte(s)); got == nil {
				t.Fatal("oracle rejected a valid case")
			}
		})
	}
	bad := map[string]string{
		"top-level array":     `[{"type":"ADDED"}]`,
		"top-level string":    `"ADDED"`,
		"mismatched":          `{"type":"ADDED","object":{"a":[}]}`,
		"extra close":         `{"type":"ADDED"}}`,
		"type is a number":    `{"type":5,"object":{}}`,
		"rv is a number":      `{"type":"ADDED","object":{"metadata":{"resourceVersion":5}}}`,
		"object is a string":  `{"type":"ADDED","object":"x"}`,
		"bad escape":          `{"type":"ADD\xED","object":{"metadata":{"name":"\q"}}}`,
		"missing colon":       `{"type" "ADDED"}`,
		"missing comma":       `{"type":"ADDED" "object":{}}`,
		"too deep":            `{"a":` + strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1) + `}`,
		"annotations is list": `{"type":"ADDED","object":{"metadata":{"annotations":[]}}}`,
	}
	for name, s := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := readAll(JSON, strings.NewReader(s), 0)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("got %v, want ErrMalformed", err)
			}
		})
	}
}

// TestReaderBufferShrinks: one big frame grows the buffer; a run of small ones lets it go.
func TestReaderBufferShrinks(t *testing.T) {
	big := apiStream(t, Protobuf, []testEvent{{watch.Added, pod("ns", "big", "u", "1", 200<<10)}}, false)
	small := apiStream(t, Protobuf, []testEvent{{watch.Modified, configMap("ns", "a", "u", "2")}}, false)
	stream := append(append([]byte(nil), big...), bytes.Repeat(small, 2*shrinkAfter)...)
	rd := NewReader(Protobuf, iotest.HalfReader(bytes.NewReader(stream)), 0)
	if _, err := rd.Next(); err != nil {
		t.Fatal(err)
	}
	if len(rd.buf) < len(big) {
		t.Fatalf("buffer %d for a %d-byte frame", len(rd.buf), len(big))
	}
	for {
		if _, err := rd.Next(); err != nil {
			break
		}
	}
	if len(rd.buf) > busyBufSize {
		t.Fatalf("buffer still %d bytes after %d small frames", len(rd.buf), 2*shrinkAfter)
	}
}

// readSizes replays data in reads of at most step bytes, noting the size of each buffer it is
// offered, then fails.
type readSizes struct {
	data   []byte
	step   int
	offers []int
}

func (r *readSizes) Read(p []byte) (int, error) {
	r.offers = append(r.offers, len(p))
	if len(r.data) == 0 {
		return 0, errors.New("no more")
	}
	n := copy(p[:min(len(p), r.step)], r.data)
	r.data = r.data[n:]
	return n, nil
}

// TestReaderWaitsInSmallBuffer: once the source has nothing more queued, the Reader waits for
// the next event in its idle buffer, not in a busy one (memory per idle watch).
func TestReaderWaitsInSmallBuffer(t *testing.T) {
	for _, f := range formats {
		ev := apiStream(t, f, []testEvent{{watch.Added, configMap("ns", "a", "u", "5")}}, false)
		src := &readSizes{data: bytes.Repeat(ev, 3), step: 700}
		rd := NewReader(f, src, 0)
		for range 3 {
			if _, err := rd.Next(); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
		}
		if _, err := rd.Next(); err == nil {
			t.Fatalf("%s: no error after the data", f)
		}
		if last := src.offers[len(src.offers)-1]; last > idleBufSize {
			t.Fatalf("%s: waited for the next event with a %d-byte buffer (offers %v)", f, last, src.offers)
		}
		if rd.pooled != nil {
			t.Fatalf("%s: pooled buffer kept after the stream failed", f)
		}
	}
}

// countingBudget is a Budget of max bytes that records what it holds.
type countingBudget struct {
	max, held, most int
	refused         int
}

func (b *countingBudget) Take(n int) bool {
	if b.held+n > b.max {
		b.refused++
		return false
	}
	b.held += n
	b.most = max(b.most, b.held)
	return true
}

func (b *countingBudget) Give(n int) { b.held -= n }

// TestReaderBudget: a Reader charges its budget for every buffer beyond its idle one, as it
// grows; a frame the budget cannot afford ends it (ErrOverBudget) with everything given back;
// a Reader that waits for its next event holds nothing of it; Close gives back the rest.
func TestReaderBudget(t *testing.T) {
	big := apiStream(t, Protobuf, []testEvent{{watch.Added, pod("ns", "big", "u", "1", 1<<20)}}, false)
	small := apiStream(t, Protobuf, []testEvent{{watch.Modified, configMap("ns", "a", "u", "2")}}, false)

	t.Run("refused", func(t *testing.T) {
		b := &countingBudget{max: 256 << 10}
		rd := NewReader(Protobuf, bytes.NewReader(append(append([]byte(nil), small...), big...)), 0)
		rd.SetBudget(b)
		if _, err := rd.Next(); err != nil {
			t.Fatal(err)
		}
		if _, err := rd.Next(); !errors.Is(err, ErrOverBudget) {
			t.Fatalf("a 1 MiB frame with a 256 KiB budget: %v, want ErrOverBudget", err)
		}
		if b.held != 0 || b.refused != 1 {
			t.Fatalf("after the refusal the budget holds %d bytes (refused %d times), want 0 (1)", b.held, b.refused)
		}
	})
	t.Run("charged and given back", func(t *testing.T) {
		b := &countingBudget{max: 4 << 20}
		src := &readSizes{data: append(append([]byte(nil), big...), small...), step: 64 << 10}
		rd := NewReader(Protobuf, src, 0)
		rd.SetBudget(b)
		for range 2 {
			if _, err := rd.Next(); err != nil {
				t.Fatal(err)
			}
		}
		if b.most < len(big) || b.held != rd.charged {
			t.Fatalf("budget held at most %d bytes for a %d-byte frame; holds %d, the Reader says %d", b.most, len(big), b.held, rd.charged)
		}
		rd.Close()
		if b.held != 0 {
			t.Fatalf("%d bytes held after Close", b.held)
		}
		if _, err := rd.Next(); !errors.Is(err, ErrClosed) {
			t.Fatalf("Next after Close: %v", err)
		}
	})
	t.Run("idle holds nothing", func(t *testing.T) {
		b := &countingBudget{max: 4 << 20}
		src := &waitingSource{readSizes: readSizes{data: append(append([]byte(nil), big...), small...), step: 700}, b: b, heldAtWait: -1}
		rd := NewReader(Protobuf, src, 0)
		rd.SetBudget(b)
		for range 2 {
			if _, err := rd.Next(); err != nil {
				t.Fatal(err)
			}
		}
		// The source has nothing queued: the Reader waits for the next event in its idle
		// buffer, its other buffer given back.
		if _, err := rd.Next(); err == nil {
			t.Fatal("no error after the data")
		}
		if src.heldAtWait != 0 || b.most < len(big) {
			t.Fatalf("%d bytes held by a Reader waiting for its next event (%d at most, for a %d-byte frame)", src.heldAtWait, b.most, len(big))
		}
	})
}

// waitingSource is readSizes that notes what the budget holds when the Reader asks for more
// after the data: where a live watch would wait.
type waitingSource struct {
	readSizes
	b          *countingBudget
	heldAtWait int
}

func (w *waitingSource) Read(p []byte) (int, error) {
	if len(w.data) == 0 && w.heldAtWait < 0 {
		w.heldAtWait = w.b.held
	}
	return w.readSizes.Read(p)
}
