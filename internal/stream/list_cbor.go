package stream

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/fxamacker/cbor/v2"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor/direct"
)

// cborList is the CBOR ListCodec (docs/design.md sections 3 and 12). The apiserver's CBOR
// is JSON's data model: a list response is the self-described tag (55799) around a map
// {kind, apiVersion, metadata: ListMeta, items: [object maps]}, its strings and keys byte
// strings; a watch event is the tag around {type, object}, the object itself tagged. As in
// JSON, a built-in list's items lack the kind and apiVersion a watch event's object has.
// Decoding and encoding are apimachinery's own (cbor/direct: the serializer's modes, which
// refuse duplicate keys as a client does and write strings as the apiserver does); an item's
// values stay opaque (cbor.RawMessage), and its identity is what Reader reads from the
// frame made of it.
type cborList struct{}

// cborTagHead is the head of tag 55799, which starts every CBOR object the apiserver
// writes.
var cborTagHead = []byte{0xd9, 0xd9, 0xf7}

// cborTagged is v encoded, after the self-described tag.
func cborTagged(v any) ([]byte, error) {
	b, err := direct.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(append(make([]byte, 0, len(cborTagHead)+len(b)), cborTagHead...), b...), nil
}

func (cborList) Accept() string { return "application/cbor" }

func (cborList) DecodeList(body []byte) (*ListPage, error) {
	if !bytes.HasPrefix(body, cborTagHead) {
		return nil, errors.New("no CBOR self-described tag")
	}
	var page mapListPage[cbor.RawMessage]
	if err := direct.Unmarshal(body[len(cborTagHead):], &page); err != nil {
		return nil, err
	}
	return page.page(), nil
}

func (c cborList) Item(kind, apiVersion string, raw []byte) (string, ListItem, error) {
	var top map[string]cbor.RawMessage
	if err := direct.Unmarshal(bytes.TrimPrefix(raw, cborTagHead), &top); err != nil {
		return "", ListItem{}, fmt.Errorf("a list item: %w", err)
	}
	_, hasKind := top["kind"]
	_, hasAPIVersion := top["apiVersion"]
	if hasKind != hasAPIVersion {
		return "", ListItem{}, errors.New("a list item with one of kind and apiVersion")
	}
	if !hasKind {
		// The kind and apiVersion a watch event's object carries (client-go's decoder needs
		// them); the other values as they were.
		var err error
		if top["kind"], err = direct.Marshal(kind); err != nil {
			return "", ListItem{}, err
		}
		if top["apiVersion"], err = direct.Marshal(apiVersion); err != nil {
			return "", ListItem{}, err
		}
	}
	obj, err := cborTagged(top)
	if err != nil {
		return "", ListItem{}, fmt.Errorf("a list item: %w", err)
	}
	frame, err := c.event(Added, obj)
	if err != nil {
		return "", ListItem{}, fmt.Errorf("a list item: %w", err)
	}
	// The item's identity as a feed's Reader would read it in a watch event of it.
	return itemIdentity(CBOR, obj, frame, len(frame))
}

// cborEvent is a watch event, as the apiserver's stream serializer writes one.
type cborEvent struct {
	Type   string          `json:"type"`
	Object cbor.RawMessage `json:"object"`
}

func (c cborList) event(typ string, obj []byte) ([]byte, error) {
	return cborTagged(cborEvent{Type: typ, Object: obj})
}

// Frame is event's; obj is an object item made here or read from a frame (ObjectOf), which
// encodes: an error is no frame (the Reader refuses it, and the absorb with it).
func (c cborList) Frame(typ string, obj []byte) []byte {
	b, _ := c.event(typ, obj)
	return b
}

func (cborList) ObjectOf(frame []byte) ([]byte, error) {
	var ev cborEvent
	if err := direct.Unmarshal(bytes.TrimPrefix(frame, cborTagHead), &ev); err != nil {
		return nil, err
	}
	if len(ev.Object) == 0 {
		return nil, errors.New("no object")
	}
	// The decoder leaves the self-described tag out of a raw value; the apiserver's object
	// carries it.
	if bytes.HasPrefix(ev.Object, cborTagHead) {
		return ev.Object, nil
	}
	return append(append([]byte(nil), cborTagHead...), ev.Object...), nil
}

func (cborList) Bookmark(kind, apiVersion, rv string) []byte {
	type meta struct {
		ResourceVersion string `json:"resourceVersion"`
	}
	b, _ := cborTagged(struct {
		Kind       string `json:"kind"`
		APIVersion string `json:"apiVersion"`
		Metadata   meta   `json:"metadata"`
	}{kind, apiVersion, meta{rv}}) // strings only: cannot fail
	return b
}
