package stream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/watch"
)

// The JSON scanner's two paths (format_json_scan.go): the block path must compute exactly what
// the byte loop computes, on any bytes and however they are cut.

// scanOutcome is what one scan of a buffer found.
type scanOutcome struct {
	end   int
	err   string
	spans []jsonSpan
	stats jsonScanStats
}

// scanIn scans b from its first byte, handed over in pieces ending at cuts (then at len(b)),
// as a Reader hands over a growing buffer.
func scanIn(b []byte, bytesOnly bool, cuts []int) scanOutcome {
	s := &jsonScan{record: true, bytesOnly: bytesOnly}
	s.reset(0)
	end := -1
	for _, c := range append(slices.Clone(cuts), len(b)) {
		if c < s.pos || c > len(b) {
			continue
		}
		if end = s.run(b[:c]); end >= 0 || s.err != nil {
			break
		}
	}
	o := scanOutcome{end: end, spans: slices.Clone(s.spans), stats: s.stats}
	if s.err != nil {
		o.err = s.err.Error()
	}
	return o
}

func sameScan(a, b scanOutcome) error {
	if a.end != b.end || a.err != b.err || !slices.Equal(a.spans, b.spans) {
		return fmt.Errorf("end %d err %q spans %v; want end %d err %q spans %v", a.end, a.err, a.spans, b.end, b.err, b.spans)
	}
	return nil
}

// checkScanPaths compares the block path with the byte loop on b, whole and cut at cuts.
func checkScanPaths(t *testing.T, b []byte, cuts []int) {
	t.Helper()
	want := scanIn(b, true, nil)
	for _, cs := range [][]int{nil, cuts} {
		if got := scanIn(b, false, cs); sameScan(got, want) != nil {
			t.Fatalf("cuts %v: block path: %v\ninput %q", cs, sameScan(got, want), b)
		}
		if got := scanIn(b, true, cs); sameScan(got, want) != nil {
			t.Fatalf("cuts %v: byte loop cut up: %v\ninput %q", cs, sameScan(got, want), b)
		}
	}
	checkLinePath(t, b, want)
}

// checkLinePath holds the line path to the exact scan on b (whose exact outcome is want): the
// line is b up to its first newline. When the line path settles the line, the exact scan ends
// the value at the line's end with the same spans; when it does not, the reason it gives is
// true of the exact scan: the value ends before the line's end (early), not within the line
// (open), at a bad bracket within it (bad); only a value with a backslash outside a string or
// nested deeper than the line path follows may be left to the exact scan whatever it finds.
func checkLinePath(t *testing.T, b []byte, want scanOutcome) {
	t.Helper()
	line := b
	if nl := bytes.IndexByte(b, '\n'); nl >= 0 {
		line = b[:nl]
	}
	s := &jsonScan{record: true}
	s.reset(0)
	miss := s.runLine(line)
	var ok bool
	switch miss {
	case lineOK:
		ok = want.err == "" && want.end == len(line) && slices.Equal(s.spans, want.spans)
	case lineEarly:
		ok = want.err == "" && want.end >= 0 && want.end < len(line)
	case lineOpen:
		ok = want.err != "" || want.end < 0 || want.end > len(line)
	case lineBad:
		ok = want.err != ""
	case lineBackslash, lineDeep:
		ok = true
	}
	if !ok {
		t.Fatalf("line path: %d, spans %v; exact scan: %+v\ninput %q", miss, s.spans, want, b)
	}
}

func TestJSONMasksKernel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte(`"\{}[]` + "\x00\x20\x22\x5b\x5c\x5d\x7b\x7d\x7c\x02\x3c\x3b\x3d\xfb\xfd\xdc\xa2x")
	for round := range 2000 {
		n := 1 + round%maskBatch
		b := make([]byte, n*blockSize)
		for i := range b {
			if round%2 == 0 {
				b[i] = byte(rng.UintN(256))
			} else {
				b[i] = alphabet[rng.IntN(len(alphabet))]
			}
		}
		got, want := make([]jsonMasks, n), make([]jsonMasks, n)
		jsonMasksOf(b, got)
		jsonMasksGeneric(b, want)
		if !slices.Equal(got, want) {
			t.Fatalf("masks differ for %q:\n got  %+v\n want %+v", b, got, want)
		}
	}
}

