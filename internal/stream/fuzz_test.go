package stream

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/watch"
)

// Fuzz targets. The readers: no panic on any input; the same events and the same kind of
// error whatever the read sizes; every event read again from its own Raw gives the same
// fields; and where apimachinery decodes the input, the reader agrees with it. The rewriter:
// rewrite then read returns the new RV and otherwise identical fields (for JSON the bytes
// beside the RV are identical too), and apimachinery decodes the rewrite to the same object
// but for its RV.
//
// Seeds live in testdata/fuzz/<FuzzName>/; regenerate them with
// WATCHSAN_WRITE_FUZZ_SEEDS=1 go test -run TestWriteFuzzSeeds ./internal/stream/

func FuzzReaderJSON(f *testing.F)     { fuzzReader(f, JSON) }
func FuzzReaderProtobuf(f *testing.F) { fuzzReader(f, Protobuf) }
func FuzzReaderCBOR(f *testing.F)     { fuzzReader(f, CBOR) }

func FuzzRewriteJSON(f *testing.F)     { fuzzRewrite(f, JSON) }
func FuzzRewriteProtobuf(f *testing.F) { fuzzRewrite(f, Protobuf) }
func FuzzRewriteCBOR(f *testing.F)     { fuzzRewrite(f, CBOR) }

// errClass names the kind of a Reader error, for comparing runs.
func errClass(err error) string {
	switch {
	case err == nil:
		return "nil"
	case err == io.EOF:
		return "EOF"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected EOF"
	case errors.Is(err, ErrFrameTooLarge):
		return "too large"
	case errors.Is(err, ErrMalformed):
		return "malformed"
	}
	return "other: " + err.Error()
}

func readAllErr(f Format, r io.Reader, maxFrame int) ([]*Event, error) {
	return readAllPath(f, r, maxFrame, false)
}

// readAllPath is readAllErr with the JSON splitter's line path and the scanner's block path
// off when bytesOnly is set: the exact scan's byte loop alone.
func readAllPath(f Format, r io.Reader, maxFrame int, bytesOnly bool) ([]*Event, error) {
	rd := NewReader(f, r, maxFrame)
	rd.bytesOnly = bytesOnly
	if sp, ok := rd.split.(*jsonSplitter); ok {
		sp.noLine = bytesOnly
	}
	var out []*Event
	for {
		ev, err := rd.Next()
		if err != nil {
			return out, err
		}
		out = append(out, ev.Clone())
	}
}

func validUTF8(e *Event) bool {
	return utf8.ValidString(e.Type) && utf8.ValidString(e.RV) && utf8.ValidString(e.UID) &&
		utf8.ValidString(e.Namespace) && utf8.ValidString(e.Name)
}

func fuzzReader(f *testing.F, format Format) {
	f.Add([]byte(nil), uint16(1), uint16(0))
	f.Fuzz(func(t *testing.T, data []byte, split, maxFrame uint16) { checkReader(t, format, data, split, maxFrame) })
}

