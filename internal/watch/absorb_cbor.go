package watch

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/fxamacker/cbor/v2"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor/direct"

	"github.com/watchsan/watchsan/internal/stream"
)

// cborAbsorb is the CBOR absorbCodec (docs/design.md sections 3 and 12). The apiserver's CBOR
// is JSON's data model: a list response is the self-described tag (55799) around a map
// {kind, apiVersion, metadata: ListMeta, items: [object maps]}, its strings and keys byte
// strings; a watch event is the tag around {type, object}, the object itself tagged. As in
// JSON, a built-in list's items lack the kind and apiVersion a watch event's object has.
// Decoding and encoding are apimachinery's own (cbor/direct: the serializer's modes, which
// refuse duplicate keys as a client does and write strings as the apiserver does); an item's
// values stay opaque (cbor.RawMessage), and its identity is what stream.Reader reads from the
// frame made of it.
type cborAbsorb struct{}

// cborSelfDescribed is the head of tag 55799, which starts every CBOR object the apiserver
// writes.
var cborSelfDescribed = []byte{0xd9, 0xd9, 0xf7}

// cborTagged is v encoded, after the self-described tag.
func cborTagged(v any) ([]byte, error) {
	b, err := direct.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(append(make([]byte, 0, len(cborSelfDescribed)+len(b)), cborSelfDescribed...), b...), nil
}

func (cborAbsorb) accept() string { return "application/cbor" }

func (cborAbsorb) decodeList(body []byte) (*listPage, error) {
	if !bytes.HasPrefix(body, cborSelfDescribed) {
		return nil, errors.New("no CBOR self-described tag")
	}
	var page mapListPage[cbor.RawMessage]
	if err := direct.Unmarshal(body[len(cborSelfDescribed):], &page); err != nil {
		return nil, err
	}
	return page.page(), nil
}

func (c cborAbsorb) item(l *listed, raw []byte) (string, *listItem, error) {
	var top map[string]cbor.RawMessage
	if err := direct.Unmarshal(bytes.TrimPrefix(raw, cborSelfDescribed), &top); err != nil {
		return "", nil, fmt.Errorf("a list item: %w", err)
	}
	_, hasKind := top["kind"]
	_, hasAPIVersion := top["apiVersion"]
	if hasKind != hasAPIVersion {
		return "", nil, errors.New("a list item with one of kind and apiVersion")
	}
	if !hasKind {
		// The kind and apiVersion a watch event's object carries (client-go's decoder needs
		// them); the other values as they were.
		var err error
		if top["kind"], err = direct.Marshal(l.kind); err != nil {
			return "", nil, err
		}
		if top["apiVersion"], err = direct.Marshal(l.apiVersion); err != nil {
			return "", nil, err
		}
	}
	obj, err := cborTagged(top)
	if err != nil {
		return "", nil, fmt.Errorf("a list item: %w", err)
	}
	frame, err := c.event(stream.Added, obj)
	if err != nil {
		return "", nil, fmt.Errorf("a list item: %w", err)
	}
	// The item's identity as the feed's Reader would read it in a watch event of it.
	ev, err := readOne(stream.CBOR, frame, len(frame))
	if err != nil {
		return "", nil, fmt.Errorf("a list item: %w", err)
	}
	if ev.Name == "" || !ev.RVIsInt {
		return "", nil, fmt.Errorf("a list item without a name or an integer resourceVersion (%q)", ev.RV)
	}
	return ev.Namespace + "/" + ev.Name, &listItem{uid: ev.UID, rv: ev.RVInt, obj: obj}, nil
}

// cborEvent is a watch event, as the apiserver's stream serializer writes one.
type cborEvent struct {
	Type   string          `json:"type"`
	Object cbor.RawMessage `json:"object"`
}

func (c cborAbsorb) event(typ string, obj []byte) ([]byte, error) {
	return cborTagged(cborEvent{Type: typ, Object: obj})
}

// frame is event's; obj is an object item made here or read from a frame (objectOf), which
// encodes: an error is no frame (the Reader refuses it, and the absorb with it).
func (c cborAbsorb) frame(typ string, obj []byte) []byte {
	b, _ := c.event(typ, obj)
	return b
}

func (cborAbsorb) objectOf(frame []byte) ([]byte, error) {
	var ev cborEvent
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
	type meta struct {
		ResourceVersion string `json:"resourceVersion"`
	}
	b, _ := cborTagged(struct {
		Kind       string `json:"kind"`
		APIVersion string `json:"apiVersion"`
		Metadata   meta   `json:"metadata"`
	}{l.kind, l.apiVersion, meta{rv}}) // strings only: cannot fail
	return b
}
