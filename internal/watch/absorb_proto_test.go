package watch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	cborserializer "k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"

	"github.com/watchsan/watchsan/internal/stream"
)

// The absorb tests run in each format absorbing reads (absorbFormats): their fixtures are
// written in JSON (absorb_test.go) and put on the wire in the test's format by the scripted
// apiserver (gapUpstream.format), as the apiserver would encode the same objects; the client
// reads its watch with client-go's decoders in that format (watchUntilIn).

var absorbFormats = []stream.Format{stream.JSON, stream.Protobuf, stream.CBOR}

// cborCodecs are client-go's codecs with CBOR, which client-go's scheme leaves out unless its
// feature gate is on.
var cborCodecs = serializer.NewCodecFactory(scheme.Scheme, serializer.WithSerializer(cborserializer.NewSerializerInfo))

// forFormats runs test once per format absorbing reads, as subtests named by it.
func forFormats(t *testing.T, test func(t *testing.T, format stream.Format)) {
	for _, format := range absorbFormats {
		if absorbCodecFor(format) == nil {
			continue
		}
		t.Run(format.String(), func(t *testing.T) { test(t, format) })
	}
}

// decodeJSONObject decodes a JSON object of a kind client-go's scheme knows, kind set.
func decodeJSONObject(raw []byte) (runtime.Object, error) {
	obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(raw, nil, nil)
	if err != nil {
		return nil, err
	}
	obj.GetObjectKind().SetGroupVersionKind(*gvk)
	return obj, nil
}

// wireFrames is a JSON watch response body (events, one a line) in format, as the apiserver
// encodes the same events (stream.EncodeEvent).
func wireFrames(format stream.Format, body []byte) ([]byte, error) {
	var out []byte
	for _, line := range bytes.Split(body, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var ev metav1.WatchEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			return nil, err
		}
		obj, err := decodeJSONObject(ev.Object.Raw)
		if err != nil {
			return nil, err
		}
		frame, err := stream.EncodeEvent(format, ev.Type, obj)
		if err != nil {
			return nil, err
		}
		out = append(out, frame...)
	}
	return out, nil
}

// wireWatchWriter puts what a scripted watch writes in JSON on the wire in format, whole
// lines at a time; a response that is not 200 is passed as written.
type wireWatchWriter struct {
	http.ResponseWriter
	format  stream.Format
	status  int
	pending []byte
}

func (w *wireWatchWriter) WriteHeader(code int) {
	w.status = code
	if code == http.StatusOK {
		w.Header().Set("Content-Type", w.format.ContentType())
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *wireWatchWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.status != http.StatusOK {
		return w.ResponseWriter.Write(b)
	}
	w.pending = append(w.pending, b...)
	i := bytes.LastIndexByte(w.pending, '\n')
	if i < 0 {
		return len(b), nil
	}
	frames, err := wireFrames(w.format, w.pending[:i+1])
	if err != nil {
		panic(fmt.Sprintf("test fixture not encodable in %s: %v", w.format, err))
	}
	w.pending = append(w.pending[:0], w.pending[i+1:]...)
	if _, err := w.ResponseWriter.Write(frames); err != nil {
		return 0, err
	}
	return len(b), nil
}

func (w *wireWatchWriter) Flush() { w.ResponseWriter.(http.Flusher).Flush() }

// writeList answers a list in format: items are the JSON fixtures (cmItem), of a ConfigMapList.
func writeList(w http.ResponseWriter, format stream.Format, rv, cont string, items []string) {
	if format == stream.JSON || format == 0 {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":%q,"continue":%q},"items":[%s]}`,
			rv, cont, strings.Join(items, ","))
		return
	}
	l := &corev1.ConfigMapList{TypeMeta: metav1.TypeMeta{Kind: "ConfigMapList", APIVersion: "v1"},
		ListMeta: metav1.ListMeta{ResourceVersion: rv, Continue: cont}}
	for _, it := range items {
		var cm corev1.ConfigMap
		if err := json.Unmarshal([]byte(it), &cm); err != nil {
			panic(err)
		}
		l.Items = append(l.Items, cm)
	}
	var buf bytes.Buffer
	var enc runtime.Encoder = protobuf.NewSerializer(nil, nil)
	ct := "application/vnd.kubernetes.protobuf"
	if format == stream.CBOR {
		enc, ct = cborserializer.NewSerializer(nil, nil), "application/cbor"
	}
	if err := enc.Encode(l, &buf); err != nil {
		panic(err)
	}
	w.Header().Set("Content-Type", ct)
	w.Write(buf.Bytes())
}

