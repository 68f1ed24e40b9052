package stream

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Hand-built CBOR and protobuf events in shapes the apiserver does not write but a decoder
// accepts, each checked against the oracle.

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func cbHead(major byte, n uint64) []byte { return appendCBORHead(nil, major, n) }
func cbBytes(s string) []byte            { return cat(cbHead(2, uint64(len(s))), []byte(s)) }
func cbText(s string) []byte             { return cat(cbHead(3, uint64(len(s))), []byte(s)) }
func cbTag(item []byte) []byte           { return cat([]byte{0xd9, 0xd9, 0xf7}, item) }
func cbMap(pairs ...[]byte) []byte       { return cat(cbHead(5, uint64(len(pairs)/2)), cat(pairs...)) }
func cbIndefMap(pairs ...[]byte) []byte  { return cat([]byte{0xbf}, cat(pairs...), []byte{0xff}) }
func cbIndef(major byte, chunks ...string) []byte {
	b := []byte{major<<5 | 31}
	for _, c := range chunks {
		b = append(b, cbHead(major, uint64(len(c)))...)
		b = append(b, c...)
	}
	return append(b, 0xff)
}

func cbEvent(typ []byte, object []byte) []byte {
	return cbTag(cbMap(cbBytes("type"), typ, cbBytes("object"), object))
}

func cbConfigMap(meta []byte) []byte {
	return cbTag(cbMap(cbBytes("apiVersion"), cbBytes("v1"), cbBytes("kind"), cbBytes("ConfigMap"), cbBytes("metadata"), meta))
}

