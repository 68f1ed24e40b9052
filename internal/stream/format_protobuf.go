package stream

import (
	"bytes"
	"encoding/binary"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// Protobuf watch frames: a 4-byte big-endian length, then a metav1.WatchEvent message
//
//	WatchEvent   { 1: type string; 2: object RawExtension }
//	RawExtension { 1: raw bytes }            raw = "k8s\x00" + Unknown
//	Unknown      { 1: typeMeta {1: apiVersion, 2: kind}; 2: raw bytes; 3: contentEncoding; 4: contentType }
//	Unknown.raw  the object: { 1: metadata ObjectMeta, ... }
//	ObjectMeta   { 1: name; 3: namespace; 5: uid; 6: resourceVersion; 12: annotations (map entries {1: key, 2: value}) }
//	ListMeta     { 2: resourceVersion }      the metadata of Status, Table and lists
//
// Decoding follows the generated Kubernetes code: for a repeated bytes or string field the last
// occurrence wins, repeated message fields (metadata, typeMeta, object) merge.

// protobufMagic starts every protobuf-encoded Kubernetes object.
var protobufMagic = []byte("k8s\x00")

type pbSplitter struct{}

func (pbSplitter) reset()           {}
func (pbSplitter) bind(*parseState) {}

func (pbSplitter) split(b []byte, max int, _ arrival) (int, error) {
	if len(b) < 4 {
		return 0, nil
	}
	n := uint64(binary.BigEndian.Uint32(b))
	if n > uint64(max) {
		return 0, ErrFrameTooLarge
	}
	if uint64(len(b)) < 4+n {
		return 0, nil
	}
	return 4 + int(n), nil
}

// The field readers below decode as the generated Kubernetes code (gogo) does, no stricter, so
// that whatever a client can decode, the reader reads alike: a tag's field number is its
// varint shifted and truncated to int32; varints may take ten bytes; groups are skipped by
// depth, whatever numbers their end markers carry.

// pbField is one field of a message, located in the frame. For a length-delimited field, len
// is its length varint and [start, end) its content.
type pbField struct {
	num        int32
	typ        protowire.Type
	len        pbLen
	start, end int
}

// pbVarint reads the varint at raw[i:limit].
func pbVarint(raw []byte, i, limit int) (uint64, int, error) {
	var v uint64
	for shift := uint(0); ; shift += 7 {
		if shift >= 64 {
			return 0, 0, malformed("protobuf varint at %d overflows", i)
		}
		if i >= limit {
			return 0, 0, malformed("truncated protobuf varint")
		}
		c := raw[i]
		i++
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v, i, nil
		}
	}
}

// pbLenField reads the length varint at i and locates the content after it, which must end by
// limit.
func pbLenField(raw []byte, i, limit int) (l pbLen, start, end int, err error) {
	v, j, err := pbVarint(raw, i, limit)
	if err != nil {
		return pbLen{}, 0, 0, err
	}
	if n := int(v); n < 0 || n > limit-j {
		return pbLen{}, 0, 0, malformed("protobuf length at %d overruns its message", i)
	}
	return pbLen{start: i, end: j, val: v}, j, j + int(v), nil
}

// pbSkip returns the end of the field whose tag is at i, as the generated skipGenerated finds
// it; the field must end by limit.
func pbSkip(raw []byte, i, limit int) (int, error) {
	depth := 0
	for i < limit {
		wire, j, err := pbVarint(raw, i, limit)
		if err != nil {
			return 0, err
		}
		i = j
		switch protowire.Type(wire & 7) {
		case protowire.VarintType:
			if _, i, err = pbVarint(raw, i, limit); err != nil {
				return 0, err
			}
		case protowire.Fixed64Type:
			i += 8
		case protowire.BytesType:
			_, _, end, err := pbLenField(raw, i, limit)
			if err != nil {
				return 0, err
			}
			i = end
		case protowire.StartGroupType:
			depth++
		case protowire.EndGroupType:
			if depth == 0 {
				return 0, malformed("unexpected protobuf end group at %d", i)
			}
			depth--
		case protowire.Fixed32Type:
			i += 4
		default:
			return 0, malformed("illegal protobuf wire type %d at %d", wire&7, i)
		}
		if i > limit {
			return 0, malformed("protobuf field overruns its message")
		}
		if depth == 0 {
			return i, nil
		}
	}
	return 0, malformed("truncated protobuf group")
}

