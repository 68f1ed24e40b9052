package stream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// List codecs (docs/design.md sections 3 and 12): what of a list response, and of the watch
// event frames made of its items, is particular to a wire format. A feed that absorbs a 410
// (package absorb) lists its scope in its watch's format and sends its subscribers watch
// events made of the list's items and of frames it delivered before, written as the
// apiserver's watch writes them in that format; everything else of absorbing is the same for
// every format. Every method reads network bytes or bytes made of them: none panics on any
// input (FuzzJSONList, FuzzProtobufList, FuzzCBORList).

// ListCodec is one format's list codec (ListCodecFor).
type ListCodec interface {
	// Accept is a list request's Accept: the format alone.
	Accept() string
	// DecodeList decodes one page of a list response.
	DecodeList(body []byte) (*ListPage, error)
	// Item is a list item as a watch event's object (kind and apiVersion, the list's kind
	// without "List" and its apiVersion, set as a watch carries them), keyed by
	// namespace/name, with its uid and resourceVersion as a Reader reads them.
	Item(kind, apiVersion string, raw []byte) (key string, it ListItem, err error)
	// Frame is a whole watch event frame of type typ with the object obj (one Item or
	// ObjectOf made).
	Frame(typ string, obj []byte) []byte
	// ObjectOf is the object of a watch event's frame, as Frame takes it.
	ObjectOf(frame []byte) ([]byte, error)
	// Bookmark is the object of a BOOKMARK at rv of kind: only its resourceVersion set.
	Bookmark(kind, apiVersion, rv string) []byte
}

// ListPage is one page of a list response, as decoded: the list's kind ("ConfigMapList"),
// apiVersion, resourceVersion and continue token, and its items' bytes as the list holds them.
type ListPage struct {
	Kind, APIVersion, ResourceVersion, Continue string
	Items                                       [][]byte
}

// ListItem is a list item made a watch event's object: its uid, integer resourceVersion and
// the object's bytes.
type ListItem struct {
	UID    string
	RV     uint64
	Object []byte
}

// ListCodecFor is format's ListCodec, nil for one no list is read in.
func ListCodecFor(format Format) ListCodec {
	switch format {
	case JSON:
		return jsonList{}
	case Protobuf:
		return protobufList{}
	case CBOR:
		return cborList{}
	}
	return nil
}

// jsonList is the JSON ListCodec.
type jsonList struct{}

// mapListPage is a list response in JSON or CBOR (one data model), as decoded; Raw is the
// format's raw value type.
type mapListPage[Raw ~[]byte] struct {
	Kind       string          `json:"kind"`
	APIVersion string          `json:"apiVersion"`
	Metadata   metav1.ListMeta `json:"metadata"`
	Items      []Raw           `json:"items"`
}

func (m *mapListPage[Raw]) page() *ListPage {
	p := &ListPage{Kind: m.Kind, APIVersion: m.APIVersion, ResourceVersion: m.Metadata.ResourceVersion, Continue: m.Metadata.Continue,
		Items: make([][]byte, len(m.Items))}
	for i, it := range m.Items {
		p.Items[i] = it
	}
	return p
}

func (jsonList) Accept() string { return "application/json" }

func (jsonList) DecodeList(body []byte) (*ListPage, error) {
	var page mapListPage[json.RawMessage]
	if err := json.Unmarshal(body, &page); err != nil {
		return nil, err
	}
	return page.page(), nil
}

// itemMeta is what of a JSON item Item reads.
type itemMeta struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Metadata   struct {
		Name            string `json:"name"`
		Namespace       string `json:"namespace"`
		UID             string `json:"uid"`
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
}

func (jsonList) Item(kind, apiVersion string, raw []byte) (string, ListItem, error) {
	var im itemMeta
	if err := json.Unmarshal(raw, &im); err != nil {
		return "", ListItem{}, fmt.Errorf("a list item: %w", err)
	}
	rv, ok := ParseRV(im.Metadata.ResourceVersion)
	if im.Metadata.Name == "" || !ok {
		return "", ListItem{}, fmt.Errorf("a list item without a name or an integer resourceVersion (%q)", im.Metadata.ResourceVersion)
	}
	obj := raw
	if im.Kind == "" || im.APIVersion == "" {
		// The apiserver leaves the items of a built-in kind's list without their kind and
		// apiVersion; a watch event's object has them (client-go's decoder needs them).
		body := bytes.TrimLeft(obj, " \t\r\n")
		if len(body) < 2 || body[0] != '{' {
			return "", ListItem{}, errors.New("a list item that is no object")
		}
		head := fmt.Sprintf(`{"kind":%q,"apiVersion":%q`, kind, apiVersion)
		rest := bytes.TrimLeft(body[1:], " \t\r\n")
		if len(rest) > 0 && rest[0] != '}' {
			head += ","
		}
		obj = append([]byte(head), rest...)
	}
	return im.Metadata.Namespace + "/" + im.Metadata.Name, ListItem{UID: im.Metadata.UID, RV: rv, Object: obj}, nil
}

func (jsonList) Bookmark(kind, apiVersion, rv string) []byte {
	return fmt.Appendf(nil, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":%q}}`, kind, apiVersion, rv)
}

func (jsonList) ObjectOf(frame []byte) ([]byte, error) {
	var e struct {
		Object json.RawMessage `json:"object"`
	}
	if err := json.Unmarshal(frame, &e); err != nil {
		return nil, err
	}
	if len(e.Object) == 0 {
		return nil, errors.New("no object")
	}
	return e.Object, nil
}

func (jsonList) Frame(typ string, obj []byte) []byte {
	frame := make([]byte, 0, len(obj)+40)
	frame = append(frame, `{"type":`...)
	frame = strconv.AppendQuote(frame, typ)
	frame = append(frame, `,"object":`...)
	frame = append(frame, obj...)
	return append(frame, "}\n"...)
}

// itemIdentity reads the identity of an item's object as a Reader reads it from a watch event
// frame made of it (the binary formats, whose items' bytes stay opaque).
func itemIdentity(format Format, obj, frame []byte, maxFrame int) (string, ListItem, error) {
	ev, err := NewReader(format, bytes.NewReader(frame), maxFrame).Next()
	if err != nil {
		return "", ListItem{}, fmt.Errorf("a list item: %w", err)
	}
	if ev.Name == "" || !ev.RVIsInt {
		return "", ListItem{}, fmt.Errorf("a list item without a name or an integer resourceVersion (%q)", ev.RV)
	}
	return ev.Namespace + "/" + ev.Name, ListItem{UID: strings.Clone(ev.UID), RV: ev.RVInt, Object: obj}, nil
}