func TestCBORShapes(t *testing.T) {
	ok := map[string][]byte{
		"text strings": cbEvent(cbText("ADDED"), cbTag(cbMap(cbText("apiVersion"), cbText("v1"), cbText("kind"), cbText("ConfigMap"),
			cbText("metadata"), cbMap(cbText("name"), cbText("a"), cbText("resourceVersion"), cbText("17"), cbText("uid"), cbText("u-1"))))),
		"indefinite strings": cbEvent(cbIndef(2, "MOD", "IFIED"), cbConfigMap(cbMap(
			cbIndef(2, "resource", "Version"), cbIndef(2, "1", "2", "3"), cbBytes("namespace"), cbIndef(3, "te", "am"), cbBytes("name"), cbIndef(2)))),
		"indefinite maps": cbTag(cbIndefMap(cbBytes("object"), cbTag(cbIndefMap(cbBytes("kind"), cbBytes("Pod"), cbBytes("apiVersion"), cbBytes("v1"),
			cbBytes("metadata"), cbIndefMap(cbBytes("annotations"), cbIndefMap(cbBytes(InitialEventsEndAnnotation), cbBytes("true")),
				cbBytes("resourceVersion"), cbBytes("99")))), cbBytes("type"), cbBytes("BOOKMARK"))),
		"object without its tag": cbEvent(cbBytes("DELETED"), cbMap(cbBytes("apiVersion"), cbBytes("v1"), cbBytes("kind"), cbBytes("ConfigMap"),
			cbBytes("metadata"), cbMap(cbBytes("resourceVersion"), cbBytes("5")))),
		"nested self-described tags": cbEvent(cbBytes("ADDED"), cbTag(cbConfigMap(cbMap(cbBytes("resourceVersion"), cbBytes("6"))))),
		"long rv head": cbEvent(cbBytes("ADDED"), cbConfigMap(cbMap(cbBytes("resourceVersion"),
			[]byte{0x5a, 0, 0, 0, 2, '4', '2'}))), // a 2-byte string with a 4-byte length
		"other values skipped": cbEvent(cbBytes("ADDED"), cbTag(cbMap(cbBytes("apiVersion"), cbBytes("v1"), cbBytes("kind"), cbBytes("ConfigMap"),
			cbBytes("data"), cbMap(cbBytes("k"), cbIndef(2, "x", "y")), cbBytes("metadata"), cbMap(cbBytes("labels"), cbMap(cbBytes("a"), cbBytes("b")),
				cbBytes("resourceVersion"), cbBytes("8"), cbBytes("generation"), []byte{0x19, 0x01, 0x00}, cbBytes("deletionGracePeriodSeconds"), []byte{0x20})))),
	}
	for name, s := range ok {
		t.Run(name, func(t *testing.T) {
			stream := cat(s, s) // two in a row
			if got := checkHandmade(t, CBOR, stream); got == nil {
				t.Fatal("oracle rejected a valid case")
			}
		})
	}
	// The RV's string type survives a rewrite.
	evs, err := readAll(CBOR, bytes.NewReader(ok["text strings"]), 0)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := NewWriter(CBOR, &out).WriteWithRV(evs[0], "1234"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out.Bytes(), cbText("1234")) {
		t.Fatalf("rewritten RV is not a text string: %x", out.Bytes())
	}
	if err := NewWriter(CBOR, &out).WriteWithRV(evs[0], "\xff"); !errors.Is(err, ErrMalformed) {
		t.Fatalf("invalid UTF-8 into a text string: %v", err)
	}

	bad := map[string][]byte{
		"duplicate type":    cbTag(cbMap(cbBytes("type"), cbBytes("ADDED"), cbBytes("type"), cbBytes("DELETED"))),
		"duplicate rv":      cbEvent(cbBytes("ADDED"), cbConfigMap(cbMap(cbBytes("resourceVersion"), cbBytes("5"), cbBytes("resourceVersion"), cbBytes("6")))),
		"not a map":         cbTag(cbBytes("ADDED")),
		"rv is an integer":  cbEvent(cbBytes("ADDED"), cbConfigMap(cbMap(cbBytes("resourceVersion"), []byte{0x05}))),
		"object is a list":  cbEvent(cbBytes("ADDED"), []byte{0x80}),
		"other tag":         cat([]byte{0xc1}, cbMap(cbBytes("type"), cbBytes("ADDED"))),
		"stray break":       []byte{0xff},
		"odd indef map":     cbTag(cat([]byte{0xbf}, cbBytes("type"), []byte{0xff})),
		"reserved info":     []byte{0x1c},
		"bad simple":        []byte{0xf8, 0x10},
		"bad indef chunk":   cbEvent(cat([]byte{0x5f}, cbText("A"), []byte{0xff}), cbMap()),
		"indefinite int":    []byte{0x1f},
		"nested indef text": cat([]byte{0x7f, 0x7f}, []byte{0xff, 0xff}),
	}
	for name, s := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := readAll(CBOR, bytes.NewReader(s), 0)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("got %v, want ErrMalformed", err)
			}
		})
	}
}