// pbNext reads the field at raw[i:limit] into *f and returns the index after it. (Filling f
// rather than returning it: returning the struct by value was a third of the parse's time.)
func pbNext(f *pbField, raw []byte, i, limit int) (int, error) {
	// The common cases, decided from a few bytes without a loop: a tag of one or two bytes
	// (field numbers 1-2047: ObjectMeta.managedFields is 17), then either a length below
	// 16 KiB or a varint of one byte (ObjectMeta.generation). They find exactly what
	// pbNextSlow would; every other case goes there.
	if limit > len(raw) || i+1 >= limit {
		return pbNextSlow(f, raw, i, limit)
	}
	t, j := uint32(raw[i]), i+1
	if t >= 0x80 {
		if raw[j] >= 0x80 {
			return pbNextSlow(f, raw, i, limit)
		}
		t, j = t&0x7f|uint32(raw[j])<<7, j+1
		if j >= limit {
			return pbNextSlow(f, raw, i, limit)
		}
	}
	if t>>3 == 0 {
		return pbNextSlow(f, raw, i, limit)
	}
	switch protowire.Type(t & 7) {
	case protowire.BytesType:
		start, v := j+1, uint64(raw[j])
		if v >= 0x80 {
			if j+1 >= limit || raw[j+1] >= 0x80 {
				return pbNextSlow(f, raw, i, limit)
			}
			start, v = j+2, v&0x7f|uint64(raw[j+1])<<7
		}
		if end := start + int(v); end <= limit {
			// Field by field: a composite literal is built on the stack and copied in
			// 16-byte moves, whose loads of the narrower stores just made cannot be
			// forwarded and stall (two thirds of pbNext's time at 1 KiB events).
			f.num, f.typ = int32(t>>3), protowire.BytesType
			f.len.start, f.len.end, f.len.val = j, start, v
			f.start, f.end = start, end
			return end, nil
		}
	case protowire.VarintType:
		if raw[j] < 0x80 {
			f.num, f.typ = int32(t>>3), protowire.VarintType
			f.len.start, f.len.end, f.len.val = 0, 0, 0
			f.start, f.end = 0, 0
			return j + 1, nil
		}
	}
	return pbNextSlow(f, raw, i, limit)
}

// pbSkipUnwanted returns the end of the field at raw[i:limit] when it is one the caller skips
// anyway, decided from its first two bytes: a length-delimited field with a one-byte tag whose
// number is not in want (a bit per field number 1-15) and a one-byte length. Otherwise it
// returns 0 and the caller reads the field with pbNext, which would find the same end.
func pbSkipUnwanted(raw []byte, i, limit int, want uint16) int {
	if i+1 >= limit || limit > len(raw) {
		return 0
	}
	t, l := raw[i], raw[i+1]
	if t >= 0x80 || l >= 0x80 || t&7 != 2 || t < 8 || want>>(t>>3)&1 != 0 || i+2+int(l) > limit {
		return 0
	}
	return i + 2 + int(l)
}

// pbNextSlow is pbNext for any field.
func pbNextSlow(f *pbField, raw []byte, i, limit int) (int, error) {
	wire, j, err := pbVarint(raw, i, limit)
	if err != nil {
		return 0, err
	}
	f.num, f.typ = int32(wire>>3), protowire.Type(wire&7)
	f.len, f.start, f.end = pbLen{}, 0, 0
	if f.typ == protowire.EndGroupType || f.num <= 0 {
		return 0, malformed("illegal protobuf tag %d at %d", wire, i)
	}
	if f.typ != protowire.BytesType {
		return pbSkip(raw, i, limit)
	}
	if f.len, f.start, f.end, err = pbLenField(raw, j, limit); err != nil {
		return 0, err
	}
	return f.end, nil
}

// copyField sets *dst to *src field by field. Assigning the struct would copy it in 16-byte
// moves, and a field the readers just wrote is in narrower stores that such a load cannot
// take from the store buffer: it waits for them to reach the cache (pbNext's comment).
func copyField(dst, src *pbField) {
	dst.num, dst.typ = src.num, src.typ
	dst.len.start, dst.len.end, dst.len.val = src.len.start, src.len.end, src.len.val
	dst.start, dst.end = src.start, src.end
}

// bytesField insists that a field the schema declares length-delimited is, as the generated
// code does for the fields it knows.
func bytesField(f *pbField, what string) error {
	if f.typ != protowire.BytesType {
		return malformed("protobuf %s has wire type %d", what, f.typ)
	}
	return nil
}

