package stream

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
)

// The oracle tests hold every reader to apimachinery's decoders: on streams encoded as the
// apiserver encodes them, and on streams captured from a real apiserver when present under
// testdata/captured/<name>.<json|pb|cbor> (a watch response body, as received).

// oracleCase is one stream to check.
type oracleCase struct {
	name   string
	format Format
	stream []byte
}

func oracleCases(t *testing.T) []oracleCase {
	var cases []oracleCase
	for _, f := range formats {
		cases = append(cases, oracleCase{"encoded-" + f.String(), f, apiStream(t, f, sampleEvents(), false)})
		if f == CBOR {
			// Map keys in random order, as an apiserver with CBORServingAndStorage writes.
			for i := range 3 {
				cases = append(cases, oracleCase{fmt.Sprintf("encoded-cbor-shuffled-%d", i), f, apiStream(t, f, sampleEvents(), true)})
			}
		}
	}
	return append(cases, capturedCases(t)...)
}

// capturedCases loads testdata/captured/**/*.{json,pb,cbor}.
func capturedCases(t *testing.T) []oracleCase {
	exts := map[string]Format{".json": JSON, ".pb": Protobuf, ".cbor": CBOR}
	root := filepath.Join("testdata", "captured")
	var cases []oracleCase
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		f, ok := exts[filepath.Ext(p)]
		if d.IsDir() || !ok {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		cases = append(cases, oracleCase{"captured-" + filepath.ToSlash(rel), f, b})
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Log("no captured streams under testdata/captured; checking encoded streams only")
	}
	return cases
}

func TestOracleFields(t *testing.T) {
	for _, c := range oracleCases(t) {
		t.Run(c.name, func(t *testing.T) {
			want, err := decodeOracle(t, c.format, c.stream)
			if err != nil {
				t.Fatalf("oracle cannot decode the stream: %v", err)
			}
			if len(want) == 0 {
				t.Fatal("empty stream")
			}
			readers := map[string]func() io.Reader{
				"whole":    func() io.Reader { return bytes.NewReader(c.stream) },
				"one-byte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(c.stream)) },
				"half":     func() io.Reader { return iotest.HalfReader(bytes.NewReader(c.stream)) },
				"data-eof": func() io.Reader { return iotest.DataErrReader(bytes.NewReader(c.stream)) },
			}
			for seed := range uint64(20) {
				readers[fmt.Sprintf("split-%d", seed)] = func() io.Reader { return newSplitReader(c.stream, seed, 1+int(seed)*97) }
			}
			for rname, mk := range readers {
				got, err := readAll(c.format, mk(), 0)
				if err != nil {
					t.Fatalf("%s: read: %v", rname, err)
				}
				if len(got) != len(want) {
					t.Fatalf("%s: read %d events, oracle %d", rname, len(got), len(want))
				}
				var joined []byte
				for i := range got {
					exp := expected(t, want[i])
					if err := sameFields(got[i], &exp); err != nil {
						t.Fatalf("%s: event %d: %v", rname, i, err)
					}
					joined = append(joined, got[i].Raw...)
					if c.format == JSON && !bytes.HasSuffix(got[i].Raw, []byte("\n")) {
						// The newline had not arrived when the value was complete.
						joined = append(joined, '\n')
					}
				}
				// Raw frames are the stream, cut at event boundaries.
				if !bytes.Equal(joined, c.stream) {
					t.Fatalf("%s: raw frames do not add up to the stream", rname)
				}
			}
		})
	}
}

