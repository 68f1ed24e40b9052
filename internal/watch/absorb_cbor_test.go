package watch

import (
	"bytes"
	"io"
	"reflect"
	"testing"

	"github.com/fxamacker/cbor/v2"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor/direct"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	restclientwatch "k8s.io/client-go/rest/watch"

	"github.com/watchsan/watchsan/internal/stream"
)

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
	for file, frames := range capturedFrames(t, stream.CBOR) {
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
			if wantTyp != stream.Bookmark && wantTyp != stream.Error {
				// As a list's item: without its kind and apiVersion, given them back.
				var top map[string]cbor.RawMessage
				if err := direct.Unmarshal(bytes.TrimPrefix(obj, cborSelfDescribed), &top); err != nil {
					t.Fatal(err)
				}
				gvk := want.GetObjectKind().GroupVersionKind()
				delete(top, "kind")
				delete(top, "apiVersion")
				item, err := direct.Marshal(top)
				if err != nil {
					t.Fatal(err)
				}
				_, it, err := c.item(&listed{kind: gvk.Kind, apiVersion: gvk.GroupVersion().String()}, item)
				if err != nil {
					t.Fatalf("%s frame %d as an item: %v", file, i, err)
				}
				if typ, got := cborDecode(t, c.frame(wantTyp, it.obj)); typ != wantTyp || !reflect.DeepEqual(got, want) {
					t.Fatalf("%s frame %d: made of it as a list's item decodes to %s %+v, want %s %+v", file, i, typ, got, wantTyp, want)
				}
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

func ioNopCloser(b []byte) io.ReadCloser { return io.NopCloser(bytes.NewReader(b)) }