// TestEscapedBits checks the escape arithmetic against the sequential rule on every pattern of
// backslashes in 16 bytes at both ends of a block, with and without an escaped first byte.
func TestEscapedBits(t *testing.T) {
	ref := func(bs uint64, first bool) (escaped uint64, next bool) {
		esc := first
		for k := range 64 {
			switch {
			case esc:
				escaped |= 1 << k
				esc = false
			case bs>>k&1 != 0:
				esc = true
			}
		}
		return escaped, esc
	}
	for p := range uint64(1 << 16) {
		for _, bs := range []uint64{p, p << 48, p<<24 | p<<48, p | p<<40} {
			for _, first := range []bool{false, true} {
				esc, next := escapedBits(bs, b2u(first))
				wantEsc, wantNext := ref(bs, first)
				if esc != wantEsc || (next != 0) != wantNext {
					t.Fatalf("bs %064b first %v: escaped %064b next %d; want %064b %v", bs, first, esc, next, wantEsc, wantNext)
				}
			}
		}
	}
}

func TestPrefixXor(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 10000 {
		x := rng.Uint64()
		var want, p uint64
		for k := range 64 {
			p ^= x >> k & 1
			want |= p << k
		}
		if got := prefixXor(x); got != want {
			t.Fatalf("prefixXor(%064b) = %064b, want %064b", x, got, want)
		}
	}
}

// hostileJSON builds inputs dense in what the scanner must get right: backslash runs of every
// length at every offset, quotes, brackets, inside and outside strings, across block edges.
func hostileJSON(rng *rand.Rand, n int) []byte {
	pieces := []string{`"`, `\`, `\\`, `\\\`, `\"`, `{`, `}`, `[`, `]`, `"a"`, `{"k":"v"}`, `[1,2]`, `x`, ` `, "\n",
		`"\\"`, `"\""`, `"{["`, `"}]"`, `\{`, `\u0022`}
	b := []byte{'{'}
	for len(b) < n {
		if rng.IntN(4) == 0 {
			b = append(b, bytes.Repeat([]byte("z"), rng.IntN(70))...)
		}
		b = append(b, pieces[rng.IntN(len(pieces))]...)
	}
	return b
}

func TestJSONScanPathsAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 3000 {
		b := hostileJSON(rng, 1+rng.IntN(700))
		var cuts []int
		for c := 0; c < len(b); c += 1 + rng.IntN(150) {
			cuts = append(cuts, c)
		}
		checkScanPaths(t, b, cuts)
	}
	// Valid frames: every event of the sample stream, alone and with garbage after it.
	stream := apiStream(t, JSON, sampleEvents(), false)
	for _, line := range bytes.SplitAfter(stream, []byte("\n")) {
		checkScanPaths(t, line, []int{1, 63, 64, 65, 200})
		checkScanPaths(t, append(bytes.TrimSuffix(slices.Clone(line), []byte("\n")), `}}]"{`...), nil)
	}
}

