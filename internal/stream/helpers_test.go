package stream

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"
)

// The oracle: apimachinery's serializers, configured as a CBOR-enabled apiserver and client-go
// configure them.
var codecs = serializer.NewCodecFactory(scheme.Scheme, serializer.WithSerializer(cbor.NewSerializerInfo))

// mediaType is the serializer media type behind each format.
func mediaType(f Format) string {
	switch f {
	case JSON:
		return runtime.ContentTypeJSON
	case Protobuf:
		return runtime.ContentTypeProtobuf
	case CBOR:
		return runtime.ContentTypeCBOR
	}
	panic("bad format")
}

var formats = []Format{JSON, Protobuf, CBOR}

func serializerInfo(t testing.TB, f Format) runtime.SerializerInfo {
	t.Helper()
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), mediaType(f))
	if !ok || info.StreamSerializer == nil {
		t.Fatalf("no stream serializer for %s", f)
	}
	return info
}

// apiEncoder writes watch events the way the apiserver's watch handler does
// (k8s.io/apiserver/pkg/endpoints/handlers: watchEncoder.doEncode): the object with the
// versioning encoder of the regular serializer, wrapped in a metav1.WatchEvent written with the
// stream serializer through the format's framer.
type apiEncoder struct {
	embedded, event runtime.Encoder
	frame           io.Writer
	buf             bytes.Buffer
}

// newAPIEncoder: nondeterministic selects the map-order-shuffling CBOR encoding that an
// apiserver with CBORServingAndStorage uses.
func newAPIEncoder(t testing.TB, f Format, w io.Writer, gv schema.GroupVersion, nondeterministic bool) *apiEncoder {
	info := serializerInfo(t, f)
	var embedded, event runtime.Encoder = info.Serializer, info.StreamSerializer.Serializer
	if nondeterministic {
		embedded = runtime.UseNondeterministicEncoding(info.Serializer)
		event = runtime.UseNondeterministicEncoding(info.StreamSerializer.Serializer)
	}
	return &apiEncoder{
		embedded: codecs.EncoderForVersion(embedded, gv),
		event:    codecs.EncoderForVersion(event, gv),
		frame:    info.StreamSerializer.Framer.NewFrameWriter(w),
	}
}

func (e *apiEncoder) encode(t testing.TB, typ watch.EventType, obj runtime.Object) {
	t.Helper()
	e.buf.Reset()
	if err := e.embedded.Encode(obj, &e.buf); err != nil {
		t.Fatalf("encode %T: %v", obj, err)
	}
	var ev bytes.Buffer
	out := &metav1.WatchEvent{Type: string(typ), Object: runtime.RawExtension{Raw: e.buf.Bytes()}}
	if err := e.event.Encode(out, &ev); err != nil {
		t.Fatalf("encode watch event: %v", err)
	}
	if _, err := e.frame.Write(ev.Bytes()); err != nil {
		t.Fatal(err)
	}
}

// oracleEvent is one event as client-go decodes it.
type oracleEvent struct {
	Type watch.EventType
	Obj  runtime.Object
}

// decodeOracle decodes a whole stream as client-go's watch decoder does
// (rest.Request.newStreamWatcher).
func decodeOracle(t testing.TB, f Format, stream []byte) ([]oracleEvent, error) {
	t.Helper()
	info := serializerInfo(t, f)
	objDecoder := codecs.WithoutConversion().DecoderToVersion(info.Serializer, corev1.SchemeGroupVersion)
	fr := info.StreamSerializer.Framer.NewFrameReader(io.NopCloser(bytes.NewReader(stream)))
	dec := restclientwatch.NewDecoder(streaming.NewDecoder(fr, info.StreamSerializer.Serializer), objDecoder)
	var out []oracleEvent
	for {
		typ, obj, err := dec.Decode()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, oracleEvent{typ, obj})
	}
}

