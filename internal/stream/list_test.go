package stream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/fxamacker/cbor/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor/direct"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	restclientwatch "k8s.io/client-go/rest/watch"

	"github.com/watchsan/watchsan/internal/testutil"
)

// The list codecs against apimachinery: frames made of the captured streams' objects are the
// apiserver's (protobuf: byte for byte; CBOR and JSON: decode with client-go as the captured
// ones do), lists encoded by apimachinery decode into their items, and every parser of the
// network bytes is fuzzed (FuzzJSONList, FuzzProtobufList, FuzzCBORList).

// clientDecode decodes one watch frame in media type mt as client-go does.
func clientDecode(t *testing.T, mt string, frame []byte) (string, runtime.Object) {
	t.Helper()
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), mt)
	if !ok {
		t.Fatalf("no %s serializer", mt)
	}
	dec := restclientwatch.NewDecoder(streaming.NewDecoder(info.StreamSerializer.Framer.NewFrameReader(io.NopCloser(bytes.NewReader(frame))), info.StreamSerializer.Serializer),
		codecs.UniversalDeserializer())
	typ, obj, err := dec.Decode()
	if err != nil {
		t.Fatalf("client-go cannot decode %q: %v", frame, err)
	}
	return string(typ), obj
}

// capturedFrames is every frame of the streams captured from a real apiserver in format
// (testdata/captured), by file.
func capturedFrames(t testing.TB, format Format) map[string][][]byte {
	t.Helper()
	ext := map[Format]string{JSON: "json", Protobuf: "pb", CBOR: "cbor"}[format]
	files, err := filepath.Glob(filepath.Join("testdata", "captured", "*."+ext))
	if err != nil || len(files) == 0 {
		t.Fatalf("no captured %s streams (%v)", format, err)
	}
	out := map[string][][]byte{}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		rd := NewReader(format, bytes.NewReader(b), 1<<20)
		for {
			ev, err := rd.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			out[filepath.Base(name)] = append(out[filepath.Base(name)], append([]byte(nil), ev.Raw...))
		}
	}
	return out
}

// listItemJSON is a ConfigMap as a list's item in JSON: without kind and apiVersion.
func listItemJSON(name, uid, rv string) string {
	return fmt.Sprintf(`{"metadata":{"name":%q,"namespace":"d","uid":%q,"resourceVersion":%q},"data":{"v":%q}}`, name, uid, rv, rv)
}

// writeConfigMapList answers a ConfigMapList in format as apimachinery encodes it; items are
// JSON ConfigMaps (listItemJSON).
func writeConfigMapList(w http.ResponseWriter, format Format, rv, cont string, items []string) {
	ct := map[Format]string{JSON: testutil.JSON, Protobuf: testutil.Protobuf, CBOR: testutil.CBOR}[format]
	testutil.WriteConfigMapList(w, ct, rv, cont, items)
}

// The frames made of an object's message are the apiserver's byte for byte: every event of
// the captured streams, its object's message taken out and wrapped again (as a list item is),
// is the captured frame; a delete made of a captured frame is that frame but for its type; the
// bookmark of a ConfigMap (a kind without spec or status) is the apiserver's.
func TestProtobufListFramesAreTheApiserversBytes(t *testing.T) {
	c := protobufList{}
	n := 0
	for file, frames := range capturedFrames(t, Protobuf) {
		for i, frame := range frames {
			var ev metav1.WatchEvent
			if err := ev.Unmarshal(frame[4:]); err != nil {
				t.Fatal(err)
			}
			obj, err := c.ObjectOf(frame)
			if err != nil {
				t.Fatalf("%s frame %d: %v", file, i, err)
			}
			var u runtime.Unknown
			if err := u.Unmarshal(obj[4:]); err != nil {
				t.Fatal(err)
			}
			if got := c.Frame(ev.Type, protoObject(u.APIVersion, u.Kind, u.Raw)); !bytes.Equal(got, frame) {
				t.Fatalf("%s frame %d (%s): made of its object's message\n%q\nwant\n%q", file, i, ev.Type, got, frame)
			}
			if ev.Type != Bookmark && ev.Type != Error {
				key, it, err := c.Item(u.Kind, u.APIVersion, u.Raw)
				rd, _ := NewReader(Protobuf, bytes.NewReader(frame), 1<<20).Next()
				if err != nil || key != rd.Namespace+"/"+rd.Name || it.UID != rd.UID || it.RV != rd.RVInt {
					t.Fatalf("%s frame %d: item %q %+v %v, want the reader's %s/%s %s %d", file, i, key, it, err, rd.Namespace, rd.Name, rd.UID, rd.RVInt)
				}
				del := c.Frame(Deleted, obj)
				var dev metav1.WatchEvent
				if err := dev.Unmarshal(del[4:]); err != nil || dev.Type != Deleted || !bytes.Equal(dev.Object.Raw, obj) {
					t.Fatalf("%s frame %d: a delete of it is %q (%v)", file, i, dev.Type, err)
				}
			}
			if ev.Type == Bookmark && u.Kind == "ConfigMap" && !bytes.Contains(frame, []byte(InitialEventsEndAnnotation)) {
				rd, _ := NewReader(Protobuf, bytes.NewReader(frame), 1<<20).Next()
				if got := c.Frame(Bookmark, c.Bookmark(u.Kind, u.APIVersion, rd.RV)); !bytes.Equal(got, frame) {
					t.Fatalf("%s frame %d: the bookmark at %s\n%q\nwant the apiserver's\n%q", file, i, rd.RV, got, frame)
				}
				n++
			}
		}
	}
	if n == 0 {
		t.Fatal("no ConfigMap bookmark in the captured streams")
	}
}