// TestCBORTagsReadAsApimachinery puts tags in front of every item of an event, in every string
// form, and checks the reader against apimachinery wherever apimachinery decodes the event:
// same fields, and a rewrite that decodes with the new RV. apimachinery skips tags it does not
// know, accepts tag 0 only in front of a text string, and under tags 21-23 reads a byte string
// into a Go string as its base64url, base64 or hex encoding, a tag in front of a map applying
// to every byte string inside it (RFC 8949 section 3.4.5.2).
func TestCBORTagsReadAsApimachinery(t *testing.T) {
	positions := []string{"envelope", "envelope map", "type key", "type", "object", "object map",
		"apiVersion", "kind", "data", "data value", "metadata key", "metadata", "uid", "rv key", "rv",
		"name", "annotations", "annotation key", "annotation value"}
	tagSets := [][]uint64{{0}, {1}, {2}, {3}, {21}, {22}, {23}, {24}, {32}, {12336}, {55799}, {21, 22},
		{22, 21}, {21, 55799}, {55799, 21}, {0, 21}, {21, 0}, {24, 21}, {21, 24}, {55799, 55799, 0}, {24, 55799, 23}}
	// The strings' forms: byte strings; text strings; byte strings but for the type, kind and
	// apiVersion (which a later encoding would make unknown); indefinite-length byte strings.
	forms := []string{"bytes", "text", "bytes, text kind", "indefinite bytes"}
	event := func(pos string, tags []byte, form, typ string) []byte {
		at := func(p string, item []byte) []byte {
			if p == pos {
				return cat(tags, item)
			}
			return item
		}
		str, hdr := cbBytes, cbBytes
		switch form {
		case "text":
			str, hdr = cbText, cbText
		case "bytes, text kind":
			hdr = cbText
		case "indefinite bytes":
			str = func(v string) []byte { return cbIndef(2, v[:1], v[1:]) }
		}
		ann := cbMap(at("annotation key", cbBytes(InitialEventsEndAnnotation)), at("annotation value", str("true")))
		meta := cbMap(cbBytes("uid"), at("uid", []byte{cborNull}), at("rv key", cbBytes("resourceVersion")), at("rv", str("17")),
			cbBytes("name"), at("name", str("nm")), cbBytes("annotations"), at("annotations", ann))
		obj := cbMap(cbBytes("apiVersion"), at("apiVersion", hdr("v1")), cbBytes("kind"), at("kind", hdr("ConfigMap")),
			cbBytes("data"), at("data", cbMap(cbBytes("k"), at("data value", cbBytes("v")))),
			at("metadata key", cbBytes("metadata")), at("metadata", meta))
		env := cbMap(at("type key", cbBytes("type")), at("type", hdr(typ)), cbBytes("object"), at("object", cbTag(at("object map", obj))))
		return at("envelope", cbTag(at("envelope map", env)))
	}
	decoded, converted := 0, 0
	for _, form := range forms {
		for _, pos := range positions {
			for _, ts := range tagSets {
				var tags []byte
				for _, n := range ts {
					tags = appendCBORHead(tags, 6, n)
				}
				for _, typ := range []string{"ADDED", "BOOKMARK"} {
					s := event(pos, tags, form, typ)
					want, oerr := decodeOracle(t, CBOR, s)
					if oerr != nil {
						continue // the reader may reject it or not: a client would fail on it
					}
					decoded++
					got, err := readAll(CBOR, bytes.NewReader(s), 0)
					if err != nil || len(got) != len(want) {
						t.Fatalf("%s, tags %v before the %s, %s: apimachinery decodes %d events, the reader %d, %v", form, ts, pos, typ, len(want), len(got), err)
					}
					exp := expected(t, want[0])
					if err := sameFields(got[0], &exp); err != nil {
						t.Fatalf("%s, tags %v before the %s, %s: %v", form, ts, pos, typ, err)
					}
					if exp.RV != "17" {
						converted++
					}
					var out bytes.Buffer
					if err := NewWriter(CBOR, &out).WriteWithRV(got[0], "424242"); err != nil {
						t.Fatalf("%s, tags %v before the %s: rewrite: %v", form, ts, pos, err)
					}
					if re, err := decodeOracle(t, CBOR, out.Bytes()); err != nil || len(re) != 1 || rvOf(t, re[0]) != "424242" {
						t.Fatalf("%s, tags %v before the %s: the rewrite decodes as %v, %v", form, ts, pos, re, err)
					}
				}
			}
		}
	}
	// Counted with apimachinery v0.37.2 and fxamacker/cbor v2.9.1: 1,566 of 3,192 decode, 160
	// of them with an RV a later encoding changed. Far fewer means the cases no longer test tags.
	if decoded < 1400 || converted < 120 {
		t.Fatalf("apimachinery decoded %d cases, %d with a converted RV: the cases went stale", decoded, converted)
	}
}

