package stream

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// protobufList is the protobuf ListCodec (docs/design.md sections 3 and 12). A list response
// is "k8s\x00" and a runtime.Unknown whose raw is the list message:
//
//	List     { 1: metadata ListMeta {2: resourceVersion; 3: continue}; 2: items (repeated) }
//	item     the object's message, as in a watch event's Unknown.raw: { 1: metadata ObjectMeta, ... }
//
// and a watch event frame is a 4-byte big-endian length and a metav1.WatchEvent whose object's
// raw is "k8s\x00" and a runtime.Unknown {typeMeta {apiVersion, kind}, raw: the object's
// message, contentEncoding "", contentType ""}: an item is wrapped into that as it is, its
// bytes opaque (the proxy knows no types, and custom resources have no protobuf messages;
// the item's identity is read by Reader from the frame made of it, as every watch
// event's is). The envelopes are apimachinery's own generated messages (metav1.WatchEvent,
// runtime.Unknown, metav1.ListMeta), which encode exactly as the apiserver's watch does: a
// frame made of a watch's own object is that watch's frame byte for byte (the tests hold it
// to the captured streams).
type protobufList struct{}

// protoMagic starts every protobuf-encoded Kubernetes object.
var protoMagic = []byte("k8s\x00")

func (protobufList) Accept() string { return "application/vnd.kubernetes.protobuf" }

func (protobufList) DecodeList(body []byte) (*ListPage, error) {
	if !bytes.HasPrefix(body, protoMagic) {
		return nil, errors.New("no k8s protobuf prefix")
	}
	var u runtime.Unknown
	if err := u.Unmarshal(body[len(protoMagic):]); err != nil {
		return nil, fmt.Errorf("the list's envelope: %w", err)
	}
	if u.ContentEncoding != "" {
		return nil, fmt.Errorf("the list's content encoding %q", u.ContentEncoding)
	}
	// The apiserver's envelope is its kind, then the list message (never empty: a list's
	// metadata has at least its resourceVersion), then the empty content fields. A body cut
	// short before the message ends is refused: inside it, by the message's length; before it,
	// here. So no prefix of a list decodes as a shorter one (TestListCutShortNeverDecodesShorter).
	if u.Kind == "" || len(u.Raw) == 0 {
		return nil, errors.New("the list's envelope has no kind or no list message (cut short?)")
	}
	p := &ListPage{Kind: u.Kind, APIVersion: u.APIVersion}
	// The list message, read as the generated code reads it: every metadata field merges
	// into one ListMeta, and each items field is one item; other fields are skipped.
	var meta metav1.ListMeta
	for b := u.Raw; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("the list message: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if (num == 1 || num == 2) && typ != protowire.BytesType {
			return nil, fmt.Errorf("the list's field %d has wire type %d", num, typ)
		}
		if num != 1 && num != 2 {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return nil, fmt.Errorf("the list message: %w", protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, fmt.Errorf("the list message: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if num == 1 {
			if err := meta.Unmarshal(v); err != nil {
				return nil, fmt.Errorf("the list's metadata: %w", err)
			}
			continue
		}
		p.Items = append(p.Items, v)
	}
	p.ResourceVersion, p.Continue = meta.ResourceVersion, meta.Continue
	return p, nil
}

func (c protobufList) Item(kind, apiVersion string, raw []byte) (string, ListItem, error) {
	obj := protoObject(apiVersion, kind, raw)
	// The item's identity as a feed's Reader would read it in a watch event of it.
	return itemIdentity(Protobuf, obj, c.Frame(Added, obj), len(obj)+64)
}

// protoObject is the object message msg of apiVersion and kind as a watch event's
// RawExtension.raw holds it: "k8s\x00" and its runtime.Unknown.
func protoObject(apiVersion, kind string, msg []byte) []byte {
	u := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: apiVersion, Kind: kind}, Raw: msg}
	b := make([]byte, len(protoMagic)+u.Size())
	copy(b, protoMagic)
	n, _ := u.MarshalToSizedBuffer(b[len(protoMagic):]) // sized by Size: cannot fail
	return b[:len(protoMagic)+n]
}

func (protobufList) Frame(typ string, obj []byte) []byte {
	ev := metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: obj}}
	b := make([]byte, 4+ev.Size())
	n, _ := ev.MarshalToSizedBuffer(b[4:]) // sized by Size: cannot fail
	binary.BigEndian.PutUint32(b, uint32(n))
	return b[:4+n]
}

func (protobufList) ObjectOf(frame []byte) ([]byte, error) {
	if len(frame) < 4 {
		return nil, errors.New("a protobuf frame shorter than its length")
	}
	var ev metav1.WatchEvent
	if err := ev.Unmarshal(frame[4:]); err != nil {
		return nil, err
	}
	if len(ev.Object.Raw) == 0 {
		return nil, errors.New("no object")
	}
	return ev.Object.Raw, nil
}

// Bookmark is an object of kind with only its ObjectMeta, and of that only the
// resourceVersion set: the metadata byte for byte as the apiserver's bookmark carries it (the
// generated code writes every scalar field, empty or not). The apiserver's bookmark of a kind
// with a spec or status also carries their zero values; a client decodes either into an
// object whose resourceVersion is all a bookmark means (client-go's reflector reads nothing
// else of it), as the JSON bookmark (jsonList) is.
func (protobufList) Bookmark(kind, apiVersion, rv string) []byte {
	m := metav1.ObjectMeta{ResourceVersion: rv}
	msg := protowire.AppendTag(nil, 1, protowire.BytesType)
	meta, _ := m.Marshal() // a plain ObjectMeta: cannot fail
	msg = protowire.AppendBytes(msg, meta)
	return protoObject(apiVersion, kind, msg)
}