// A bookmark of a kind with a spec (a Deployment) decodes, with client-go's decoder, into the
// typed object at its resourceVersion, as the apiserver's does; in every format.
func TestListBookmarkDecodesTyped(t *testing.T) {
	for _, format := range []Format{JSON, Protobuf, CBOR} {
		c := ListCodecFor(format)
		b := c.Frame(Bookmark, c.Bookmark("Deployment", "apps/v1", "2258"))
		typ, obj := clientDecode(t, mediaType(format), b)
		d, ok := obj.(*appsv1.Deployment)
		if typ != Bookmark || !ok || d.ResourceVersion != "2258" {
			t.Fatalf("%s: decoded %s %T %+v, want a BOOKMARK of a *v1.Deployment at 2258", format, typ, obj, obj)
		}
	}
}

// A list as apimachinery encodes it decodes into its kind, resourceVersion, continue token and
// each item as the apiserver encoded it, which Item makes an object keyed, uid and
// resourceVersion as the JSON says, with its kind and apiVersion; bytes that are no list are
// refused.
func TestListDecodes(t *testing.T) {
	items := []string{listItemJSON("a", "ua", "14"), listItemJSON("c", "uc", "20")}
	for _, format := range []Format{JSON, Protobuf, CBOR} {
		c := ListCodecFor(format)
		rec := httptest.NewRecorder()
		writeConfigMapList(rec, format, "21", "page-1", items)
		if got, _ := FormatOf(c.Accept()); got != format {
			t.Fatalf("%s: answered %q, Accept %q", format, rec.Header().Get("Content-Type"), c.Accept())
		}
		p, err := c.DecodeList(rec.Body.Bytes())
		if err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		if p.Kind != "ConfigMapList" || p.APIVersion != "v1" || p.ResourceVersion != "21" || p.Continue != "page-1" || len(p.Items) != 2 {
			t.Fatalf("%s: decoded %+v", format, p)
		}
		for i, it := range items {
			var cm corev1.ConfigMap
			if err := json.Unmarshal([]byte(it), &cm); err != nil {
				t.Fatal(err)
			}
			if format == Protobuf {
				want, _ := cm.Marshal()
				if !bytes.Equal(p.Items[i], want) {
					t.Fatalf("item %d: %q, want %q", i, p.Items[i], want)
				}
			}
			key, li, err := c.Item("ConfigMap", "v1", p.Items[i])
			if err != nil || key != "d/"+cm.Name || li.UID != string(cm.UID) || fmt.Sprint(li.RV) != cm.ResourceVersion {
				t.Fatalf("%s item %d: %q %+v %v", format, i, key, li, err)
			}
			typ, obj := clientDecode(t, mediaType(format), c.Frame(Modified, li.Object))
			got, ok := obj.(*corev1.ConfigMap)
			if typ != Modified || !ok || got.Name != cm.Name || got.Data["v"] != cm.Data["v"] || got.ResourceVersion != cm.ResourceVersion {
				t.Fatalf("%s item %d: its frame decodes to %s %+v", format, i, typ, obj)
			}
		}
		for _, bad := range [][]byte{nil, []byte("k8s"), []byte("k8s\x00\xff"), []byte("{"), append([]byte("k8s\x00\x12\x03"), 0x0a, 0x01), {0xd9, 0xd9, 0xf7, 0xff}} {
			if _, err := c.DecodeList(bad); err == nil {
				t.Fatalf("%s: decoded %q without an error", format, bad)
			}
		}
	}
}

