package stream

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"strings"
)

// The Table list codec (docs/design.md section 12, "Tables"): kubectl get -w asks for Table
// rows (Accept: application/json;as=Table;v=v1;g=meta.k8s.io, ...), and the apiserver answers
// its list with one Table of every object's row and its watch with one Table per event, of one
// row, in JSON (the Content-Type says only application/json). What it sends (kube-apiserver
// 1.37, handlers/response.go watchEmbeddedEncoder, verified against the real one):
//
//	list:  {"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"215"},
//	        "columnDefinitions":[...],"rows":[{"cells":[...],"object":{"kind":"PartialObjectMetadata",...}}, ...]}
//	event: {"type":"MODIFIED","object":{"kind":"Table","apiVersion":"meta.k8s.io/v1",
//	        "metadata":{"resourceVersion":"217"},"columnDefinitions":null,"rows":[{...one row...}]}}
//
// columnDefinitions only on a stream's first event (the encoder sets NoHeaders after it), null
// after; the Table's resourceVersion is the object's. A row's object is the object's metadata
// (includeObject=Metadata, the default: PartialObjectMetadata) or the whole object
// (includeObject=Object); its identity (namespace/name, uid, resourceVersion) is the row
// object's metadata. A row without an object (includeObject=None) has none: such a list is not
// read. The events made of a list's rows and of delivered frames are mid-stream events:
// columnDefinitions null.

// tableList is the Table ListCodec (ListCodecForAccept).
type tableList struct{}

// TableAccept says whether accept's first media range asks for a Table of meta.k8s.io (v1 or
// v1beta1) in JSON: what the apiserver answers such a request with.
func TableAccept(accept string) bool {
	mt, params := firstMediaRange(accept)
	if mt != "application/json" || params["as"] != "Table" || params["g"] != "meta.k8s.io" {
		return false
	}
	return params["v"] == "v1" || params["v"] == "v1beta1"
}

// AcceptAs is the transformation accept's first media range asks for ("Table",
// "PartialObjectMetadata"; its "as" parameter), "" for none.
func AcceptAs(accept string) string {
	_, params := firstMediaRange(accept)
	return params["as"]
}

func firstMediaRange(accept string) (string, map[string]string) {
	first, _, _ := strings.Cut(accept, ",")
	mt, params, err := mime.ParseMediaType(strings.TrimSpace(first))
	if err != nil {
		return "", nil
	}
	return mt, params
}

// ListCodecForAccept is the ListCodec of a watch or list answered in format to a request with
// accept: the Table codec for a Table (TableAccept), nil for another transformation ("as="
// of another kind: its objects are not the list's items as a watch sends them), else
// ListCodecFor(format).
func ListCodecForAccept(format Format, accept string) ListCodec {
	switch {
	case !strings.Contains(accept, "as="):
		return ListCodecFor(format)
	case format == JSON && TableAccept(accept):
		return tableList{}
	}
	return nil
}

// IsTable says whether c is the Table codec.
func IsTable(c ListCodec) bool {
	_, ok := c.(tableList)
	return ok
}

func (tableList) Accept() string { return "application/json;as=Table;v=v1;g=meta.k8s.io" }

// tablePage is a Table as decoded: its rows' bytes kept.
type tablePage struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Metadata   struct {
		ResourceVersion string `json:"resourceVersion"`
		Continue        string `json:"continue"`
	} `json:"metadata"`
	Rows []json.RawMessage `json:"rows"`
}

func tableAPIVersion(v string) bool { return v == "meta.k8s.io/v1" || v == "meta.k8s.io/v1beta1" }

func (tableList) DecodeList(body []byte) (*ListPage, error) {
	var t tablePage
	if err := json.Unmarshal(body, &t); err != nil {
		return nil, err
	}
	if t.Kind != "Table" || !tableAPIVersion(t.APIVersion) {
		return nil, fmt.Errorf("a %s %s where a Table was asked for", t.APIVersion, t.Kind)
	}
	p := &ListPage{Kind: t.Kind, APIVersion: t.APIVersion, ResourceVersion: t.Metadata.ResourceVersion, Continue: t.Metadata.Continue,
		Items: make([][]byte, len(t.Rows))}
	for i, r := range t.Rows {
		p.Items[i] = r
	}
	return p, nil
}

