package bench

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/watchsan/watchsan/internal/stream"
)

// codecs are apimachinery's serializers configured as a CBOR-enabled apiserver and client-go
// configure them: the upstream encodes with them and the decode/re-encode proxy uses them both
// ways.
var codecs = serializer.NewCodecFactory(scheme.Scheme, serializer.WithSerializer(cbor.NewSerializerInfo))

// mediaType is the serializer media type behind each format.
func mediaType(f stream.Format) string {
	switch f {
	case stream.Protobuf:
		return runtime.ContentTypeProtobuf
	case stream.CBOR:
		return runtime.ContentTypeCBOR
	}
	return runtime.ContentTypeJSON
}

// serializerInfo returns the regular and stream serializers of f.
func serializerInfo(f stream.Format) (runtime.SerializerInfo, error) {
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), mediaType(f))
	if !ok || info.StreamSerializer == nil {
		return info, fmt.Errorf("no stream serializer for %s", f)
	}
	return info, nil
}

// acceptHeader is what a client-go client sends for each format.
func acceptHeader(f stream.Format) string {
	switch f {
	case stream.Protobuf:
		return "application/vnd.kubernetes.protobuf"
	case stream.CBOR:
		return "application/cbor"
	}
	return "application/json"
}

// formatOfAccept picks the format an apiserver would answer a watch's Accept header with.
func formatOfAccept(accept string) stream.Format {
	switch {
	case strings.Contains(accept, "application/vnd.kubernetes.protobuf"):
		return stream.Protobuf
	case strings.Contains(accept, "application/cbor"):
		return stream.CBOR
	}
	return stream.JSON
}

// stampMarker precedes the send timestamp inside every event (an annotation value): 19
// decimal digits of Unix nanoseconds, zeros until the upstream stamps a copy as it sends it.
// The value has a fixed length, so stamping never changes a frame's size in any format.
const (
	stampMarker    = "wsbts:"
	stampDigits    = 19
	stampAnnotaton = "bench.watchsan.io/sent"
)

// Workload describes the stream every watch of a scenario receives.
type Workload struct {
	Format stream.Format
	// ObjectSize is the target size of one JSON event (the object plus envelope), bytes; the
	// protobuf and CBOR encodings of the same object are smaller.
	ObjectSize int
	// Events is how many events the set holds.
	Events int
	// DeleteEvery makes every n-th event a DELETED whose resourceVersion goes backwards (the
	// Kubernetes 1.7 bug), so that watchsan's rewrite path runs; 0: none.
	DeleteEvery int
	// BaseRV is the resourceVersion the watches start from; event i carries BaseRV+i+1.
	BaseRV uint64
}

func (w Workload) String() string {
	return fmt.Sprintf("%s/%s", w.Format, sizeName(w.ObjectSize))
}

func sizeName(n int) string {
	if n%1024 == 0 {
		return strconv.Itoa(n/1024) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}

// event is one pre-encoded event of a set and what a client must receive for it.
type event struct {
	typ  string
	name string
	// wireRV is the resourceVersion in the object as the upstream sends it; fixedRV is the
	// position of the event in the upstream's history (BaseRV+i+1), which is what watchsan's
	// repair writes into a regressing DELETED.
	wireRV, fixedRV string
	// frame is the event as the upstream sends it (timestamp zero); repaired is the event as
	// watchsan's repair mode writes it, nil when that is frame itself.
	frame, repaired []byte
	// stamp and repairedStamp locate the timestamp digits in frame and repaired.
	stamp, repairedStamp int
}

func (e *event) regressed() bool { return e.repaired != nil }

// EventSet is a workload, encoded once as the apiserver encodes it.
type EventSet struct {
	W      Workload
	events []event
	// bytes[i] is the size of the first i frames.
	bytes []int64
}

// wireBytes is the size of the first n frames as the upstream sends them.
func (s *EventSet) wireBytes(n int) int64 { return s.bytes[min(n, len(s.events))] }

// Regressed counts the regressing DELETED events among the first n.
func (s *EventSet) Regressed(n int) int {
	c := 0
	for i := range min(n, len(s.events)) {
		if s.events[i].regressed() {
			c++
		}
	}
	return c
}

// NewEventSet encodes w's events: MODIFIED events of 100 ConfigMaps in turn, and every
// DeleteEvery-th a DELETED of another ConfigMap carrying the resourceVersion of its last
// update, half the stream back (as a 1.7-1.9 apiserver's watch cache sent it).
func NewEventSet(w Workload) (*EventSet, error) {
	if w.Events <= 0 {
		return nil, fmt.Errorf("workload %s: no events", w)
	}
	info, err := serializerInfo(w.Format)
	if err != nil {
		return nil, err
	}
	gv := corev1.SchemeGroupVersion
	embedded := codecs.EncoderForVersion(info.Serializer, gv)
	evEnc := codecs.EncoderForVersion(info.StreamSerializer.Serializer, gv)
	var frameBuf bytes.Buffer
	frameW := info.StreamSerializer.Framer.NewFrameWriter(&frameBuf)

	fill, err := fillFor(w.ObjectSize)
	if err != nil {
		return nil, err
	}
	set := &EventSet{W: w, events: make([]event, w.Events), bytes: make([]int64, w.Events+1)}
	var objBuf, evBuf bytes.Buffer
	for i := range w.Events {
		fixed := w.BaseRV + uint64(i) + 1
		typ, name, uid, wire := stream.Modified, fmt.Sprintf("cm-%03d", i%100), fmt.Sprintf("00000000-0000-4000-8000-%012d", i%100), fixed
		if w.DeleteEvery > 0 && i%w.DeleteEvery == w.DeleteEvery-1 {
			typ, name, uid = stream.Deleted, fmt.Sprintf("gone-%07d", i), fmt.Sprintf("00000000-0000-4000-9000-%012d", i)
			wire = w.BaseRV + 1 + uint64(i/2)
		}
		cm := configMap(name, uid, strconv.FormatUint(wire, 10), fill)
		objBuf.Reset()
		if err := embedded.Encode(cm, &objBuf); err != nil {
			return nil, fmt.Errorf("encode ConfigMap as %s: %w", w.Format, err)
		}
		evBuf.Reset()
		we := &metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: objBuf.Bytes()}}
		if err := evEnc.Encode(we, &evBuf); err != nil {
			return nil, fmt.Errorf("encode watch event as %s: %w", w.Format, err)
		}
		frameBuf.Reset()
		if _, err := frameW.Write(evBuf.Bytes()); err != nil {
			return nil, err
		}
		e := event{typ: typ, name: name, wireRV: strconv.FormatUint(wire, 10), fixedRV: strconv.FormatUint(fixed, 10),
			frame: bytes.Clone(frameBuf.Bytes())}
		if e.stamp = stampOffset(e.frame); e.stamp < 0 {
			return nil, fmt.Errorf("%s: no timestamp marker in the encoded event", w)
		}
		if wire != fixed {
			if e.repaired, err = rewriteRV(w.Format, e.frame, e.fixedRV); err != nil {
				return nil, err
			}
			if e.repairedStamp = stampOffset(e.repaired); e.repairedStamp < 0 {
				return nil, fmt.Errorf("%s: no timestamp marker in the repaired event", w)
			}
		}
		set.events[i] = e
		set.bytes[i+1] = set.bytes[i] + int64(len(e.frame))
	}
	return set, nil
}