// checkReader is fuzzReader's check of one input.
func checkReader(t *testing.T, format Format, data []byte, split, maxFrame uint16) {
	{
		limit := int(maxFrame)
		whole, werr := readAllErr(format, bytes.NewReader(data), limit)
		parts, perr := readAllErr(format, newSplitReader(data, uint64(split), 1+int(split)%64), limit)
		if errClass(werr) != errClass(perr) || len(whole) != len(parts) {
			t.Fatalf("whole read: %d events, %v; split read: %d events, %v", len(whole), werr, len(parts), perr)
		}
		if c := errClass(werr); c != "EOF" && c != "unexpected EOF" && c != "too large" && c != "malformed" {
			t.Fatalf("unexpected error %v", werr)
		}
		if format == JSON {
			// The scanner's byte loop alone reads the same events, byte for byte but for the
			// newline after a value, and fails alike (format_json_scan.go). The newline is
			// whitespace between frames: the byte loop takes it only when it is already in the
			// buffer (it never waits for it), the line path waits for it, so a value ending
			// exactly at the end of a Read has it on one path and not the other, as between
			// whole and split reads below.
			ref, rerr := readAllPath(format, bytes.NewReader(data), limit, true)
			if errClass(rerr) != errClass(werr) || len(ref) != len(whole) {
				t.Fatalf("byte loop: %d events, %v; block path: %d events, %v", len(ref), rerr, len(whole), werr)
			}
			for i, ev := range whole {
				if err := sameFields(ev, ref[i]); err != nil || !bytes.Equal(bytes.TrimSuffix(ev.Raw, []byte("\n")), bytes.TrimSuffix(ref[i].Raw, []byte("\n"))) || ev.rv != ref[i].rv {
					t.Fatalf("event %d differs from the byte loop's: %v\n raw %q\n ref %q", i, err, ev.Raw, ref[i].Raw)
				}
			}
		}
		for i, ev := range whole {
			if err := sameFields(parts[i], ev); err != nil {
				t.Fatalf("event %d, split read: %v", i, err)
			}
			if !bytes.Equal(bytes.TrimSuffix(parts[i].Raw, []byte("\n")), bytes.TrimSuffix(ev.Raw, []byte("\n"))) {
				t.Fatalf("event %d: raw differs between whole and split reads", i)
			}
			again, err := readAllErr(format, bytes.NewReader(ev.Raw), 0)
			if len(again) != 1 || err != io.EOF {
				t.Fatalf("event %d read from its own Raw: %d events, %v", i, len(again), err)
			}
			if err := sameFields(again[0], ev); err != nil {
				t.Fatalf("event %d read from its own Raw: %v", i, err)
			}
			checkRewrite(t, format, ev, "12345", false)
		}
		// Differential: where apimachinery (with its 16 MiB limit) decodes the input, so must
		// we, alike. Its framers take a stream cut inside a frame for a clean end (even after
		// a length prefix beyond the limit); we say io.ErrUnexpectedEOF or ErrFrameTooLarge.
		if limit != 0 {
			return
		}
		want, oerr := decodeOracle(t, format, data)
		if oerr != nil {
			return
		}
		if c := errClass(werr); c == "malformed" || len(whole) != len(want) {
			t.Fatalf("oracle decodes %d events; reader read %d, then %v", len(want), len(whole), werr)
		}
		for i, ev := range whole {
			if !validUTF8(ev) {
				continue // encoding/json replaces invalid UTF-8; we pass it through
			}
			exp := expected(t, want[i])
			if err := sameFields(ev, &exp); err != nil {
				t.Fatalf("event %d against the oracle: %v", i, err)
			}
		}
	}
}

var (
	jsonLinesOnce sync.Once
	jsonLinesBase []byte
)

// FuzzReaderJSONLines is FuzzReaderJSON's check on the apiserver's own stream (small sample
// events, one compact event per line) edited where the line path decides: a newline inserted
// anywhere (inside a string: a raw newline; between tokens: a value spanning lines), a newline
// removed (several values on a line), the stream cut (a truncated line), a space or a CR
// before a newline, an event's line repeated without its newline, a newline after a '{' or
// ',' (pretty-printed output). Each edit is three bytes of ops: what, and where (two bytes,
// scaled to the stream).
func FuzzReaderJSONLines(f *testing.F) {
	f.Add([]byte{0, 0, 0}, uint16(1))
	f.Add([]byte{1, 40, 0, 2, 200, 0}, uint16(9))
	f.Add([]byte{3, 90, 0, 4, 10, 0, 5, 128, 0}, uint16(33))
	f.Add([]byte{6, 60, 0, 0, 61, 0}, uint16(2))
	f.Fuzz(func(t *testing.T, ops []byte, split uint16) {
		jsonLinesOnce.Do(func() {
			var small []testEvent
			for _, e := range sampleEvents() {
				if p, ok := e.obj.(interface{ Size() int }); !ok || p.Size() <= 2000 {
					small = append(small, e)
				}
			}
			jsonLinesBase = apiStream(t, JSON, small, false)
		})
		b := slices.Clone(jsonLinesBase)
		for k := 0; k+2 < len(ops) && k < 3*12; k += 3 {
			pos := (int(ops[k+1])<<8 | int(ops[k+2])) * (len(b) + 1) >> 16
			next := func(c byte) int { // the first c at or after pos, or -1
				if j := bytes.IndexByte(b[pos:], c); j >= 0 {
					return pos + j
				}
				return -1
			}
			switch ops[k] % 7 {
			case 0:
				b = slices.Insert(b, pos, '\n')
			case 1:
				if j := next('\n'); j >= 0 {
					b = slices.Delete(b, j, j+1)
				}
			case 2:
				b = b[:pos]
			case 3:
				if j := next('\n'); j >= 0 {
					b = slices.Insert(b, j, " \r"[ops[k]/7%2])
				}
			case 4:
				start := bytes.LastIndexByte(b[:pos], '\n') + 1
				if j := next('\n'); j >= 0 {
					b = slices.Insert(b, j+1, slices.Clone(b[start:j])...)
				}
			case 5, 6:
				c := "{,"[ops[k]%7-5]
				if j := next(c); j >= 0 {
					b = slices.Insert(b, j+1, '\n')
				}
			}
		}
		checkReader(t, JSON, b, split, 0)
	})
}