func pbBytesField(num protowire.Number, v []byte) []byte {
	b := protowire.AppendTag(nil, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// pbLongField writes a length-delimited field with a non-minimal (padded) length varint.
func pbLongField(num protowire.Number, v []byte) []byte {
	b := protowire.AppendTag(nil, num, protowire.BytesType)
	n := len(v)
	b = append(b, byte(n&0x7f|0x80), byte(n>>7&0x7f|0x80), byte(n>>14))
	return append(b, v...)
}

func pbFrame(msg []byte) []byte {
	return cat([]byte{byte(len(msg) >> 24), byte(len(msg) >> 16), byte(len(msg) >> 8), byte(len(msg))}, msg)
}

func pbObject(kind string, object []byte) []byte {
	typeMeta := cat(pbBytesField(1, []byte("v1")), pbBytesField(2, []byte(kind)))
	unknown := cat(pbBytesField(1, typeMeta), pbBytesField(2, object))
	return cat(protobufMagic, unknown)
}

func marshal(t *testing.T, m interface{ Marshal() ([]byte, error) }) []byte {
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestProtobufShapes(t *testing.T) {
	meta1 := marshal(t, &metav1.ObjectMeta{Name: "a", Namespace: "n"})
	meta2 := marshal(t, &metav1.ObjectMeta{UID: "u-7", ResourceVersion: "31", Annotations: map[string]string{"x": "y"}})
	data := pbBytesField(2, cat(pbBytesField(1, []byte("key")), pbBytesField(2, []byte("value"))))
	cm := cat(pbBytesField(1, meta1), data, pbBytesField(1, meta2))
	status := marshal(t, &metav1.Status{ListMeta: metav1.ListMeta{ResourceVersion: "77"}, Status: "Failure", Code: 410, Reason: metav1.StatusReasonExpired})
	pod := marshal(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "12", Name: "p"}})

	ok := map[string][]byte{
		"object before type, unknown fields": pbFrame(cat(
			pbBytesField(2, pbBytesField(1, pbObject("ConfigMap", cm))),
			protowire.AppendVarint(protowire.AppendTag(nil, 7, protowire.VarintType), 300),
			pbBytesField(1, []byte("ADDED")))),
		"padded length varints": pbFrame(cat(pbBytesField(1, []byte("MODIFIED")),
			pbLongField(2, pbLongField(1, cat(protobufMagic, pbBytesField(1, cat(pbBytesField(1, []byte("v1")), pbBytesField(2, []byte("Pod")))),
				pbLongField(2, pbLongField(1, marshal(t, &metav1.ObjectMeta{Name: "p", ResourceVersion: "40"})))))))),
		"status with a list RV": pbFrame(cat(pbBytesField(1, []byte("ERROR")), pbBytesField(2, pbBytesField(1, pbObject("Status", status))))),
		"type repeated, last wins": pbFrame(cat(pbBytesField(1, []byte("ADDED")), pbBytesField(2, pbBytesField(1, pbObject("Pod", pod))),
			pbBytesField(1, []byte("DELETED")))),
		"object repeated, last raw wins": pbFrame(cat(pbBytesField(1, []byte("ADDED")),
			pbBytesField(2, pbBytesField(1, pbObject("ConfigMap", cm))),
			pbBytesField(2, pbBytesField(1, pbObject("Pod", pod))))),
	}
	for name, s := range ok {
		t.Run(name, func(t *testing.T) {
			if got := checkHandmade(t, Protobuf, cat(s, s)); got == nil {
				t.Fatal("oracle rejected a valid case")
			}
		})
	}

	bad := map[string][]byte{
		"no k8s prefix":      pbFrame(cat(pbBytesField(1, []byte("ADDED")), pbBytesField(2, pbBytesField(1, []byte("{}"))))),
		"type as varint":     pbFrame(protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 1)),
		"overrunning length": pbFrame(cat(protowire.AppendTag(nil, 1, protowire.BytesType), []byte{0x10, 'A'})),
		"field zero":         pbFrame([]byte{0x02, 0x00}),
		"bad rv wire type": pbFrame(cat(pbBytesField(1, []byte("ADDED")), pbBytesField(2, pbBytesField(1, pbObject("Pod",
			pbBytesField(1, protowire.AppendVarint(protowire.AppendTag(nil, 6, protowire.VarintType), 3))))))),
	}
	for name, s := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := readAll(Protobuf, bytes.NewReader(s), 0)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("got %v, want ErrMalformed", err)
			}
		})
	}
}