// expected returns the Event fields the oracle's decoded event implies.
func expected(t testing.TB, oe oracleEvent) Event {
	t.Helper()
	e := Event{Type: string(oe.Type)}
	if acc, err := meta.Accessor(oe.Obj); err == nil {
		e.SetRV(acc.GetResourceVersion())
		e.UID = string(acc.GetUID())
		e.Namespace = acc.GetNamespace()
		e.Name = acc.GetName()
		e.InitialEventsEnd = oe.Type == watch.Bookmark && acc.GetAnnotations()[InitialEventsEndAnnotation] == "true"
	} else if lacc, err := meta.ListAccessor(oe.Obj); err == nil {
		e.SetRV(lacc.GetResourceVersion())
	} else {
		t.Fatalf("no metadata accessor for %T", oe.Obj)
	}
	return e
}

// sameFields compares everything but Raw and the rewrite location.
func sameFields(a, b *Event) error {
	if a.Type != b.Type || a.RV != b.RV || a.RVInt != b.RVInt || a.RVIsInt != b.RVIsInt ||
		a.UID != b.UID || a.Namespace != b.Namespace || a.Name != b.Name ||
		a.InitialEventsEnd != b.InitialEventsEnd {
		return fmt.Errorf("fields differ:\n got  %s\n want %s", describe(a), describe(b))
	}
	return nil
}

func describe(e *Event) string {
	return fmt.Sprintf("type=%q rv=%q(%d,%v) uid=%q ns=%q name=%q iee=%v", e.Type, e.RV, e.RVInt, e.RVIsInt,
		e.UID, e.Namespace, e.Name, e.InitialEventsEnd)
}

// readAll reads every event of a stream, cloned.
func readAll(f Format, r io.Reader, maxFrame int) ([]*Event, error) {
	rd := NewReader(f, r, maxFrame)
	var out []*Event
	for {
		ev, err := rd.Next()
		if err != nil {
			if err == io.EOF {
				return out, nil
			}
			return out, err
		}
		out = append(out, ev.Clone())
	}
}

// splitReader returns its data in reads of random sizes from 1 to maxChunk bytes.
type splitReader struct {
	data     []byte
	rng      *rand.Rand
	maxChunk int
}

func newSplitReader(data []byte, seed uint64, maxChunk int) *splitReader {
	return &splitReader{data: data, rng: rand.New(rand.NewPCG(seed, 7)), maxChunk: maxChunk}
}

func (s *splitReader) Read(p []byte) (int, error) {
	if len(s.data) == 0 {
		return 0, io.EOF
	}
	n := 1 + s.rng.IntN(s.maxChunk)
	n = min(n, len(p), len(s.data))
	copy(p, s.data[:n])
	s.data = s.data[n:]
	return n, nil
}

// ---- test objects ----

func objMeta(ns, name, uid, rv string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace: ns, Name: name, UID: types.UID(uid), ResourceVersion: rv,
		Labels:            map[string]string{"app": name, "tier": "backend"},
		CreationTimestamp: metav1.Unix(1700000000, 0),
	}
}

func withKind(obj runtime.Object) runtime.Object {
	gvks, _, err := scheme.Scheme.ObjectKinds(obj)
	if err != nil {
		panic(err)
	}
	obj.GetObjectKind().SetGroupVersionKind(gvks[0])
	return obj
}

func configMap(ns, name, uid, rv string) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{
		ObjectMeta: objMeta(ns, name, uid, rv),
		Data: map[string]string{
			"config.yaml": "key: \"value\"\nother: 'x'\n\ttabbed\\backslash \u00e9\u4e16\u754c \U0001F600 </script>",
			"empty":       "",
		},
	}
	cm.Annotations = map[string]string{
		"kubectl.kubernetes.io/last-applied-configuration": `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + name + `"}}` + "\n",
	}
	return cm
}