// TestJSONScanFallbacks shows each path of the scanner taken, by its counters: whole blocks,
// a block with a backslash outside a string (byte loop), and a tail shorter than a block.
func TestJSONScanFallbacks(t *testing.T) {
	if !haveMaskKernel {
		t.Skip("no mask kernel on this architecture: the byte loop is the only path")
	}
	cm := apiStream(t, JSON, sampleEvents()[:1], false)
	cases := []struct {
		name       string
		in         []byte
		blocks     bool
		byteBlocks bool
		tail       bool
	}{
		{"apiserver event", cm, true, false, true},
		{"backslash outside a string", append([]byte(`{"a":`+string(bytes.Repeat([]byte(`\`), 70))+`1`), bytes.Repeat([]byte("x"), 200)...), true, true, true},
		{"short frame", []byte(`{"type":"ADDED"}`), false, false, true},
	}
	for _, c := range cases {
		o := scanIn(c.in, false, nil)
		if (o.stats.blocks > 0) != c.blocks || (o.stats.byteBlocks > 0) != c.byteBlocks || (o.stats.tailBytes > 0) != c.tail {
			t.Errorf("%s: stats %+v; want blocks %v, byte-loop blocks %v, tail %v", c.name, o.stats, c.blocks, c.byteBlocks, c.tail)
		}
		if err := sameScan(o, scanIn(c.in, true, nil)); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// hostileStreams are JSON watch streams in shapes an apiserver does not write, each with the
// reason it is there. Each is long enough for the scanner's block path.
func hostileStreams(t *testing.T) map[string][]byte {
	cm := bytes.TrimSuffix(apiStream(t, JSON, []testEvent{{watch.Modified, configMap("default", "cm-a", "u-1", "101")}}, false), []byte("\n"))
	cm2 := bytes.TrimSuffix(apiStream(t, JSON, []testEvent{{watch.Deleted, configMap("default", "cm-b", "u-2", "102")}}, false), []byte("\n"))
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, cm, "", "  "); err != nil {
		t.Fatal(err)
	}
	// The object closed early, a second "type" at the top level after it: one compact line,
	// alike to an apiserver's up to the end of the metadata (docs/design.md section 3).
	early := bytes.Replace(cm, []byte(`"data":{`), []byte(`"data":{}},"type":"DELETED","x":{"y":{`), 1)
	long := `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","data":{"k":"` +
		strings.Repeat(`a\\\"b\\\\c\"\\`, 40) + `"},"metadata":{"name":"n","resourceVersion":"77"}}}`
	nl := func(b ...[]byte) []byte { return append(bytes.Join(b, []byte("\n")), '\n') }
	return map[string][]byte{
		"pretty-printed (values span lines)": nl(pretty.Bytes(), cm2),
		"several events on one line":         nl(append(append(slices.Clone(cm), cm2...), cm...)),
		"several events, spaces between":     nl(bytes.Join([][]byte{cm, cm2, cm}, []byte(" \t "))),
		"object closed early, second type":   nl(early, cm2),
		"repeated metadata after the data":   nl(bytes.Replace(cm, []byte(`}}}`), []byte(`},"metadata":{"resourceVersion":"999","name":"z"}}}`), 1), cm2),
		"object repeated after the object":   nl(bytes.Replace(cm, []byte(`}}}`), []byte(`}},"object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"5"}}}`), 1)),
		"escaped newlines in strings":        nl(cm, []byte(long), cm2),
		"raw newline inside a string":        nl(bytes.Replace(cm, []byte(`\n`), []byte("\n"), 1), cm2),
		"truncated line":                     append(nl(cm), cm2[:len(cm2)-40]...),
		"truncated, next event on its line":  nl(cm[:len(cm)-30], cm2),
		"extra close after the event":        nl(append(slices.Clone(cm), '}'), cm2),
		"comma after the event":              nl(append(slices.Clone(cm), ','), cm2),
		"garbage after the event":            nl(append(slices.Clone(cm), `x{"type":"ADDED"}`...), cm2),
		"backslashes outside strings":        nl(bytes.Replace(cm, []byte(`"data":`), []byte(`"data":\\\\\\\\\`), 1), cm2),
		"brackets and quotes in strings":     nl(bytes.Replace(cm, []byte(`"data":{`), []byte(`"data":{"q":"}]}]\"{[\\\\\"}}}{\"type\":\"X\"}",`), 1), cm2),
		// The line path's own misses (TestJSONLineFallbacks).
		"raw newline in a string after a brace":  nl(bytes.Replace(cm, []byte(`"data":{`), []byte("\"data\":{\"q\":\"{}\n}\",\"t\":\"}\n\","), 1), cm2),
		"value goes on after a line ending in }": nl(bytes.Replace(cm, []byte(`}}}`), []byte("}}\n}"), 1), cm2),
		"nested deeper than the line path":       nl(bytes.Replace(cm, []byte(`"data":{`), []byte(`"data":{"deep":`+strings.Repeat("[", 70)+strings.Repeat("]", 70)+`,`), 1), cm2),
		"mismatched bracket":                     nl(cm2, bytes.Replace(cm, []byte(`"data":{`), []byte(`"data":{"m":[1},`), 1)),
		"CRLF after each event":                  append(bytes.Join([][]byte{cm, cm2, cm}, []byte("\r\n")), "\r\n"...),
		"no newline after the last event":        append(nl(cm), cm2...),
		"escaped quote before the newline":       nl(bytes.Replace(cm, []byte(`}}}`), []byte(`,"z":"\\\"}}}`), 1), cm2),
	}
}

// TestJSONHostileShapes: on every hostile stream the reader (block path on, whole reads) reads
// what apimachinery reads, up to where apimachinery stops, and the byte loop alone reads
// exactly the same frames and fails the same way; and between them the streams take every
// path of the scanner.
func TestJSONHostileShapes(t *testing.T) {
	var total jsonScanStats
	for name, stream := range hostileStreams(t) {
		t.Run(name, func(t *testing.T) {
			want, oerr := decodeOracle(t, JSON, stream)
			rd := NewReader(JSON, bytes.NewReader(stream), 0)
			var got []*Event
			var err error
			for {
				var ev *Event
				if ev, err = rd.Next(); err != nil {
					break
				}
				got = append(got, ev.Clone())
			}
			s := rd.jsStats // the Reader gave its parse state back when the stream ended
			total.blocks += s.blocks
			total.byteBlocks += s.byteBlocks
			total.tailBytes += s.tailBytes
			if len(got) < len(want) {
				t.Fatalf("read %d events, then %v; the oracle %d, then %v", len(got), err, len(want), oerr)
			}
			if oerr == nil && (len(got) != len(want) || err != io.EOF) {
				t.Fatalf("oracle decodes %d events; read %d, then %v", len(want), len(got), err)
			}
			for i := range want {
				exp := expected(t, want[i])
				if err := sameFields(got[i], &exp); err != nil {
					t.Fatalf("event %d against the oracle: %v", i, err)
				}
			}
			ref, rerr := readAllPath(JSON, bytes.NewReader(stream), 0, true)
			if len(ref) != len(got) || errClass(rerr) != errClass(err) {
				t.Fatalf("byte loop: %d events, %v; block path: %d, %v", len(ref), rerr, len(got), err)
			}
			for i := range ref {
				if !bytes.Equal(ref[i].Raw, got[i].Raw) || sameFields(ref[i], got[i]) != nil {
					t.Fatalf("event %d differs from the byte loop's", i)
				}
			}
			t.Logf("oracle %d events (%v); reader %d (%v); scanner %+v", len(want), oerr, len(got), err, s)
		})
	}
	if haveMaskKernel && (total.blocks == 0 || total.byteBlocks == 0 || total.tailBytes == 0) {
		t.Errorf("scanner paths taken: %+v; want each", total)
	}
}

// FuzzJSONScan: on any bytes, cut anywhere, the block path finds the frame end (or the error)
// and the container spans the byte loop finds.
func FuzzJSONScan(f *testing.F) {
	f.Add([]byte(`{"a":"\\\"}"}`), []byte{1, 64})
	f.Fuzz(func(t *testing.T, data, cutBytes []byte) {
		var cuts []int
		c := 0
		for _, d := range cutBytes {
			c += int(d)
			cuts = append(cuts, c)
		}
		checkScanPaths(t, data, cuts)
	})
}
