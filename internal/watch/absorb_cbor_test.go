package watch

import (
	"bytes"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	restclientwatch "k8s.io/client-go/rest/watch"

	"github.com/watchsan/watchsan/internal/stream"
)

// capturedCBOR is every frame of the CBOR streams captured from a real apiserver
// (internal/stream/testdata/captured), by file.
func capturedCBOR(t testing.TB) map[string][][]byte {
	t.Helper()
	files, err := filepath.Glob("../stream/testdata/captured/*.cbor")
	if err != nil || len(files) == 0 {
		t.Fatalf("no captured CBOR streams (%v)", err)
	}
	out := map[string][][]byte{}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		rd := stream.NewReader(stream.CBOR, bytes.NewReader(b), 1<<20)
		for {
			ev, err := rd.Next()
			if err != nil {
				break
			}
			out[filepath.Base(name)] = append(out[filepath.Base(name)], append([]byte(nil), ev.Raw...))
		}
	}
	return out
}

// cborDecode decodes one CBOR watch frame as client-go does.
func cborDecode(t *testing.T, frame []byte) (string, runtime.Object) {
	t.Helper()
	info, ok := runtime.SerializerInfoForMediaType(cborCodecs.SupportedMediaTypes(), "application/cbor")
	if !ok {
		t.Fatal("no CBOR serializer")
	}
	dec := restclientwatch.NewDecoder(streaming.NewDecoder(info.StreamSerializer.Framer.NewFrameReader(ioNopCloser(frame)), info.StreamSerializer.Serializer),
		cborCodecs.UniversalDeserializer())
	typ, obj, err := dec.Decode()
	if err != nil {
		t.Fatalf("client-go cannot decode %q: %v", frame, err)
	}
	return string(typ), obj
}

// A frame made of a captured event's object (the apiserver orders a map's keys at random, so
// the bytes may differ in order only) decodes as client-go decodes the captured one, and the
// Reader reads the same fields from it; an object with its kind and apiVersion taken out (a
// list's item) is given them back; the bookmark decodes into the kind at its resourceVersion.
func TestCBORFramesDecodeAsTheApiservers(t *testing.T) {
	c := cborAbsorb{}
	n := 0
	for file, frames := range capturedCBOR(t) {
		for i, frame := range frames {
			obj, err := c.objectOf(frame)
			if err != nil {
				t.Fatalf("%s frame %d: %v", file, i, err)
			}
			wantTyp, want := cborDecode(t, frame)
			mine := c.frame(wantTyp, obj)
			typ, got := cborDecode(t, mine)
			if typ != wantTyp || !reflect.DeepEqual(got, want) {
				t.Fatalf("%s frame %d: made of its object decodes to %s %+v, want %s %+v", file, i, typ, got, wantTyp, want)
			}
			rw, _ := stream.NewReader(stream.CBOR, bytes.NewReader(frame), 1<<20).Next()
			rm, _ := stream.NewReader(stream.CBOR, bytes.NewReader(mine), 1<<20).Next()
			if rw.Name != rm.Name || rw.Namespace != rm.Namespace || rw.UID != rm.UID || rw.RV != rm.RV || rw.Type != rm.Type {
				t.Fatalf("%s frame %d: read as %+v, the captured as %+v", file, i, rm, rw)
			}
			if wantTyp == stream.Bookmark && !rw.InitialEventsEnd {
				l := &listed{kind: want.GetObjectKind().GroupVersionKind().Kind, apiVersion: want.GetObjectKind().GroupVersionKind().GroupVersion().String()}
				btyp, bm := cborDecode(t, c.frame(stream.Bookmark, c.bookmark(l, rw.RV)))
				if btyp != stream.Bookmark || reflect.TypeOf(bm) != reflect.TypeOf(want) || mustRV(t, bm) != rw.RV {
					t.Fatalf("%s frame %d: the absorb's bookmark decodes to %s %T at %s, want %T at %s", file, i, btyp, bm, mustRV(t, bm), want, rw.RV)
				}
				n++
			}
		}
	}
	if n == 0 {
		t.Fatal("no bookmark in the captured streams")
	}
}

func mustRV(t *testing.T, obj runtime.Object) string {
	t.Helper()
	m, ok := obj.(interface{ GetResourceVersion() string })
	if !ok {
		t.Fatalf("%T has no resourceVersion", obj)
	}
	return m.GetResourceVersion()
}

// FuzzCBORAbsorbList: decoding a CBOR list response and making watch events of its items never
// panics on any bytes; what decodes makes frames the Reader reads back to the same identity.
func FuzzCBORAbsorbList(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte) {
		c := cborAbsorb{}
		_, _ = c.objectOf(body)
		p, err := c.decodeList(body)
		if err != nil {
			return
		}
		l := &listed{kind: strings.TrimSuffix(p.kind, "List"), apiVersion: p.apiVersion}
		_ = c.bookmark(l, p.rv)
		for _, raw := range p.items {
			key, it, err := c.item(l, raw)
			if err != nil {
				continue
			}
			frame := c.frame(stream.Modified, it.obj)
			ev, err := stream.NewReader(stream.CBOR, bytes.NewReader(frame), len(frame)).Next()
			if err != nil || ev.Namespace+"/"+ev.Name != key || ev.UID != it.uid || ev.RVInt != it.rv {
				t.Fatalf("an item read as %q %+v reads back as %+v (%v)", key, it, ev, err)
			}
			obj, err := c.objectOf(frame)
			if err != nil || !bytes.Equal(obj, it.obj) {
				t.Fatalf("the object of a frame made of %q is %q (%v)", it.obj, obj, err)
			}
		}
	})
}

// TestWriteCBORAbsorbFuzzSeeds writes FuzzCBORAbsorbList's seed corpus (testdata/fuzz). It only
// runs when asked to: WATCHSAN_WRITE_FUZZ_SEEDS=1 go test -run TestWriteCBORAbsorbFuzzSeeds ./internal/watch/
func TestWriteCBORAbsorbFuzzSeeds(t *testing.T) {
	if os.Getenv("WATCHSAN_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set WATCHSAN_WRITE_FUZZ_SEEDS=1 to regenerate testdata/fuzz")
	}
	var seeds [][]byte
	for _, items := range [][]string{nil, {cmItem("a", "ua", "14")}, {cmItem("a", "ua", "14"), cmItem("b", "", "x"), `{"metadata":{"namespace":"n"}}`}} {
		rec := httptest.NewRecorder()
		writeList(rec, stream.CBOR, "21", "c", items)
		seeds = append(seeds, rec.Body.Bytes())
	}
	for _, frames := range capturedCBOR(t) {
		seeds = append(seeds, frames[0], frames[len(frames)-1])
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzCBORAbsorbList")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, s := range seeds {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func ioNopCloser(b []byte) io.ReadCloser { return io.NopCloser(bytes.NewReader(b)) }