// watchUntilIn is watchUntil with the watch asked and read in format, by client-go's own
// decoders (the typed clientset's for protobuf): every event must decode into the typed
// object of its kind (a ConfigMap, a Status for an ERROR).
func (f *fixture) watchUntilIn(t *testing.T, format stream.Format, query string, n int) []seenEvent {
	t.Helper()
	if format == stream.JSON {
		return f.watchUntil(t, query, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/api/v1/namespaces/d/configmaps?watch=true&"+query, nil)
	mt := map[stream.Format]string{stream.Protobuf: "application/vnd.kubernetes.protobuf", stream.CBOR: "application/cbor"}[format]
	req.Header.Set("Accept", mt+", application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != format.ContentType() {
		t.Fatalf("the watch answered %q, want %q", ct, format.ContentType())
	}
	info, ok := runtime.SerializerInfoForMediaType(cborCodecs.SupportedMediaTypes(), mt)
	if !ok {
		t.Fatalf("no %s serializer", mt)
	}
	dec := restclientwatch.NewDecoder(streaming.NewDecoder(info.StreamSerializer.Framer.NewFrameReader(resp.Body), info.StreamSerializer.Serializer),
		cborCodecs.UniversalDeserializer())
	var out []seenEvent
	for len(out) < n {
		typ, obj, err := dec.Decode()
		if err != nil {
			if err != io.EOF {
				t.Logf("stream ended: %v", err)
			}
			break
		}
		if st, ok := obj.(*metav1.Status); ok {
			out = append(out, seenEvent{Type: string(typ), Kind: "Status", Code: st.Code})
			continue
		}
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			t.Fatalf("a %s event decoded into a %T, want a *v1.ConfigMap", typ, obj)
		}
		kind := ""
		if kinds, _, err := scheme.Scheme.ObjectKinds(cm); err == nil && len(kinds) == 1 {
			kind = kinds[0].Kind
		}
		m, _ := meta.Accessor(cm)
		out = append(out, seenEvent{string(typ), m.GetName(), string(m.GetUID()), m.GetResourceVersion(), kind, cm.Data["v"], 0})
	}
	return out
}

// capturedFrames is every frame of the streams captured from a real apiserver in format
// (internal/stream/testdata/captured), by file.
func capturedFrames(t testing.TB, format stream.Format) map[string][][]byte {
	t.Helper()
	ext := map[stream.Format]string{stream.JSON: "json", stream.Protobuf: "pb", stream.CBOR: "cbor"}[format]
	files, err := filepath.Glob("../stream/testdata/captured/*." + ext)
	if err != nil || len(files) == 0 {
		t.Fatalf("no captured %s streams (%v)", format, err)
	}
	out := map[string][][]byte{}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		rd := stream.NewReader(format, bytes.NewReader(b), 1<<20)
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

// The frames absorbing makes of an object's message are the apiserver's byte for byte: every
// event of the captured streams, its object's message taken out and wrapped again (as a list
// item is), is the captured frame; a delete made of a captured frame is that frame but for its
// type; the absorb's bookmark of a ConfigMap (a kind without spec or status) is the
// apiserver's.
func TestProtoFramesAreTheApiserversBytes(t *testing.T) {
	c := protoAbsorb{}
	n := 0
	for file, frames := range capturedFrames(t, stream.Protobuf) {
		for i, frame := range frames {
			var ev metav1.WatchEvent
			if err := ev.Unmarshal(frame[4:]); err != nil {
				t.Fatal(err)
			}
			obj, err := c.objectOf(frame)
			if err != nil {
				t.Fatalf("%s frame %d: %v", file, i, err)
			}
			var u runtime.Unknown
			if err := u.Unmarshal(obj[4:]); err != nil {
				t.Fatal(err)
			}
			l := &listed{kind: u.Kind, apiVersion: u.APIVersion}
			if got := c.frame(ev.Type, protoObject(l.apiVersion, l.kind, u.Raw)); !bytes.Equal(got, frame) {
				t.Fatalf("%s frame %d (%s): made of its object's message\n%q\nwant\n%q", file, i, ev.Type, got, frame)
			}
			if ev.Type != stream.Bookmark && ev.Type != stream.Error {
				key, it, err := c.item(l, u.Raw)
				rd, _ := stream.NewReader(stream.Protobuf, bytes.NewReader(frame), 1<<20).Next()
				if err != nil || key != rd.Namespace+"/"+rd.Name || it.uid != rd.UID || it.rv != rd.RVInt {
					t.Fatalf("%s frame %d: item %q %+v %v, want the reader's %s/%s %s %d", file, i, key, it, err, rd.Namespace, rd.Name, rd.UID, rd.RVInt)
				}
				del := c.frame(stream.Deleted, obj)
				var dev metav1.WatchEvent
				if err := dev.Unmarshal(del[4:]); err != nil || dev.Type != stream.Deleted || !bytes.Equal(dev.Object.Raw, obj) {
					t.Fatalf("%s frame %d: a delete of it is %q (%v)", file, i, dev.Type, err)
				}
			}
			if ev.Type == stream.Bookmark && u.Kind == "ConfigMap" && !bytes.Contains(frame, []byte(stream.InitialEventsEndAnnotation)) {
				rd, _ := stream.NewReader(stream.Protobuf, bytes.NewReader(frame), 1<<20).Next()
				if got := c.frame(stream.Bookmark, c.bookmark(l, rd.RV)); !bytes.Equal(got, frame) {
					t.Fatalf("%s frame %d: the absorb's bookmark at %s\n%q\nwant the apiserver's\n%q", file, i, rd.RV, got, frame)
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
// typed object at its resourceVersion, as the apiserver's does.
func TestProtoBookmarkDecodesTyped(t *testing.T) {
	c := protoAbsorb{}
	b := c.frame(stream.Bookmark, c.bookmark(&listed{kind: "Deployment", apiVersion: "apps/v1"}, "2258"))
	info, _ := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), "application/vnd.kubernetes.protobuf")
	dec := restclientwatch.NewDecoder(streaming.NewDecoder(info.StreamSerializer.Framer.NewFrameReader(io.NopCloser(bytes.NewReader(b))), info.StreamSerializer.Serializer),
		scheme.Codecs.UniversalDeserializer())
	typ, obj, err := dec.Decode()
	if err != nil {
		t.Fatal(err)
	}
	d, ok := obj.(*appsv1.Deployment)
	if typ != stream.Bookmark || !ok || d.ResourceVersion != "2258" {
		t.Fatalf("decoded %s %T %+v, want a BOOKMARK of a *v1.Deployment at 2258", typ, obj, obj)
	}
}

// A protobuf list decodes into its kind, resourceVersion, continue token and each item's
// message as the apiserver encoded it.
func TestProtoListDecodes(t *testing.T) {
	items := []string{cmItem("a", "ua", "14"), cmItem("c", "uc", "20")}
	rec := httptest.NewRecorder()
	writeList(rec, stream.Protobuf, "21", "page-1", items)
	p, err := protoAbsorb{}.decodeList(rec.Body.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if p.kind != "ConfigMapList" || p.apiVersion != "v1" || p.rv != "21" || p.cont != "page-1" || len(p.items) != 2 {
		t.Fatalf("decoded %+v", p)
	}
	for i, it := range items {
		var cm corev1.ConfigMap
		if err := json.Unmarshal([]byte(it), &cm); err != nil {
			t.Fatal(err)
		}
		want, _ := cm.Marshal()
		if !bytes.Equal(p.items[i], want) {
			t.Fatalf("item %d: %q, want %q", i, p.items[i], want)
		}
	}
	for _, bad := range [][]byte{nil, []byte("k8s"), []byte("k8s\x00\xff"), []byte("{}"), append([]byte("k8s\x00\x12\x03"), 0x0a, 0x01)} {
		if _, err := (protoAbsorb{}).decodeList(bad); err == nil {
			t.Fatalf("decoded %q without an error", bad)
		}
	}
}

// FuzzProtoAbsorbList and FuzzCBORAbsorbList: decoding a list response and making watch
// events of its items never panics on any bytes, nor does taking the object of a frame; what
// decodes makes frames the Reader reads back to the same identity, whose object is the item's.
func FuzzProtoAbsorbList(f *testing.F) { fuzzAbsorbList(f, stream.Protobuf) }
func FuzzCBORAbsorbList(f *testing.F)  { fuzzAbsorbList(f, stream.CBOR) }

func fuzzAbsorbList(f *testing.F, format stream.Format) {
	c := absorbCodecFor(format)
	f.Fuzz(func(t *testing.T, body []byte) {
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
			ev, err := stream.NewReader(format, bytes.NewReader(frame), len(frame)).Next()
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

// TestWriteAbsorbFuzzSeeds writes the seed corpora of FuzzProtoAbsorbList and
// FuzzCBORAbsorbList (testdata/fuzz): lists as the apiserver encodes them, and captured watch
// frames. It only runs when asked to:
// WATCHSAN_WRITE_FUZZ_SEEDS=1 go test -run TestWriteAbsorbFuzzSeeds ./internal/watch/
func TestWriteAbsorbFuzzSeeds(t *testing.T) {
	if os.Getenv("WATCHSAN_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set WATCHSAN_WRITE_FUZZ_SEEDS=1 to regenerate testdata/fuzz")
	}
	for target, format := range map[string]stream.Format{"FuzzProtoAbsorbList": stream.Protobuf, "FuzzCBORAbsorbList": stream.CBOR} {
		var seeds [][]byte
		for _, items := range [][]string{nil, {cmItem("a", "ua", "14")}, {cmItem("a", "ua", "14"), cmItem("b", "", "x"), `{"metadata":{"namespace":"n"}}`}} {
			rec := httptest.NewRecorder()
			writeList(rec, format, "21", "c", items)
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