// rowIdentity is the identity of a Table row: its object's metadata.
func rowIdentity(row []byte) (key string, uid string, rv uint64, err error) {
	var r struct {
		Object *itemMeta `json:"object"`
	}
	if err := json.Unmarshal(row, &r); err != nil {
		return "", "", 0, fmt.Errorf("a Table row: %w", err)
	}
	if r.Object == nil {
		return "", "", 0, errors.New("a Table row without its object (includeObject=None)")
	}
	m := r.Object.Metadata
	rv, ok := ParseRV(m.ResourceVersion)
	if m.Name == "" || !ok {
		return "", "", 0, fmt.Errorf("a Table row without a name or an integer resourceVersion (%q)", m.ResourceVersion)
	}
	return m.Namespace + "/" + m.Name, m.UID, rv, nil
}

// tableOf is the Table of kind and apiVersion of the one row row at resourceVersion rv, as a
// watch sends it after its first event.
func tableOf(apiVersion, rv string, row []byte) []byte {
	obj := append([]byte(`{"kind":"Table","apiVersion":`), jsonString(apiVersion)...)
	obj = append(append(append(obj, `,"metadata":{"resourceVersion":`...), jsonString(rv)...), `},"columnDefinitions":null,"rows":[`...)
	obj = append(obj, row...)
	return append(obj, "]}"...)
}

func (tableList) Item(kind, apiVersion string, raw []byte) (string, ListItem, error) {
	if kind != "Table" || !tableAPIVersion(apiVersion) {
		return "", ListItem{}, fmt.Errorf("a row of a %s %s", apiVersion, kind)
	}
	key, uid, rv, err := rowIdentity(raw)
	if err != nil {
		return "", ListItem{}, err
	}
	return key, ListItem{UID: uid, RV: rv, Object: tableOf(apiVersion, fmt.Sprint(rv), raw)}, nil
}

// RowOf is the identity of the one row of a Table watch event's frame (its object's
// namespace/name, uid and resourceVersion): what a Table watch's state keys it by.
func RowOf(frame []byte) (key, uid string, rv uint64, err error) {
	var e struct {
		Object *tablePage `json:"object"`
	}
	if err := json.Unmarshal(frame, &e); err != nil {
		return "", "", 0, err
	}
	if e.Object == nil || e.Object.Kind != "Table" || len(e.Object.Rows) != 1 {
		return "", "", 0, errors.New("not a Table of one row")
	}
	return rowIdentity(e.Object.Rows[0])
}

// Bookmark is a Table of no row at rv. (The apiserver transforms a bookmark too: a row of the
// bookmark's empty object, with the resource's cells; a bookmark means only its
// resourceVersion to a client.)
func (tableList) Bookmark(_, apiVersion, rv string) []byte { return tableOf(apiVersion, rv, nil) }

// jsonString is s as a JSON string.
func jsonString(s string) []byte {
	b, _ := json.Marshal(s) // a string always marshals
	return b
}

// ObjectOf is the Table of a frame, as a mid-stream event carries it: a stream's first event's
// columnDefinitions are left out (null).
func (tableList) ObjectOf(frame []byte) ([]byte, error) {
	var e struct {
		Object *tablePage `json:"object"`
	}
	if err := json.Unmarshal(frame, &e); err != nil {
		return nil, err
	}
	if e.Object == nil || e.Object.Kind != "Table" || !tableAPIVersion(e.Object.APIVersion) || len(e.Object.Rows) != 1 {
		return nil, errors.New("not a Table of one row")
	}
	return tableOf(e.Object.APIVersion, e.Object.Metadata.ResourceVersion, e.Object.Rows[0]), nil
}

func (tableList) Frame(typ string, obj []byte) []byte { return jsonList{}.Frame(typ, obj) }
