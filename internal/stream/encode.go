package stream

import (
	"bytes"
	"encoding/binary"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
)

// The apiserver's serializers, for encoding only (no scheme is needed for that).
var (
	jsonEncoder = json.NewSerializerWithOptions(json.DefaultMetaFactory, nil, nil, json.SerializerOptions{})
	// pbEncoder writes an object with the k8s\x00 prefix; pbRawEncoder writes the bare
	// WatchEvent message, as the apiserver's stream serializer does.
	pbEncoder    = protobuf.NewSerializer(nil, nil)
	pbRawEncoder = protobuf.NewRawSerializer(nil, nil)
	cborEncoder  = cbor.NewSerializer(nil, nil)
	// cborStreamEncoder is the stream serializer, as in cbor.NewSerializerInfo.
	cborStreamEncoder = cbor.NewSerializer(nil, nil, cbor.Transcode(false))
)

// EncodeEvent returns one whole frame carrying a watch event of type typ for obj, encoded as
// the apiserver encodes it in format f: the object with the regular serializer, embedded in a
// metav1.WatchEvent written with the stream serializer and framed. obj must carry its
// apiVersion and kind (TypeMeta), as the apiserver's versioning encoder would set them; a
// *metav1.Status without them is taken as v1 Status. Protobuf needs an object with generated
// protobuf methods (not Unstructured).
//
// It is for rare events (an ERROR the proxy makes up) and tests, not the hot path.
func EncodeEvent(f Format, typ string, obj runtime.Object) ([]byte, error) {
	if obj == nil {
		return nil, fmt.Errorf("stream: EncodeEvent: nil object")
	}
	if st, ok := obj.(*metav1.Status); ok && st.GetObjectKind().GroupVersionKind().Empty() {
		c := *st
		c.APIVersion, c.Kind = "v1", "Status"
		obj = &c
	}
	if gvk := obj.GetObjectKind().GroupVersionKind(); gvk.Kind == "" || gvk.Version == "" {
		return nil, fmt.Errorf("stream: EncodeEvent: %T has no apiVersion/kind set", obj)
	}
	var embedded bytes.Buffer
	var err error
	switch f {
	case JSON:
		err = jsonEncoder.Encode(obj, &embedded)
	case Protobuf:
		err = pbEncoder.Encode(obj, &embedded)
	case CBOR:
		err = cborEncoder.Encode(obj, &embedded)
	default:
		return nil, fmt.Errorf("stream: EncodeEvent: unknown format %d", int(f))
	}
	if err != nil {
		return nil, fmt.Errorf("stream: encoding %T as %s: %w", obj, f, err)
	}
	ev := &metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: embedded.Bytes()}}
	var out bytes.Buffer
	switch f {
	case JSON:
		err = jsonEncoder.Encode(ev, &out)
	case Protobuf:
		out.Write([]byte{0, 0, 0, 0})
		if err = pbRawEncoder.Encode(ev, &out); err == nil {
			binary.BigEndian.PutUint32(out.Bytes(), uint32(out.Len()-4))
		}
	case CBOR:
		err = cborStreamEncoder.Encode(ev, &out)
	}
	if err != nil {
		return nil, fmt.Errorf("stream: encoding a %s watch event: %w", f, err)
	}
	return out.Bytes(), nil
}
