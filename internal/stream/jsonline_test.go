package stream

import (
	"bytes"
	"io"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"
)

// The JSON splitter's line path (jsonSplitter.split, jsonScan.runLine): every frame it finds
// is the exact scan's, and each way of leaving a frame to the exact scan is taken.

// readLines reads stream with the line path on, in reads of at most chunk bytes (0: whole),
// and returns the events, the splitter's counters and the final error.
func readLines(t *testing.T, stream []byte, chunk int) ([]*Event, jsonLineStats, error) {
	t.Helper()
	var src io.Reader = bytes.NewReader(stream)
	if chunk > 0 {
		src = &chunkReader{data: stream, n: chunk}
	}
	rd := NewReader(JSON, src, 0)
	var out []*Event
	for {
		ev, err := rd.Next()
		if err != nil {
			return out, rd.split.(*jsonSplitter).stats, err
		}
		out = append(out, ev.Clone())
	}
}

// chunkReader returns data n bytes at a time.
type chunkReader struct {
	data []byte
	n    int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), c.n)], c.data)
	c.data = c.data[k:]
	return k, nil
}

// sameAsExact checks that the events and error read with the line path are the exact scan's
// (byte loop alone, whole reads), byte for byte but for the newline after a value (a frame
// found before its newline arrived does not wait for it), and apimachinery's where it decodes.
func sameAsExact(t *testing.T, stream []byte, got []*Event, err error) {
	t.Helper()
	ref, rerr := readAllPath(JSON, bytes.NewReader(stream), 0, true)
	if len(ref) != len(got) || errClass(rerr) != errClass(err) {
		t.Fatalf("exact scan: %d events, %v; line path: %d, %v", len(ref), rerr, len(got), err)
	}
	for i := range ref {
		trim := func(b []byte) []byte { return bytes.TrimSuffix(b, []byte("\n")) }
		if !bytes.Equal(trim(ref[i].Raw), trim(got[i].Raw)) || sameFields(ref[i], got[i]) != nil || ref[i].rv != got[i].rv {
			t.Fatalf("event %d differs from the exact scan's:\n got %q\n ref %q", i, got[i].Raw, ref[i].Raw)
		}
	}
	want, oerr := decodeOracle(t, JSON, stream)
	if len(got) < len(want) || oerr == nil && len(got) != len(want) {
		t.Fatalf("oracle decodes %d events (%v); read %d (%v)", len(want), oerr, len(got), err)
	}
	for i := range want {
		exp := expected(t, want[i])
		if err := sameFields(got[i], &exp); err != nil {
			t.Fatalf("event %d against the oracle: %v", i, err)
		}
	}
}

// TestJSONLineFallbacks reads streams that take each of the line path's ways to the exact
// scan and checks, by the splitter's counters, that each was taken, and that what was read is
// the exact scan's and apimachinery's.
func TestJSONLineFallbacks(t *testing.T) {
	hostile := hostileStreams(t)
	cm := apiStream(t, JSON, sampleEvents(), false)
	miss := func(m jsonLineMiss) func(jsonLineStats) int { return func(s jsonLineStats) int { return s.miss[m] } }
	cases := []struct {
		name   string
		stream []byte
		// count is the counter that must be non-zero.
		count func(jsonLineStats) int
	}{
		{"apiserver stream: lines", cm, func(s jsonLineStats) int { return s.lines }},
		{"pretty-printed (values span lines)", hostile["pretty-printed (values span lines)"], func(s jsonLineStats) int { return s.notClosed }},
		{"CRLF after each event", hostile["CRLF after each event"], func(s jsonLineStats) int { return s.notClosed }},
		{"raw newline inside a string", hostile["raw newline inside a string"], miss(lineOpen)},
		{"no newline after the last event", hostile["no newline after the last event"], func(s jsonLineStats) int { return s.noNewline }},
		{"truncated line", hostile["truncated line"], func(s jsonLineStats) int { return s.noNewline }},
		{"several events on one line", hostile["several events on one line"], miss(lineEarly)},
		// One value on its line, whatever its prefix looks like: the line path settles it, and
		// the parser reads the later type, as client-go does.
		{"object closed early, second type", hostile["object closed early, second type"], func(s jsonLineStats) int { return s.lines }},
		{"garbage after the event", hostile["garbage after the event"], miss(lineEarly)},
		{"raw newline in a string after a brace", hostile["raw newline in a string after a brace"], miss(lineOpen)},
		{"value goes on after a line ending in }", hostile["value goes on after a line ending in }"], miss(lineOpen)},
		{"backslashes outside strings", hostile["backslashes outside strings"], miss(lineBackslash)},
		{"nested deeper than the line path", hostile["nested deeper than the line path"], miss(lineDeep)},
		{"mismatched bracket", hostile["mismatched bracket"], miss(lineBad)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.stream == nil {
				t.Fatal("no such stream")
			}
			got, st, err := readLines(t, c.stream, 0)
			if c.count(st) == 0 {
				t.Errorf("counter not reached: %+v", st)
			}
			sameAsExact(t, c.stream, got, err)
			// Whole reads keep each value's newline, as the exact scan does.
			ref, _ := readAllPath(JSON, bytes.NewReader(c.stream), 0, true)
			for i := range min(len(ref), len(got)) {
				if !bytes.Equal(ref[i].Raw, got[i].Raw) {
					t.Fatalf("event %d: raw %q, exact scan's %q", i, got[i].Raw, ref[i].Raw)
				}
			}
			// Cut into reads of every size up to a few blocks, and odd ones beyond.
			for _, n := range []int{1, 7, 63, 64, 65, 200, 1000, 4097} {
				parts, _, perr := readLines(t, c.stream, n)
				sameAsExact(t, c.stream, parts, perr)
			}
			t.Logf("%d events, %v; %+v", len(got), err, st)
		})
	}
}

