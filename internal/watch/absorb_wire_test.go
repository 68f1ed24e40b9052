package watch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	cborserializer "k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"

	"github.com/watchsan/watchsan/internal/stream"
	"github.com/watchsan/watchsan/internal/testutil"
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
		if stream.ListCodecFor(format) == nil {
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
	ct := map[stream.Format]string{0: testutil.JSON, stream.JSON: testutil.JSON, stream.Protobuf: testutil.Protobuf, stream.CBOR: testutil.CBOR}[format]
	testutil.WriteConfigMapList(w, ct, rv, cont, items)
}

// watchUntilIn is watchUntil with the watch asked and read in format, by client-go's own
// decoders (the typed clientset's for protobuf): every event must decode into the typed
// object of its kind (a ConfigMap, a Status for an ERROR).
func (f *fixture) watchUntilIn(t *testing.T, format stream.Format, query string, n int) []seenEvent {
	t.Helper()
	if format == stream.JSON {
		return f.watchUntil(t, query, n)
	}
	mt := map[stream.Format]string{stream.Protobuf: "application/vnd.kubernetes.protobuf", stream.CBOR: "application/cbor"}[format]
	resp := f.openWatch(t, query, mt+", application/json")
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