// checkRewrite rewrites ev's RV to rv and checks the result, with the oracle too when asked.
func checkRewrite(t *testing.T, format Format, ev *Event, rv string, oracle bool) {
	t.Helper()
	if !ev.CanRewriteRV() {
		var out bytes.Buffer
		if err := NewWriter(format, &out).WriteWithRV(ev, rv); !errors.Is(err, ErrMalformed) || out.Len() != 0 {
			t.Fatalf("event without RV: WriteWithRV = %v, wrote %d bytes", err, out.Len())
		}
		return
	}
	var out bytes.Buffer
	if err := NewWriter(format, &out).WriteWithRV(ev, rv); err != nil {
		// Only JSON and a text-string RV in CBOR refuse invalid UTF-8.
		textual := format == JSON || (format == CBOR && ev.rv.cborMajor == 3)
		if textual && !utf8.ValidString(rv) && errors.Is(err, ErrMalformed) && out.Len() == 0 {
			return
		}
		t.Fatalf("rewrite to %q: %v", rv, err)
	}
	got, err := readAllErr(format, bytes.NewReader(out.Bytes()), 1<<30)
	if len(got) != 1 || err != io.EOF {
		t.Fatalf("rewritten event re-read: %d events, %v\n in  %q\n out %q", len(got), err, ev.Raw, out.Bytes())
	}
	want := *ev
	want.SetRV(rv)
	if err := sameFields(got[0], &want); err != nil {
		t.Fatalf("rewritten event re-read: %v\n in  %q\n out %q", err, ev.Raw, out.Bytes())
	}
	switch format {
	case JSON:
		if !jsonRestEqual(ev, got[0]) {
			t.Fatalf("bytes beside the RV changed:\n in  %q\n out %q", ev.Raw, out.Bytes())
		}
	case CBOR:
		if !bytes.Equal(ev.Raw[:ev.rv.start], got[0].Raw[:got[0].rv.start]) || !bytes.Equal(ev.Raw[ev.rv.end:], got[0].Raw[got[0].rv.end:]) {
			t.Fatalf("bytes beside the RV changed:\n in  %q\n out %q", ev.Raw, out.Bytes())
		}
	}
	// Rewriting back gives what rewriting to the original RV gives (for protobuf, the only
	// bytes that may differ from the input are non-minimal length varints, re-encoded); an
	// original RV that is not valid UTF-8 cannot be written back into JSON or a CBOR text
	// string, as above.
	if textual := format == JSON || (format == CBOR && ev.rv.cborMajor == 3); textual && !utf8.ValidString(ev.RV) {
		return
	}
	var back, direct bytes.Buffer
	if err := NewWriter(format, &back).WriteWithRV(got[0], ev.RV); err != nil {
		t.Fatal(err)
	}
	if err := NewWriter(format, &direct).WriteWithRV(ev, ev.RV); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.Bytes(), direct.Bytes()) {
		t.Fatalf("rewrite is not reversible:\n back   %q\n direct %q", back.Bytes(), direct.Bytes())
	}
	if !oracle {
		return
	}
	orig, oerr := decodeOracle(t, format, ev.Raw)
	if oerr != nil || len(orig) != 1 {
		return
	}
	re, err := decodeOracle(t, format, out.Bytes())
	if err != nil || len(re) != 1 {
		t.Fatalf("oracle decodes the event but not its rewrite: %v\n in  %q\n out %q", err, ev.Raw, out.Bytes())
	}
	if !utf8.ValidString(rv) && format != Protobuf {
		return // JSON and CBOR text decoding replace or reject invalid UTF-8
	}
	if r := rvOf(t, re[0]); r != rv {
		t.Fatalf("oracle reads the rewritten RV as %q, want %q", r, rv)
	}
	setRV(t, re[0], rvOf(t, orig[0]))
	if re[0].Type != orig[0].Type || !equality.Semantic.DeepEqual(re[0].Obj, orig[0].Obj) {
		t.Fatalf("rewrite changed more than the RV:\n in  %q\n out %q", ev.Raw, out.Bytes())
	}
}

func fuzzRewrite(f *testing.F, format Format) {
	f.Add([]byte(nil), "1")
	f.Fuzz(func(t *testing.T, data []byte, rv string) {
		rd := NewReader(format, bytes.NewReader(data), 0)
		ev, err := rd.Next()
		if err != nil {
			return
		}
		checkRewrite(t, format, ev.Clone(), rv, true)
	})
}