// TestJSONLineFrameLimit: a line longer than the frame limit is too large for the line path
// as for the exact scan, and one just within it is read.
func TestJSONLineFrameLimit(t *testing.T) {
	ev := bytes.TrimSuffix(apiStream(t, JSON, sampleEvents()[:1], false), []byte("\n"))
	stream := append(slices.Clone(ev), '\n')
	for _, limit := range []int{len(ev) - 1, len(ev), len(ev) + 1} {
		want, werr := readAllPath(JSON, bytes.NewReader(stream), limit, true)
		got, err := readAllPath(JSON, bytes.NewReader(stream), limit, false)
		if len(got) != len(want) || errClass(err) != errClass(werr) {
			t.Errorf("limit %d: line path %d events, %v; exact %d, %v", limit, len(got), err, len(want), werr)
		}
		if limit >= len(ev) && len(got) != 1 {
			t.Errorf("limit %d (frame %d bytes): %d events, %v", limit, len(ev), len(got), err)
		}
	}
	// A frame that reaches the limit before its newline is left to the exact scan, which
	// finds it too large, as it does with the line path off.
	rd := NewReader(JSON, &chunkReader{data: stream, n: 100}, len(ev)/2)
	if _, err := rd.Next(); errClass(err) != "too large" {
		t.Errorf("frame over the limit: %v", err)
	}
	if st := rd.split.(*jsonSplitter).stats; st.noNewline != 1 || st.lines != 0 {
		t.Errorf("frame over the limit: splitter stats %+v; want it left to the exact scan for want of a newline", st)
	}
}

// quietSource returns its data in one Read, then blocks until released.
type quietSource struct {
	data    []byte
	release chan struct{}
}

func (q *quietSource) Read(p []byte) (int, error) {
	if len(q.data) > 0 {
		n := copy(p, q.data)
		q.data = q.data[n:]
		return n, nil
	}
	<-q.release
	return 0, io.EOF
}

// TestJSONLineNoNewlineQuiet: a whole value whose newline has not come is delivered while the
// source is quiet, not held until the newline (or the next event) arrives.
func TestJSONLineNoNewlineQuiet(t *testing.T) {
	ev := bytes.TrimSuffix(apiStream(t, JSON, []testEvent{{watch.Added, configMap("ns", "a", "u", "42")}}, false), []byte("\n"))
	src := &quietSource{data: ev, release: make(chan struct{})}
	defer close(src.release)
	rd := NewReader(JSON, src, 0)
	type result struct {
		ev  *Event
		err error
	}
	done := make(chan result, 1)
	go func() {
		e, err := rd.Next()
		if e != nil {
			e = e.Clone()
		}
		done <- result{e, err}
	}()
	select {
	case r := <-done:
		if r.err != nil || r.ev.RV != "42" {
			t.Fatalf("Next = %v, %v; want the event with RV 42", r.ev, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the event was held while its source was quiet")
	}
	if st := rd.split.(*jsonSplitter).stats; st.noNewline != 1 {
		t.Errorf("splitter stats %+v; want the frame left to the exact scan for want of a newline", st)
	}
}

// The parser's string search (jsonParser.plain) answers what skipPlain answers at every
// offset of a frame the line path settled, from the masks runLine kept and past them: on
// events of every size, with escapes, and a frame longer than the masks cover.
func TestJSONPlainMasks(t *testing.T) {
	long := pod("team-a", "web-\"0\"\\x", "0d8e5d8c-0002-4c1a-9d1b-3f7e0a000002", "99", 8192)
	long.Annotations = map[string]string{"note": "a \"quoted\" value\twith\\escapes\n"}
	evs := []testEvent{
		{watch.Added, configMap("default", "cm-a", "0d8e5d8c-0001-4c1a-9d1b-3f7e0a000001", "101")},
		{watch.Modified, long},
		{watch.Bookmark, bookmark("104", false)},
	}
	data := apiStream(t, JSON, evs, false)
	for len(data) > 0 {
		nl := bytes.IndexByte(data, '\n')
		frame := data[:nl+1]
		data = data[nl+1:]
		ps := new(parseState)
		sp := &jsonSplitter{}
		sp.bind(ps)
		sp.reset()
		if n, err := sp.split(frame, 1<<20, arriveNow); n != len(frame) || err != nil || sp.stats.lines != 1 {
			t.Fatalf("split: %d, %v, %+v; want the whole frame by the line path", n, err, sp.stats)
		}
		if want := min((nl+blockSize-1)/blockSize, plainBlocks); ps.js.nplain != want {
			t.Fatalf("%d masks kept for a %d-byte line, want %d", ps.js.nplain, nl, want)
		}
		p := &jsonParser{b: frame, ps: ps}
		for i := 0; i <= len(frame); i++ {
			if got, want := p.plain(i), skipPlain(frame, i); got != want {
				t.Fatalf("plain(%d) = %d, skipPlain = %d (frame of %d bytes, %d masks)", i, got, want, len(frame), ps.js.nplain)
			}
		}
	}
}