// pod returns a Pod whose JSON encoding is about size bytes (at least ~1 KiB).
func pod(ns, name, uid, rv string, size int) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: objMeta(ns, name, uid, rv),
		Spec: corev1.PodSpec{
			NodeName: "node-1",
			Containers: []corev1.Container{{
				Name:  "main",
				Image: "registry.example/app:v1.2.3",
				Args:  []string{"--port=8080", "--verbose"},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
					HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)},
				}},
			}},
		},
		Status: corev1.PodStatus{
			Phase:  corev1.PodRunning,
			PodIP:  "10.0.0.7",
			HostIP: "192.168.1.10",
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Unix(1700000100, 0)},
			},
		},
	}
	p.ManagedFields = []metav1.ManagedFieldsEntry{{
		Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply, APIVersion: "v1",
		Time: &metav1.Time{Time: metav1.Unix(1700000000, 0).Time}, FieldsType: "FieldsV1",
		FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{"f:app":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"main\"}":{".":{},"f:image":{}}}}}`),
	}}
	for i := 0; ; {
		b, err := EncodeEvent(JSON, Added, withKind(p.DeepCopy()))
		if err != nil {
			panic(err)
		}
		if len(b) >= size {
			break
		}
		// Each variable adds about 70 bytes.
		for range max(1, (size-len(b))/80) {
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{
				Name: fmt.Sprintf("SETTING_%03d", i), Value: strings.Repeat("v", 40),
			})
			i++
		}
	}
	return p
}

func service(ns, name, uid, rv string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: objMeta(ns, name, uid, rv),
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}
}

// bookmark is what the apiserver sends as a BOOKMARK: an object of the watched kind carrying
// only its resourceVersion and, at the end of the initial events, the annotation.
func bookmark(rv string, initialEnd bool) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: rv}}
	if initialEnd {
		p.Annotations = map[string]string{InitialEventsEndAnnotation: "true"}
	}
	return p
}

func expired() *metav1.Status {
	return &metav1.Status{
		Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired,
		Message: "too old resource version: 5 (12)",
	}
}

type testEvent struct {
	typ watch.EventType
	obj runtime.Object
}

// sampleEvents is a stream that exercises every field: standard types, namespaced and
// cluster-scoped objects, escapes, the initial-events-end bookmark, an ERROR, a
// non-integer RV and an object without one.
func sampleEvents() []testEvent {
	return []testEvent{
		{watch.Added, configMap("default", "cm-a", "0d8e5d8c-0001-4c1a-9d1b-3f7e0a000001", "101")},
		{watch.Added, pod("team-a", "web-0", "0d8e5d8c-0002-4c1a-9d1b-3f7e0a000002", "99", 1024)},
		{watch.Bookmark, bookmark("101", true)},
		{watch.Modified, pod("team-a", "web-0", "0d8e5d8c-0002-4c1a-9d1b-3f7e0a000002", "102", 8192)},
		{watch.Added, service("team-b", "api", "0d8e5d8c-0003-4c1a-9d1b-3f7e0a000003", "103")},
		{watch.Added, &corev1.Namespace{ObjectMeta: objMeta("", "team-c", "0d8e5d8c-0004-4c1a-9d1b-3f7e0a000004", "18446744073709551615")}},
		{watch.Deleted, service("team-b", "api", "0d8e5d8c-0003-4c1a-9d1b-3f7e0a000003", "104")},
		{watch.Bookmark, bookmark("104", false)},
		{watch.Modified, configMap("default", "cm-b", "0d8e5d8c-0005-4c1a-9d1b-3f7e0a000005", "opaque-rv/1")},
		{watch.Added, configMap("default", "cm-norv", "0d8e5d8c-0006-4c1a-9d1b-3f7e0a000006", "")},
		{watch.Modified, configMap("default", "cm-c", "0d8e5d8c-0007-4c1a-9d1b-3f7e0a000007", "0105")},
		{watch.Error, expired()},
	}
}

// apiStream encodes events as the apiserver would, with objects of core/v1.
func apiStream(t testing.TB, f Format, evs []testEvent, nondeterministic bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := newAPIEncoder(t, f, &buf, corev1.SchemeGroupVersion, nondeterministic)
	for _, e := range evs {
		enc.encode(t, e.typ, e.obj.DeepCopyObject())
	}
	return buf.Bytes()
}