func (ps *parseState) parseProtobuf(raw []byte) error {
	// WatchEvent: find the type and the last RawExtension.raw, with the object field that
	// holds it.
	var object, ext pbField
	haveExt := false
	for i := 4; i < len(raw); {
		var f pbField
		next, err := pbNext(&f, raw, i, len(raw))
		if err != nil {
			return err
		}
		switch f.num {
		case 1:
			if err := bytesField(&f, "WatchEvent.type"); err != nil {
				return err
			}
			ps.typ = raw[f.start:f.end]
		case 2:
			if err := bytesField(&f, "WatchEvent.object"); err != nil {
				return err
			}
			for j := f.start; j < f.end; {
				var g pbField
				next, err := pbNext(&g, raw, j, f.end)
				if err != nil {
					return err
				}
				if g.num == 1 {
					if err := bytesField(&g, "RawExtension.raw"); err != nil {
						return err
					}
					copyField(&object, &f)
					copyField(&ext, &g)
					haveExt = true
				}
				j = next
			}
		}
		i = next
	}
	if !haveExt || ext.start == ext.end {
		return nil
	}
	if !bytes.HasPrefix(raw[ext.start:ext.end], protobufMagic) {
		return malformed("protobuf watch event object lacks the k8s protobuf prefix")
	}

	// Unknown: the kind and the object's bytes.
	var kind []byte
	var obj pbField
	haveObj := false
	for i := ext.start + len(protobufMagic); i < ext.end; {
		var f pbField
		next, err := pbNext(&f, raw, i, ext.end)
		if err != nil {
			return err
		}
		switch f.num {
		case 1:
			if err := bytesField(&f, "Unknown.typeMeta"); err != nil {
				return err
			}
			for j := f.start; j < f.end; {
				var g pbField
				next, err := pbNext(&g, raw, j, f.end)
				if err != nil {
					return err
				}
				if g.num == 2 {
					if err := bytesField(&g, "TypeMeta.kind"); err != nil {
						return err
					}
					kind = raw[g.start:g.end]
				}
				j = next
			}
		case 2:
			if err := bytesField(&f, "Unknown.raw"); err != nil {
				return err
			}
			copyField(&obj, &f)
			haveObj = true
		case 3, 4:
			if err := bytesField(&f, "Unknown content field"); err != nil {
				return err
			}
		}
		i = next
	}
	if !haveObj {
		return nil
	}
	k := string(kind) // no allocation: only compared
	if noMetadata(k) {
		return nil
	}
	listMeta := k == "Status" || k == "Table" || strings.HasSuffix(k, "List")

	// The object: every occurrence of field 1 is (part of) its metadata.
	for i := obj.start; i < obj.end; {
		if end := pbSkipUnwanted(raw, i, obj.end, 1<<1); end > 0 {
			i = end // a ConfigMap's data entries, a Pod's spec, ...
			continue
		}
		var f pbField
		next, err := pbNext(&f, raw, i, obj.end)
		if err != nil {
			return err
		}
		if f.num == 1 {
			if err := bytesField(&f, "metadata"); err != nil {
				return err
			}
			if err := ps.pbMetadata(raw, listMeta, [4]pbLen{object.len, ext.len, obj.len, f.len}, &f); err != nil {
				return err
			}
		}
		i = next
	}
	return nil
}

// pbMetadata reads one occurrence of the object's metadata; outer are the length fields that
// enclose it, outermost first.
func (ps *parseState) pbMetadata(raw []byte, listMeta bool, outer [4]pbLen, m *pbField) error {
	rvField := int32(6)
	if listMeta {
		rvField = 2
	}
	want := uint16(1<<1 | 1<<3 | 1<<5 | 1<<6 | 1<<12)
	if listMeta {
		want = 1 << 2
	}
	for i := m.start; i < m.end; {
		if end := pbSkipUnwanted(raw, i, m.end, want); end > 0 {
			i = end // labels, creationTimestamp, ...
			continue
		}
		var f pbField
		next, err := pbNext(&f, raw, i, m.end)
		if err != nil {
			return err
		}
		i = next
		if f.num == rvField {
			if err := bytesField(&f, "resourceVersion"); err != nil {
				return err
			}
			ps.rv = raw[f.start:f.end]
			ps.loc = rvLocation{format: Protobuf, start: f.start, end: f.end, nlens: maxLens}
			copy(ps.loc.lens[:], outer[:])
			ps.loc.lens[4] = f.len
			continue
		}
		if listMeta {
			continue
		}
		switch f.num {
		case 1:
			if err := bytesField(&f, "name"); err != nil {
				return err
			}
			ps.name = raw[f.start:f.end]
		case 3:
			if err := bytesField(&f, "namespace"); err != nil {
				return err
			}
			ps.ns = raw[f.start:f.end]
		case 5:
			if err := bytesField(&f, "uid"); err != nil {
				return err
			}
			ps.uid = raw[f.start:f.end]
		case 12:
			if err := bytesField(&f, "annotations"); err != nil {
				return err
			}
			key, val, err := pbMapEntry(raw, &f, m.end)
			if err != nil {
				return err
			}
			if string(key) == InitialEventsEndAnnotation {
				ps.initialEventsEnd = string(val) == "true"
			}
		}
	}
	return nil
}