// rewriteRV is frame with its resourceVersion replaced, as watchsan's repair writes it.
func rewriteRV(f stream.Format, frame []byte, rv string) ([]byte, error) {
	ev, err := stream.NewReader(f, bytes.NewReader(frame), 0).Next()
	if err != nil {
		return nil, fmt.Errorf("reading back an encoded %s event: %w", f, err)
	}
	var out bytes.Buffer
	if err := stream.NewWriter(f, &out).WriteWithRV(ev, rv); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func stampOffset(b []byte) int {
	i := bytes.Index(b, []byte(stampMarker))
	if i < 0 || i+len(stampMarker)+stampDigits > len(b) {
		return -1
	}
	return i + len(stampMarker)
}

// putStamp writes t (Unix nanoseconds) as the timestamp digits at b[off:].
func putStamp(b []byte, off int, t int64) {
	for i := off + stampDigits - 1; i >= off; i-- {
		b[i] = byte('0' + t%10)
		t /= 10
	}
}

// readStamp parses the timestamp digits at b[off:]; 0 when unstamped or not digits.
func readStamp(b []byte, off int) int64 {
	if off < 0 || off+stampDigits > len(b) {
		return 0
	}
	var t int64
	for _, c := range b[off : off+stampDigits] {
		if c < '0' || c > '9' {
			return 0
		}
		t = t*10 + int64(c-'0')
	}
	return t
}

// fillFor finds how many data entries bring one JSON event to about size bytes.
func fillFor(size int) (int, error) {
	enc := codecs.EncoderForVersion(mustInfo(stream.JSON).Serializer, corev1.SchemeGroupVersion)
	for n := 0; n < 10000; n++ {
		var b bytes.Buffer
		if err := enc.Encode(configMap("cm-000", "00000000-0000-4000-8000-000000000000", "1000000", n), &b); err != nil {
			return 0, err
		}
		// The event envelope adds about 30 bytes.
		if b.Len()+30 >= size {
			return n, nil
		}
	}
	return 0, fmt.Errorf("object size %d out of reach", size)
}

func mustInfo(f stream.Format) runtime.SerializerInfo {
	info, err := serializerInfo(f)
	if err != nil {
		panic(err)
	}
	return info
}

// configMap is a ConfigMap as a controller-managed one looks: labels, annotations, managed
// fields, and n data entries of mixed content (about 90 bytes each in JSON).
func configMap(name, uid, rv string, n int) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "bench", UID: types.UID(uid), ResourceVersion: rv,
			CreationTimestamp: metav1.Unix(1700000000, 0),
			Labels:            map[string]string{"app.kubernetes.io/name": "bench", "app.kubernetes.io/part-of": "watchsan"},
			Annotations: map[string]string{
				stampAnnotaton: stampMarker + strings.Repeat("0", stampDigits),
				"owner":        "team-a",
			},
			ManagedFields: []metav1.ManagedFieldsEntry{{
				Manager: "bench-controller", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
				Time: &metav1.Time{Time: metav1.Unix(1700000000, 0).Time}, FieldsType: "FieldsV1",
				FieldsV1: metav1.NewFieldsV1(`{"f:data":{".":{}},"f:metadata":{"f:annotations":{".":{},"f:owner":{}},"f:labels":{".":{},"f:app.kubernetes.io/name":{}}}}`),
			}},
		},
		Data: map[string]string{},
	}
	for i := range n {
		cm.Data[fmt.Sprintf("setting-%03d.conf", i)] = fmt.Sprintf("key-%d = \"value %d\"\nenabled = %t\nlimit = %d\t# tuned\n", i, i*7919%10007, i%2 == 0, i*31)
	}
	return cm
}