// A list cut short anywhere never decodes as a shorter list: every prefix of a list's body is
// refused, or (protobuf, whose envelope may end after its raw field: the empty content fields
// that follow carry nothing) decodes as the whole list. A client's own list is kept as the
// state at its resourceVersion when its body decodes (docs/design.md section 12), whether or
// not the client stayed to the end: this is what makes that exact.
func TestListCutShortNeverDecodesShorter(t *testing.T) {
	items := []string{listItemJSON("a", "ua", "14"), listItemJSON("c", "uc", "20"), listItemJSON("e", "ue", "21")}
	type list struct {
		name string
		c    ListCodec
		body []byte
	}
	lists := []list{{"table", ListCodecForAccept(JSON, "application/json;as=Table;v=v1;g=meta.k8s.io"), []byte(tableListBody)}}
	for _, format := range []Format{JSON, Protobuf, CBOR} {
		rec := httptest.NewRecorder()
		writeConfigMapList(rec, format, "21", "", items)
		lists = append(lists, list{format.String(), ListCodecFor(format), rec.Body.Bytes()})
	}
	for _, l := range lists {
		c, body, format := l.c, l.body, l.name
		whole, err := c.DecodeList(body)
		if err != nil {
			t.Fatalf("%s: the whole list: %v", format, err)
		}
		for n := range len(body) {
			p, err := c.DecodeList(body[:n])
			if err != nil {
				continue
			}
			if p.ResourceVersion != whole.ResourceVersion || len(p.Items) != len(whole.Items) {
				t.Fatalf("%s: the first %d of %d bytes decode as a list at %q of %d items", format, n, len(body), p.ResourceVersion, len(p.Items))
			}
			for i := range p.Items {
				if !bytes.Equal(p.Items[i], whole.Items[i]) {
					t.Fatalf("%s: the first %d of %d bytes decode item %d as %q, want %q", format, n, len(body), i, p.Items[i], whole.Items[i])
				}
			}
		}
	}
}

// A frame made of a captured event's object (the apiserver orders a map's keys at random, so
// the bytes may differ in order only) decodes as client-go decodes the captured one, and the
// Reader reads the same fields from it; an object with its kind and apiVersion taken out (a
// list's item) is given them back; the bookmark decodes into the kind at its resourceVersion.
func TestCBORListFramesDecodeAsTheApiservers(t *testing.T) {
	c := cborList{}
	n := 0
	for file, frames := range capturedFrames(t, CBOR) {
		for i, frame := range frames {
			obj, err := c.ObjectOf(frame)
			if err != nil {
				t.Fatalf("%s frame %d: %v", file, i, err)
			}
			wantTyp, want := clientDecode(t, "application/cbor", frame)
			mine := c.Frame(wantTyp, obj)
			typ, got := clientDecode(t, "application/cbor", mine)
			if typ != wantTyp || !reflect.DeepEqual(got, want) {
				t.Fatalf("%s frame %d: made of its object decodes to %s %+v, want %s %+v", file, i, typ, got, wantTyp, want)
			}
			gvk := want.GetObjectKind().GroupVersionKind()
			if wantTyp != Bookmark && wantTyp != Error {
				// As a list's item: without its kind and apiVersion, given them back.
				var top map[string]cbor.RawMessage
				if err := direct.Unmarshal(bytes.TrimPrefix(obj, cborTagHead), &top); err != nil {
					t.Fatal(err)
				}
				delete(top, "kind")
				delete(top, "apiVersion")
				item, err := direct.Marshal(top)
				if err != nil {
					t.Fatal(err)
				}
				_, it, err := c.Item(gvk.Kind, gvk.GroupVersion().String(), item)
				if err != nil {
					t.Fatalf("%s frame %d as an item: %v", file, i, err)
				}
				if typ, got := clientDecode(t, "application/cbor", c.Frame(wantTyp, it.Object)); typ != wantTyp || !reflect.DeepEqual(got, want) {
					t.Fatalf("%s frame %d: made of it as a list's item decodes to %s %+v, want %s %+v", file, i, typ, got, wantTyp, want)
				}
			}
			rw, _ := NewReader(CBOR, bytes.NewReader(frame), 1<<20).Next()
			rm, _ := NewReader(CBOR, bytes.NewReader(mine), 1<<20).Next()
			if rw.Name != rm.Name || rw.Namespace != rm.Namespace || rw.UID != rm.UID || rw.RV != rm.RV || rw.Type != rm.Type {
				t.Fatalf("%s frame %d: read as %+v, the captured as %+v", file, i, rm, rw)
			}
			if wantTyp == Bookmark && !rw.InitialEventsEnd {
				btyp, bm := clientDecode(t, "application/cbor", c.Frame(Bookmark, c.Bookmark(gvk.Kind, gvk.GroupVersion().String(), rw.RV)))
				if btyp != Bookmark || reflect.TypeOf(bm) != reflect.TypeOf(want) || objectRV(t, bm) != rw.RV {
					t.Fatalf("%s frame %d: the bookmark decodes to %s %T at %s, want %T at %s", file, i, btyp, bm, objectRV(t, bm), want, rw.RV)
				}
				n++
			}
		}
	}
	if n == 0 {
		t.Fatal("no bookmark in the captured streams")
	}
}

