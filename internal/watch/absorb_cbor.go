package watch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/fxamacker/cbor/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor/direct"

	"github.com/watchsan/watchsan/internal/stream"
)

// cborAbsorb is the CBOR absorbCodec (docs/design.md sections 3 and 12). The apiserver's CBOR
// is JSON's data model: a list response is the self-described tag (55799) around a map
// {kind, apiVersion, metadata: ListMeta, items: [object maps]}, its strings and keys byte
// strings; a watch event is the tag around {type, object}, the object itself tagged. As for
// JSON, a built-in list's items lack kind and apiVersion, which a watch event's object has.
// Decoding is apimachinery's own (direct: the serializer's decode mode, which rejects
// duplicate keys as a client does); an item's values stay opaque (cbor.RawMessage), and its
// identity is what stream.Reader reads from the frame made of it.
type cborAbsorb struct{}

// cborSelfDescribed is the head of tag 55799, which starts every CBOR object the apiserver
// writes.
var cborSelfDescribed = []byte{0xd9, 0xd9, 0xf7}

// cborListPage is a CBOR list response, as decoded.
type cborListPage struct {
	Kind       string            `json:"kind"`
	APIVersion string            `json:"apiVersion"`
	Metadata   metav1.ListMeta   `json:"metadata"`
	Items      []cbor.RawMessage `json:"items"`
}

func (cborAbsorb) accept() string { return "application/cbor" }

func (cborAbsorb) decodeList(body []byte) (*listPage, error) {
	if !bytes.HasPrefix(body, cborSelfDescribed) {
		return nil, errors.New("no CBOR self-described tag")
	}
	var page cborListPage
	if err := direct.Unmarshal(body[len(cborSelfDescribed):], &page); err != nil {
		return nil, err
	}
	p := &listPage{kind: page.Kind, apiVersion: page.APIVersion, rv: page.Metadata.ResourceVersion, cont: page.Metadata.Continue,
		items: make([][]byte, len(page.Items))}
	for i, it := range page.Items {
		p.items[i] = it
	}
	return p, nil
}

func (c cborAbsorb) item(l *listed, raw []byte) (string, *listItem, error) {
	raw = bytes.TrimPrefix(raw, cborSelfDescribed)
	var top map[string]cbor.RawMessage
	if err := direct.Unmarshal(raw, &top); err != nil {
		return "", nil, fmt.Errorf("a list item: %w", err)
	}
	obj := append([]byte(nil), cborSelfDescribed...)
	_, hasKind := top["kind"]
	_, hasAPIVersion := top["apiVersion"]
	switch {
	case hasKind && hasAPIVersion:
		obj = append(obj, raw...)
	case hasKind || hasAPIVersion:
		return "", nil, errors.New("a list item with one of kind and apiVersion")
	default:
		// The kind and apiVersion a watch event's object carries (client-go's decoder needs
		// them): the map's head counts two more pairs (an indefinite-length map's counts
		// none), then them, then its pairs as they were.
		major, ai, n, hl := cborItemHead(raw)
		if major != 5 || hl == 0 {
			return "", nil, errors.New("a list item that is no map")
		}
		if ai == 31 {
			obj = append(obj, raw[0])
		} else {
			obj = cborAppendHead(obj, 5, n+2)
		}
		obj = cborAppendBytes(obj, "kind")
		obj = cborAppendBytes(obj, l.kind)
		obj = cborAppendBytes(obj, "apiVersion")
		obj = cborAppendBytes(obj, l.apiVersion)
		obj = append(obj, raw[hl:]...)
	}
	// The item's identity as the feed's Reader would read it in a watch event of it.
	ev, err := readOne(stream.CBOR, c.frame(stream.Added, obj), len(obj)+64)
	if err != nil {
		return "", nil, fmt.Errorf("a list item: %w", err)
	}
	if ev.Name == "" || !ev.RVIsInt {
		return "", nil, fmt.Errorf("a list item without a name or an integer resourceVersion (%q)", ev.RV)
	}
	return ev.Namespace + "/" + ev.Name, &listItem{uid: ev.UID, rv: ev.RVInt, obj: obj}, nil
}

// cborItemHead decodes the head of the data item at b[0]: major type, additional information,
// argument and the head's size (0: b is too short, or the head is reserved).
func cborItemHead(b []byte) (major, ai byte, arg uint64, n int) {
	if len(b) == 0 {
		return 0, 0, 0, 0
	}
	major, ai = b[0]>>5, b[0]&0x1f
	switch {
	case ai < 24:
		return major, ai, uint64(ai), 1
	case ai == 24 && len(b) >= 2:
		return major, ai, uint64(b[1]), 2
	case ai == 25 && len(b) >= 3:
		return major, ai, uint64(binary.BigEndian.Uint16(b[1:])), 3
	case ai == 26 && len(b) >= 5:
		return major, ai, uint64(binary.BigEndian.Uint32(b[1:])), 5
	case ai == 27 && len(b) >= 9:
		return major, ai, binary.BigEndian.Uint64(b[1:]), 9
	case ai == 31:
		return major, ai, 0, 1
	}
	return 0, 0, 0, 0
}

// cborAppendHead appends the shortest head of major type major with argument n.
func cborAppendHead(b []byte, major byte, n uint64) []byte {
	m := major << 5
	switch {
	case n < 24:
		return append(b, m|byte(n))
	case n <= 0xff:
		return append(b, m|24, byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, m|25), uint16(n))
	case n <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(b, m|26), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(b, m|27), n)
}

// cborAppendBytes appends s as a byte string, as the apiserver writes strings and keys.
func cborAppendBytes(b []byte, s string) []byte {
	return append(cborAppendHead(b, 2, uint64(len(s))), s...)
}

func (cborAbsorb) frame(typ string, obj []byte) []byte {
	b := make([]byte, 0, len(obj)+len(typ)+24)
	b = append(b, cborSelfDescribed...)
	b = cborAppendHead(b, 5, 2)
	b = cborAppendBytes(b, "type")
	b = cborAppendBytes(b, typ)
	b = cborAppendBytes(b, "object")
	return append(b, obj...)
}

func (cborAbsorb) objectOf(frame []byte) ([]byte, error) {
	var ev struct {
		Type   string          `json:"type"`
		Object cbor.RawMessage `json:"object"`
	}
	if err := direct.Unmarshal(bytes.TrimPrefix(frame, cborSelfDescribed), &ev); err != nil {
		return nil, err
	}
	if len(ev.Object) == 0 {
		return nil, errors.New("no object")
	}
	// The decoder leaves the self-described tag out of a raw value; the apiserver's object
	// carries it.
	if bytes.HasPrefix(ev.Object, cborSelfDescribed) {
		return ev.Object, nil
	}
	return append(append([]byte(nil), cborSelfDescribed...), ev.Object...), nil
}

func (cborAbsorb) bookmark(l *listed, rv string) []byte {
	b := append([]byte(nil), cborSelfDescribed...)
	b = cborAppendHead(b, 5, 3)
	b = cborAppendBytes(b, "kind")
	b = cborAppendBytes(b, l.kind)
	b = cborAppendBytes(b, "apiVersion")
	b = cborAppendBytes(b, l.apiVersion)
	b = cborAppendBytes(b, "metadata")
	b = cborAppendHead(b, 5, 1)
	b = cborAppendBytes(b, "resourceVersion")
	return cborAppendBytes(b, rv)
}