// pbMapEntry reads a map<string,string> entry as the generated code does: fields 1 and 2 are
// taken as strings whatever their wire type, and may reach past the entry up to the end of the
// enclosing message (limit); anything else is skipped within the entry.
func pbMapEntry(raw []byte, e *pbField, limit int) (key, val []byte, err error) {
	// The generated marshaller's entry: the key, then the value, each with a one-byte tag and
	// a one-byte length, filling the entry exactly. The loop below reads it alike.
	if s := e.start; s+2 <= e.end && e.end <= len(raw) && raw[s] == 0x0a && raw[s+1] < 0x80 {
		if k := s + 2 + int(raw[s+1]); k+2 <= e.end && raw[k] == 0x12 && raw[k+1] < 0x80 && k+2+int(raw[k+1]) == e.end {
			return raw[s+2 : k], raw[k+2 : e.end], nil
		}
	}
	return pbMapEntrySlow(raw, e, limit)
}

// pbMapEntrySlow is pbMapEntry for any entry.
func pbMapEntrySlow(raw []byte, e *pbField, limit int) (key, val []byte, err error) {
	for j := e.start; j < e.end; {
		wire, k, err := pbVarint(raw, j, limit)
		if err != nil {
			return nil, nil, err
		}
		switch int32(wire >> 3) {
		case 1, 2:
			_, start, end, err := pbLenField(raw, k, limit)
			if err != nil {
				return nil, nil, err
			}
			if int32(wire>>3) == 1 {
				key = raw[start:end]
			} else {
				val = raw[start:end]
			}
			j = end
		default:
			if j, err = pbSkip(raw, j, e.end); err != nil {
				return nil, nil, err
			}
		}
	}
	return key, val, nil
}

// noMetadata lists the kinds whose field 1 is not metadata (options, discovery and
// WatchEvent). None is ever the object of a watch event; they are here so that a frame
// carrying one is read as apimachinery reads it.
func noMetadata(kind string) bool {
	switch kind {
	case "APIVersions", "APIGroup", "APIResource", "WatchEvent", "SerializedReference":
		return true
	}
	return strings.HasSuffix(kind, "Options")
}

// rewriteProtobuf appends to dst the frame raw with its resourceVersion replaced by rv and
// every enclosing length re-encoded.
func rewriteProtobuf(dst, raw []byte, loc *rvLocation, rv string) ([]byte, error) {
	if loc.nlens < 1 || loc.nlens > maxLens {
		return nil, malformed("no resourceVersion to rewrite")
	}
	// From the innermost length out: each grows by what the content inside it grew by, and
	// passes on that plus any change in its own varint's size.
	var newVals [maxLens]uint64
	delta := int64(len(rv)) - int64(loc.end-loc.start)
	for k := loc.nlens - 1; k >= 0; k-- {
		l := loc.lens[k]
		nv := int64(l.val) + delta
		if nv < 0 {
			return nil, malformed("inconsistent protobuf lengths")
		}
		newVals[k] = uint64(nv)
		delta += int64(protowire.SizeVarint(uint64(nv))) - int64(l.end-l.start)
	}
	frame := int64(binary.BigEndian.Uint32(raw)) + delta
	if frame < 0 || frame > 1<<32-1 {
		return nil, malformed("rewritten protobuf frame does not fit its length prefix")
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(frame))
	prev := 4
	for k := 0; k < loc.nlens; k++ {
		l := loc.lens[k]
		dst = append(dst, raw[prev:l.start]...)
		dst = protowire.AppendVarint(dst, newVals[k])
		prev = l.end
	}
	dst = append(dst, raw[prev:loc.start]...)
	dst = append(dst, rv...)
	return append(dst, raw[loc.end:]...), nil
}
