package stream

import (
	"bytes"
	"strings"
	"testing"
)

// tableListBody is a Table list as kube-apiserver 1.37.2 answers kubectl's list of configmaps
// (captured; the column descriptions shortened).
const tableListBody = `{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"215"},"columnDefinitions":[{"name":"Name","type":"string","format":"name","description":"Name must be unique","priority":0},{"name":"Data","type":"string","format":"","description":"Data","priority":0},{"name":"Age","type":"string","format":"","description":"CreationTimestamp","priority":0}],"rows":[{"cells":["a",1,"0s"],"object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"a","namespace":"default","uid":"a1a3e063","resourceVersion":"215","creationTimestamp":"2026-12-07T11:15:01Z"}}},{"cells":["b",0,"3s"],"object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"b","namespace":"default","uid":"29a9e98a","resourceVersion":"214","creationTimestamp":"2026-12-07T11:15:03Z"}}}]}`

// tableFirstEvent is a Table watch's first event as the apiserver sends it (captured, the
// descriptions shortened): the only one with columnDefinitions.
const tableFirstEvent = `{"type":"ADDED","object":{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"216"},"columnDefinitions":[{"name":"Name","type":"string","format":"name","description":"Name","priority":0}],"rows":[{"cells":["b",0,"0s"],"object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"b","namespace":"default","uid":"29a9e98a","resourceVersion":"216","creationTimestamp":"2026-12-07T11:15:03Z"}}}]}}` + "\n"

// A Table list's rows are its items, each keyed by its object's namespace/name with the
// object's uid and resourceVersion, made the Table of one row a watch sends after its first
// event (columnDefinitions null, the Table's resourceVersion the object's), which the Reader
// reads at that resourceVersion and RowOf keys as the list did.
func TestTableListRowsAreWatchEvents(t *testing.T) {
	c := ListCodecForAccept(JSON, "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json")
	if !IsTable(c) {
		t.Fatalf("kubectl's Accept gives %T, want the Table codec", c)
	}
	p, err := c.DecodeList([]byte(tableListBody))
	if err != nil || p.Kind != "Table" || p.ResourceVersion != "215" || len(p.Items) != 2 {
		t.Fatalf("decoded %+v, %v", p, err)
	}
	key, it, err := c.Item(p.Kind, p.APIVersion, p.Items[1])
	if err != nil || key != "default/b" || it.UID != "29a9e98a" || it.RV != 214 {
		t.Fatalf("row 1: %q %+v %v", key, it, err)
	}
	want := `{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"214"},"columnDefinitions":null,"rows":[{"cells":["b",0,"3s"],"object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"b","namespace":"default","uid":"29a9e98a","resourceVersion":"214","creationTimestamp":"2026-12-07T11:15:03Z"}}}]}`
	if string(it.Object) != want {
		t.Fatalf("row 1 as an event's object:\n%s\nwant\n%s", it.Object, want)
	}
	frame := c.Frame(Deleted, it.Object)
	ev, err := NewReader(JSON, bytes.NewReader(frame), 1<<20).Next()
	if err != nil || ev.Type != Deleted || ev.RV != "214" {
		t.Fatalf("the frame reads as %+v, %v", ev, err)
	}
	if k, uid, rv, err := RowOf(frame); k != key || uid != it.UID || rv != it.RV || err != nil {
		t.Fatalf("RowOf: %q %q %d %v", k, uid, rv, err)
	}
	obj, err := c.ObjectOf([]byte(tableFirstEvent))
	if err != nil || !strings.Contains(string(obj), `"columnDefinitions":null`) || !strings.Contains(string(obj), `"resourceVersion":"216"`) {
		t.Fatalf("the object of a first event, as a later event carries it: %s, %v", obj, err)
	}
	if b := c.Bookmark("Table", "meta.k8s.io/v1", "300"); !strings.Contains(string(b), `"metadata":{"resourceVersion":"300"}`) {
		t.Fatalf("bookmark %s", b)
	}
}

// What is not a Table of rows with objects is refused: another kind, a row without its
// object (includeObject=None), an Accept of another transformation.
func TestTableListRefusesWhatItCannotKey(t *testing.T) {
	c := tableList{}
	if _, err := c.DecodeList([]byte(`{"kind":"ConfigMapList","apiVersion":"v1","metadata":{},"items":[]}`)); err == nil {
		t.Error("a ConfigMapList decoded as a Table")
	}
	if _, _, err := c.Item("Table", "meta.k8s.io/v1", []byte(`{"cells":["a"]}`)); err == nil {
		t.Error("a row without its object was keyed")
	}
	for accept, table := range map[string]bool{
		"application/json;as=Table;v=v1;g=meta.k8s.io":                        true,
		"application/json;as=Table;v=v1beta1;g=meta.k8s.io, application/json": true,
		"application/json": false,
		"application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io":    false,
		"application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io": false,
		"application/json, application/json;as=Table;v=v1;g=meta.k8s.io":  false,
	} {
		if TableAccept(accept) != table {
			t.Errorf("TableAccept(%q) = %v", accept, !table)
		}
	}
	if ListCodecForAccept(JSON, "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io") != nil {
		t.Error("a codec for metadata-only objects")
	}
}

// FuzzTableList: decoding a Table list and making watch events of its rows never panics, and
// every row keyed makes a frame that RowOf keys the same and ObjectOf gives back.
func FuzzTableList(f *testing.F) {
	f.Add([]byte(tableListBody))
	f.Add([]byte(tableFirstEvent))
	f.Add([]byte(`{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"1"},"rows":[{"object":null},{"object":{"metadata":{"name":"\u0000","resourceVersion":"2"}}}]}`))
	c := tableList{}
	f.Fuzz(func(t *testing.T, body []byte) {
		_, _ = c.ObjectOf(body)
		_, _, _, _ = RowOf(body)
		p, err := c.DecodeList(body)
		if err != nil {
			return
		}
		_ = c.Bookmark(p.Kind, p.APIVersion, p.ResourceVersion)
		for _, raw := range p.Items {
			key, it, err := c.Item(p.Kind, p.APIVersion, raw)
			if err != nil {
				continue
			}
			frame := c.Frame(Modified, it.Object)
			if k, uid, rv, err := RowOf(frame); err != nil || k != key || uid != it.UID || rv != it.RV {
				t.Fatalf("a row keyed %q %+v keys as %q %q %d (%v)", key, it, k, uid, rv, err)
			}
			ev, err := NewReader(JSON, bytes.NewReader(frame), len(frame)+1).Next()
			if err != nil || ev.RVInt != it.RV {
				t.Fatalf("the frame %s reads as %+v (%v)", frame, ev, err)
			}
			obj, err := c.ObjectOf(frame)
			if err != nil || !bytes.Equal(obj, it.Object) {
				t.Fatalf("the object of a frame made of %s is %s (%v)", it.Object, obj, err)
			}
		}
	})
}