// fuzzSeeds are the streams the seed corpus is made of: the sample stream in pieces small
// enough to mutate quickly, and the hand-built shapes.
func fuzzSeeds(t *testing.T, f Format) [][]byte {
	var seeds [][]byte
	var small []testEvent
	for _, e := range sampleEvents() {
		if p, ok := e.obj.(interface{ Size() int }); ok && p.Size() > 2000 {
			continue
		}
		small = append(small, e)
		seeds = append(seeds, apiStream(t, f, []testEvent{e}, false))
	}
	seeds = append(seeds, apiStream(t, f, small, false))
	if f == CBOR {
		seeds = append(seeds, apiStream(t, f, small[:3], true))
		seeds = append(seeds,
			cbEvent(cbText("ADDED"), cbTag(cbMap(cbText("metadata"), cbMap(cbText("resourceVersion"), cbText("17"))))),
			cbEvent(cbIndef(2, "MOD", "IFIED"), cbConfigMap(cbMap(cbIndef(2, "resource", "Version"), cbIndef(2, "1", "2")))),
			cbTag(cbIndefMap(cbBytes("type"), cbBytes("BOOKMARK"), cbBytes("object"), cbTag(cbIndefMap(cbBytes("kind"), cbBytes("Pod"),
				cbBytes("apiVersion"), cbBytes("v1"), cbBytes("metadata"), cbIndefMap(cbBytes("resourceVersion"), cbBytes("9")))))),
			// Tags apimachinery reads (TestCBORTagsReadAsApimachinery): one it does not know in
			// front of an event; a later encoding (hex) over a metadata map; one it does not know
			// in front of an annotation's key, and tag 0 in front of a text RV.
			cat([]byte{0xd9, 0x30, 0x30}, cbEvent(cbBytes("ERROR"), cbTag(cbMap(cbBytes("apiVersion"), cbBytes("v1"), cbBytes("kind"), cbBytes("Status"),
				cbBytes("metadata"), cbMap(cbBytes("resourceVersion"), cbBytes("3")), cbBytes("status"), cbBytes("Failure"))))),
			cbEvent(cbBytes("ADDED"), cbConfigMap(cat([]byte{0xd7}, cbMap(cbBytes("resourceVersion"), cbBytes("17"), cbBytes("name"), cbBytes("a"))))),
			cbEvent(cbBytes("BOOKMARK"), cbConfigMap(cbMap(cbBytes("resourceVersion"), cat([]byte{0xc0}, cbText("18")),
				cbBytes("annotations"), cbMap(cat([]byte{0xd8, 0x18}, cbBytes(InitialEventsEndAnnotation)), cbBytes("true"))))))
	}
	if f == JSON {
		// The shapes an apiserver does not write (jsonscan_test.go), in a fixed order.
		hostile := hostileStreams(t)
		for _, name := range slices.Sorted(maps.Keys(hostile)) {
			seeds = append(seeds, hostile[name])
		}
		seeds = append(seeds,
			[]byte(`{"object":{"metadata":{"resourceVersion":"\u0031","name":"a"},"kind":"ConfigMap","apiVersion":"v1"},"type":"ADDED"}{"type":"DELETED"}`),
			[]byte(`{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"1","resourceVersion":"2"},"metadata":{"name":"x"}}}`))
	}
	if f == Protobuf {
		evs := apiStream(t, f, []testEvent{{watch.Deleted, configMap("ns", "a", "u", "7")}}, false)
		seeds = append(seeds, evs[:len(evs)-5]) // truncated
	}
	return seeds
}

// TestWriteFuzzSeeds writes the seed corpus. It only runs when asked to.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("WATCHSAN_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set WATCHSAN_WRITE_FUZZ_SEEDS=1 to regenerate testdata/fuzz")
	}
	for _, f := range formats {
		name := map[Format]string{JSON: "JSON", Protobuf: "Protobuf", CBOR: "CBOR"}[f]
		seeds := fuzzSeeds(t, f)
		write := func(target string, i int, vals string) {
			dir := filepath.Join("testdata", "fuzz", target)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte("go test fuzz v1\n"+vals), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		rvs := []string{"1", "", "18446744073709551615", "x\"\\\n\u00e9", "\xff", string(bytes.Repeat([]byte("9"), 300))}
		for i, s := range seeds {
			write("FuzzReader"+name, i, fmt.Sprintf("[]byte(%q)\nuint16(%d)\nuint16(%d)\n", s, i*37, 0))
			write("FuzzRewrite"+name, i, fmt.Sprintf("[]byte(%q)\nstring(%q)\n", s, rvs[i%len(rvs)]))
		}
		// Small limits, to reach ErrFrameTooLarge.
		write("FuzzReader"+name, len(seeds), fmt.Sprintf("[]byte(%q)\nuint16(%d)\nuint16(%d)\n", seeds[0], 5, 100))
		if f == JSON {
			// The scanner alone: each seed cut at block edges and at random.
			for i, s := range seeds {
				write("FuzzJSONScan", i, fmt.Sprintf("[]byte(%q)\n[]byte(%q)\n", s, []byte{1, 62, 1, 1, 63, byte(i * 37)}))
			}
		}
	}
}