// A JSON frame made of a captured event's object is the captured frame's event: client-go
// decodes both alike and the Reader reads the same fields.
func TestJSONListFramesDecodeAsTheApiservers(t *testing.T) {
	c := jsonList{}
	for file, frames := range capturedFrames(t, JSON) {
		for i, frame := range frames {
			obj, err := c.ObjectOf(frame)
			if err != nil {
				t.Fatalf("%s frame %d: %v", file, i, err)
			}
			wantTyp, want := clientDecode(t, "application/json", frame)
			mine := c.Frame(wantTyp, obj)
			if typ, got := clientDecode(t, "application/json", mine); typ != wantTyp || !reflect.DeepEqual(got, want) {
				t.Fatalf("%s frame %d: made of its object decodes to %s %+v, want %s %+v", file, i, typ, got, wantTyp, want)
			}
			rw, _ := NewReader(JSON, bytes.NewReader(frame), 1<<20).Next()
			rm, err := NewReader(JSON, bytes.NewReader(mine), 1<<20).Next()
			if err != nil || rw.Name != rm.Name || rw.Namespace != rm.Namespace || rw.UID != rm.UID || rw.RV != rm.RV || rw.Type != rm.Type {
				t.Fatalf("%s frame %d: read as %+v (%v), the captured as %+v", file, i, rm, err, rw)
			}
		}
	}
}

func objectRV(t *testing.T, obj runtime.Object) string {
	t.Helper()
	m, ok := obj.(interface{ GetResourceVersion() string })
	if !ok {
		t.Fatalf("%T has no resourceVersion", obj)
	}
	return m.GetResourceVersion()
}

// FuzzJSONList, FuzzProtobufList and FuzzCBORList: decoding a list response and making watch
// events of its items never panics on any bytes, nor does taking the object of a frame; what
// decodes makes frames the Reader reads back to the same identity, whose object is the item's.
func FuzzJSONList(f *testing.F)     { fuzzList(f, JSON) }
func FuzzProtobufList(f *testing.F) { fuzzList(f, Protobuf) }
func FuzzCBORList(f *testing.F)     { fuzzList(f, CBOR) }

func fuzzList(f *testing.F, format Format) {
	c := ListCodecFor(format)
	f.Fuzz(func(t *testing.T, body []byte) {
		_, _ = c.ObjectOf(body)
		p, err := c.DecodeList(body)
		if err != nil {
			return
		}
		kind := strings.TrimSuffix(p.Kind, "List")
		_ = c.Bookmark(kind, p.APIVersion, p.ResourceVersion)
		for _, raw := range p.Items {
			key, it, err := c.Item(kind, p.APIVersion, raw)
			if err != nil {
				continue
			}
			frame := c.Frame(Modified, it.Object)
			ev, err := NewReader(format, bytes.NewReader(frame), len(frame)).Next()
			if err != nil || ev.Namespace+"/"+ev.Name != key || ev.UID != it.UID || ev.RVInt != it.RV {
				t.Fatalf("an item read as %q %+v reads back as %+v (%v)", key, it, ev, err)
			}
			obj, err := c.ObjectOf(frame)
			if err != nil || !bytes.Equal(obj, it.Object) {
				t.Fatalf("the object of a frame made of %q is %q (%v)", it.Object, obj, err)
			}
		}
	})
}

// TestWriteListFuzzSeeds writes the seed corpora of FuzzJSONList, FuzzProtobufList and
// FuzzCBORList (testdata/fuzz): lists as apimachinery encodes them, and captured watch frames.
// It only runs when asked to:
// WATCHSAN_WRITE_FUZZ_SEEDS=1 go test -run TestWriteListFuzzSeeds ./internal/stream/
func TestWriteListFuzzSeeds(t *testing.T) {
	if os.Getenv("WATCHSAN_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set WATCHSAN_WRITE_FUZZ_SEEDS=1 to regenerate testdata/fuzz")
	}
	for target, format := range map[string]Format{"FuzzJSONList": JSON, "FuzzProtobufList": Protobuf, "FuzzCBORList": CBOR} {
		var seeds [][]byte
		for _, items := range [][]string{nil, {listItemJSON("a", "ua", "14")}, {listItemJSON("a", "ua", "14"), listItemJSON("b", "", "x"), `{"metadata":{"namespace":"n"}}`}} {
			rec := httptest.NewRecorder()
			writeConfigMapList(rec, format, "21", "c", items)
			seeds = append(seeds, rec.Body.Bytes())
		}
		for _, frames := range capturedFrames(t, format) {
			seeds = append(seeds, frames[0], frames[len(frames)-1])
		}
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seeds {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