// TestOracleWrite: writing every event unchanged reproduces the stream byte for byte, even when
// it was read a byte at a time (so JSON newlines arrived apart from their values).
func TestOracleWrite(t *testing.T) {
	for _, c := range oracleCases(t) {
		t.Run(c.name, func(t *testing.T) {
			for _, src := range []io.Reader{bytes.NewReader(c.stream), iotest.OneByteReader(bytes.NewReader(c.stream))} {
				var out bytes.Buffer
				rd, w := NewReader(c.format, src, 0), NewWriter(c.format, &out)
				for {
					ev, err := rd.Next()
					if err == io.EOF {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					if err := w.Write(ev); err != nil {
						t.Fatal(err)
					}
				}
				if !bytes.Equal(out.Bytes(), c.stream) {
					t.Fatalf("written stream differs from the input (%d vs %d bytes)", out.Len(), len(c.stream))
				}
			}
		})
	}
}

// TestOracleRewrite: each event with a resourceVersion, rewritten to several new values,
// decodes with apimachinery to the same object but for its resourceVersion.
func TestOracleRewrite(t *testing.T) {
	newRVs := []string{"1", "7", "123456789012345678", "18446744073709551615", "", "x\"y\\z\n\u00e9",
		strings.Repeat("9", 200), strings.Repeat("8", 70000)}
	for _, c := range oracleCases(t) {
		t.Run(c.name, func(t *testing.T) {
			orig, err := decodeOracle(t, c.format, c.stream)
			if err != nil {
				t.Fatal(err)
			}
			evs, err := readAll(c.format, bytes.NewReader(c.stream), 0)
			if err != nil {
				t.Fatal(err)
			}
			rewritten := 0
			for i, ev := range evs {
				exp := expected(t, orig[i])
				if !ev.CanRewriteRV() {
					if exp.RV != "" {
						t.Fatalf("event %d has RV %q but cannot be rewritten", i, exp.RV)
					}
					var out bytes.Buffer
					err := NewWriter(c.format, &out).WriteWithRV(ev, "5")
					if !errors.Is(err, ErrMalformed) || out.Len() != 0 {
						t.Fatalf("event %d without RV: WriteWithRV = %v, wrote %d bytes", i, err, out.Len())
					}
					continue
				}
				for _, rv := range newRVs {
					var out bytes.Buffer
					if err := NewWriter(c.format, &out).WriteWithRV(ev, rv); err != nil {
						t.Fatalf("event %d rv %.20q: %v", i, rv, err)
					}
					got, err := decodeOracle(t, c.format, out.Bytes())
					if err != nil || len(got) != 1 {
						t.Fatalf("event %d rv %.20q: oracle decode of the rewrite: %d events, %v", i, rv, len(got), err)
					}
					if got[0].Type != orig[i].Type {
						t.Fatalf("event %d: type %s became %s", i, orig[i].Type, got[0].Type)
					}
					if gotRV := rvOf(t, got[0]); gotRV != rv {
						t.Fatalf("event %d: rewritten RV decodes as %.20q, want %.20q", i, gotRV, rv)
					}
					// Everything else equal: put the old RV back and compare.
					setRV(t, got[0], exp.RV)
					if !equality.Semantic.DeepEqual(got[0].Obj, orig[i].Obj) {
						t.Fatalf("event %d rv %.20q: object changed beyond its RV:\n got  %#v\n want %#v", i, rv, got[0].Obj, orig[i].Obj)
					}
					// And our own reader agrees.
					again, err := readAll(c.format, bytes.NewReader(out.Bytes()), 1<<20)
					if err != nil || len(again) != 1 {
						t.Fatalf("event %d: re-read: %d events, %v", i, len(again), err)
					}
					want := *ev
					want.SetRV(rv)
					if err := sameFields(again[0], &want); err != nil {
						t.Fatalf("event %d: re-read: %v", i, err)
					}
					if c.format == JSON && !jsonRestEqual(ev, again[0]) {
						t.Fatalf("event %d: bytes beside the RV changed", i)
					}
				}
				rewritten++
			}
			if rewritten == 0 && !strings.HasPrefix(c.name, "captured-") {
				t.Fatal("nothing rewritten")
			}
		})
	}
}

func rvOf(t *testing.T, oe oracleEvent) string {
	if acc, err := meta.Accessor(oe.Obj); err == nil {
		return acc.GetResourceVersion()
	}
	lacc, err := meta.ListAccessor(oe.Obj)
	if err != nil {
		t.Fatal(err)
	}
	return lacc.GetResourceVersion()
}

func setRV(t *testing.T, oe oracleEvent, rv string) {
	if acc, err := meta.Accessor(oe.Obj); err == nil {
		acc.SetResourceVersion(rv)
		return
	}
	lacc, err := meta.ListAccessor(oe.Obj)
	if err != nil {
		t.Fatal(err)
	}
	lacc.SetResourceVersion(rv)
}

// jsonRestEqual: the bytes of a and b outside their RV tokens are identical.
func jsonRestEqual(a, b *Event) bool {
	ra, rb := a.Raw, b.Raw
	return bytes.Equal(ra[:a.rv.start], rb[:b.rv.start]) &&
		bytes.Equal(bytes.TrimSuffix(ra[a.rv.end:], []byte("\n")), bytes.TrimSuffix(rb[b.rv.end:], []byte("\n")))
}

// TestEncodeEventMatchesAPIServer: EncodeEvent writes the same bytes as the apiserver's
// encoding path (deterministic encoders).
func TestEncodeEventMatchesAPIServer(t *testing.T) {
	for _, f := range formats {
		for i, e := range sampleEvents() {
			want := apiStream(t, f, []testEvent{e}, false)
			got, err := EncodeEvent(f, string(e.typ), withKind(e.obj.DeepCopyObject()))
			if err != nil {
				t.Fatalf("%s event %d: %v", f, i, err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s event %d: EncodeEvent differs from the apiserver's encoding:\n got  %q\n want %q", f, i, got, want)
			}
		}
	}
}