// TestProtobufFastPathsMatchSlow holds pbNext and pbMapEntry, whose fast paths decide common
// fields from a few bytes, to the general loops on every short input built from bytes that
// matter to them (tags of one and two bytes, wire types, lengths at the varint edges),
// at every limit.
func TestProtobufFastPathsMatchSlow(t *testing.T) {
	alphabet := []byte{0x00, 0x01, 0x02, 0x03, 0x08, 0x0a, 0x0f, 0x12, 0x7f, 0x80, 0x81, 0x8a, 0xff}
	raw := make([]byte, 4+200) // room for lengths up to 0x7f|0x01<<7
	buf := raw[:4]
	var fast, slow pbField
	fastHits := 0
	var walk func(n int)
	walk = func(n int) {
		if n < len(buf) {
			for _, c := range alphabet {
				buf[n] = c
				walk(n + 1)
			}
			return
		}
		for limit := 0; limit <= len(raw); limit += 1 + limit/8 {
			fast, slow = pbField{}, pbField{}
			fe, ferr := pbNext(&fast, raw, 0, limit)
			se, serr := pbNextSlow(&slow, raw, 0, limit)
			if (ferr == nil) != (serr == nil) || fe != se || (ferr == nil && fast != slow) {
				t.Fatalf("pbNext(% x, limit %d) = %d, %+v, %v; pbNextSlow = %d, %+v, %v", buf, limit, fe, fast, ferr, se, slow, serr)
			}
			if ferr == nil && limit > 0 {
				fastHits++
			}
			e := pbField{start: 0, end: min(limit, len(buf))}
			fk, fv, ferr := pbMapEntry(raw, &e, limit)
			sk, sv, serr := pbMapEntrySlow(raw, &e, limit)
			if (ferr == nil) != (serr == nil) || !bytes.Equal(fk, sk) || !bytes.Equal(fv, sv) || (fk == nil) != (sk == nil) || (fv == nil) != (sv == nil) {
				t.Fatalf("pbMapEntry(% x, entry %d, limit %d) = %q, %q, %v; pbMapEntrySlow = %q, %q, %v", buf, e.end, limit, fk, fv, ferr, sk, sv, serr)
			}
		}
	}
	walk(0)
	// Entries as the generated marshaller writes them, and with their fields swapped,
	// repeated, running past the entry or followed by another.
	for _, entry := range [][]byte{
		cat([]byte{0x0a, 3}, []byte("key"), []byte{0x12, 2}, []byte("vv")),
		cat([]byte{0x12, 2}, []byte("vv"), []byte{0x0a, 3}, []byte("key")),
		cat([]byte{0x0a, 1}, []byte("a"), []byte{0x0a, 1}, []byte("b"), []byte{0x12, 0}),
		cat([]byte{0x0a, 3}, []byte("key"), []byte{0x12, 4}, []byte("vv")),
		cat([]byte{0x0a, 1}, []byte("a"), []byte{0x12, 1}, []byte("b"), []byte{0x1a, 0}),
	} {
		raw := cat(entry, []byte("xxxx"))
		for end := 0; end <= len(entry); end++ {
			e := pbField{start: 0, end: end}
			fk, fv, ferr := pbMapEntry(raw, &e, len(raw))
			sk, sv, serr := pbMapEntrySlow(raw, &e, len(raw))
			if (ferr == nil) != (serr == nil) || !bytes.Equal(fk, sk) || !bytes.Equal(fv, sv) {
				t.Fatalf("entry % x to %d: pbMapEntry = %q, %q, %v; pbMapEntrySlow = %q, %q, %v", raw, end, fk, fv, ferr, sk, sv, serr)
			}
		}
	}
	if fastHits == 0 {
		t.Fatal("no input was a field")
	}
}
