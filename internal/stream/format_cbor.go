package stream

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"unicode/utf8"
)

// CBOR watch frames (RFC 8742 sequence, "application/cbor-seq"): each event is one data item,
// the self-described tag 55799 (0xd9d9f7) around a map {"type": string, "object": item}, and
// the object is itself a tagged map whose "metadata" map holds the fields we read. The
// apiserver encodes strings and keys as byte strings (major type 2); text strings (3) and
// indefinite-length strings are read as well, as apimachinery's decoder accepts them. Map
// order is not relied on (the apiserver shuffles it). A repeated key among those read is
// malformed, as apimachinery's decoder rejects duplicate keys. Tags are read as apimachinery's
// decoder reads them (untag), some of which change a byte string's value.

const (
	cborSelfDescribed = 55799
	cborBreak         = 0xff
	cborNull          = 0xf6
	cborUndefined     = 0xf7

	// RFC 8949 section 3.4.5.2: expected conversion of byte strings to base64url (without
	// padding), base64 and base16.
	cborLaterBase64URL = 21
	cborLaterBase64    = 22
	cborLaterBase16    = 23
)

// cborHead decodes the head of the item at b[0]: major type, additional information, argument
// and head size. n is 0 when b is too short to hold the whole head.
func cborHead(b []byte) (major, ai byte, arg uint64, n int) {
	if len(b) == 0 {
		return 0, 0, 0, 0
	}
	major, ai = b[0]>>5, b[0]&0x1f
	switch {
	case ai < 24:
		return major, ai, uint64(ai), 1
	case ai == 24:
		if len(b) < 2 {
			return 0, 0, 0, 0
		}
		return major, ai, uint64(b[1]), 2
	case ai == 25:
		if len(b) < 3 {
			return 0, 0, 0, 0
		}
		return major, ai, uint64(binary.BigEndian.Uint16(b[1:])), 3
	case ai == 26:
		if len(b) < 5 {
			return 0, 0, 0, 0
		}
		return major, ai, uint64(binary.BigEndian.Uint32(b[1:])), 5
	case ai == 27:
		if len(b) < 9 {
			return 0, 0, 0, 0
		}
		return major, ai, binary.BigEndian.Uint64(b[1:]), 9
	}
	// 28-30 are reserved (the scanner rejects them); 31 is indefinite length or break.
	return major, ai, 0, 1
}

// cborLevel is an item the scanner is inside of.
type cborLevel struct {
	// left counts the items a definite-length container or tag still needs; for an
	// indefinite-length one it counts the items seen (a map's must be even at the break).
	left  uint64
	indef bool
	isMap bool
	// str is the chunks' major type inside an indefinite-length string, else 0.
	str byte
}

// cborScan finds where one CBOR data item ends, resumably: run can be called again with a
// longer buffer (same prefix) and continues where it stopped. It checks well-formedness
// (RFC 8949 appendix C) apart from UTF-8 in text strings.
type cborScan struct {
	pos   int
	stack []cborLevel
	err   error
}

func (s *cborScan) reset(pos int) {
	s.pos, s.stack, s.err = pos, s.stack[:0], nil
}

func (s *cborScan) push(l cborLevel) bool {
	if len(s.stack) >= maxDepth {
		s.err = malformed("CBOR nested deeper than %d", maxDepth)
		return false
	}
	s.stack = append(s.stack, l)
	return true
}

// run returns the index just past the item that starts at the scan's first position, or -1
// when b ends first or on error (in s.err). No item may reach beyond index max: one that
// would is ErrFrameTooLarge.
func (s *cborScan) run(b []byte, max int) int {
	for {
		if s.pos > max {
			s.err = ErrFrameTooLarge
			return -1
		}
		// A one-byte head (a small integer, a short string's or container's length: most
		// items of a Kubernetes object) decoded here as cborHead decodes it, without the call.
		// (cborHead as an inlinable wrapper with this case was slower: measured.)
		var major, ai byte
		var arg uint64
		var n int
		if p := s.pos; p < len(b) && b[p]&0x1f < 24 {
			major, ai, arg, n = b[p]>>5, b[p]&0x1f, uint64(b[p]&0x1f), 1
		} else if major, ai, arg, n = cborHead(b[s.pos:]); n == 0 {
			return -1
		}
		if ai >= 28 && ai <= 30 {
			s.err = malformed("reserved CBOR additional information %d at %d", ai, s.pos)
			return -1
		}
		var top *cborLevel
		if len(s.stack) > 0 {
			top = &s.stack[len(s.stack)-1]
		}
		isBreak := major == 7 && ai == 31
		if top != nil && top.str != 0 && !isBreak && (major != top.str || ai == 31) {
			s.err = malformed("bad chunk in indefinite-length CBOR string at %d", s.pos)
			return -1
		}
		switch major {
		case 0, 1, 6:
			if ai == 31 {
				s.err = malformed("indefinite length on CBOR major type %d at %d", major, s.pos)
				return -1
			}
			s.pos += n
			if major == 6 {
				if !s.push(cborLevel{left: 1}) {
					return -1
				}
				continue
			}
		case 2, 3:
			if ai == 31 {
				s.pos += n
				if !s.push(cborLevel{indef: true, str: major}) {
					return -1
				}
				continue
			}
			if s.pos+n > max || arg > uint64(max-s.pos-n) {
				s.err = ErrFrameTooLarge
				return -1
			}
			end := s.pos + n + int(arg)
			if end > len(b) {
				return -1
			}
			s.pos = end
		case 4, 5:
			s.pos += n
			if ai == 31 {
				if !s.push(cborLevel{indef: true, isMap: major == 5}) {
					return -1
				}
				continue
			}
			// Every item takes at least a byte, so a count beyond the limit cannot fit.
			if arg > uint64(max) {
				s.err = ErrFrameTooLarge
				return -1
			}
			if major == 5 {
				arg *= 2
			}
			if arg > 0 {
				if !s.push(cborLevel{left: arg}) {
					return -1
				}
				continue
			}
		case 7:
			if isBreak {
				if top == nil || !top.indef {
					s.err = malformed("unexpected CBOR break at %d", s.pos)
					return -1
				}
				if top.isMap && top.left%2 == 1 {
					s.err = malformed("CBOR map ends between a key and its value at %d", s.pos)
					return -1
				}
				s.stack = s.stack[:len(s.stack)-1]
				s.pos++
				break
			}
			if ai == 24 && arg < 32 {
				s.err = malformed("invalid CBOR simple value encoding at %d", s.pos)
				return -1
			}
			s.pos += n
		}
		// An item is complete: count it in the levels it closes.
		for {
			if len(s.stack) == 0 {
				if s.pos > max {
					// A head or a tag ends past the limit: too large, as a read that stopped
					// at the limit finds it (the check above only sees where items start).
					s.err = ErrFrameTooLarge
					return -1
				}
				return s.pos
			}
			t := &s.stack[len(s.stack)-1]
			if t.indef {
				t.left++
				break
			}
			t.left--
			if t.left > 0 {
				break
			}
			s.stack = s.stack[:len(s.stack)-1]
		}
	}
}

type cborSplitter struct{ scan *cborScan }

func (s *cborSplitter) reset() { s.scan.reset(0) }

func (s *cborSplitter) bind(ps *parseState) {
	s.scan = nil
	if ps != nil {
		s.scan = &ps.cs
	}
}

func (s *cborSplitter) split(b []byte, max int, _ arrival) (int, error) {
	end := s.scan.run(b, max)
	if s.scan.err != nil {
		return 0, s.scan.err
	}
	if end < 0 {
		if len(b) > max {
			return 0, ErrFrameTooLarge
		}
		return 0, nil
	}
	return end, nil
}

// cborParser walks one complete, well-formed item (the splitter checked it).
type cborParser struct {
	b  []byte
	ps *parseState
}

func (p *cborParser) head(i int) (major, ai byte, arg uint64, n int, err error) {
	if i >= len(p.b) {
		return 0, 0, 0, 0, malformed("truncated CBOR item")
	}
	major, ai, arg, n = cborHead(p.b[i:])
	if n == 0 {
		return 0, 0, 0, 0, malformed("truncated CBOR item")
	}
	return major, ai, arg, n, nil
}

func (p *cborParser) skip(i int) (int, error) {
	s := &p.ps.cs
	s.reset(i)
	end := s.run(p.b, len(p.b))
	if s.err != nil || end < 0 {
		return 0, malformed("bad CBOR item at %d", i)
	}
	return end, nil
}

// untag skips the tags in front of the item at i as apimachinery's decoder (fxamacker/cbor with
// TagsAllowed) does when it reads the item into a Go string or struct, and returns enc, the
// "expected later encoding" in effect for the item (docs/design.md section 3, "CBOR tags"):
//   - 55799 (self-described CBOR) and tags it does not know are skipped;
//   - 0 (an RFC 3339 time) must be directly in front of a text string, which reads as itself;
//   - 1 (epoch time) and 2 and 3 (bignums) cannot read as a string or a map: malformed;
//   - 21, 22 and 23 set the later encoding (base64url, base64, hex) of every byte string the
//     item holds, the innermost tag winning (RFC 8949 section 3.4.5.2).
func (p *cborParser) untag(i int, enc byte) (int, byte, error) {
	if i < len(p.b) && p.b[i]>>5 != 6 {
		return i, enc, nil // untagged, as the apiserver writes every item but the top ones
	}
	for {
		major, _, arg, n, err := p.head(i)
		if err != nil {
			return 0, 0, err
		}
		if major != 6 {
			return i, enc, nil
		}
		switch arg {
		case cborSelfDescribed:
			// The apiserver's own tag (0xd9d9f7): skipped, as is every tag not named here.
		case 0:
			if i+n >= len(p.b) || p.b[i+n]>>5 != 3 {
				return 0, 0, malformed("CBOR tag 0 not in front of a text string at %d", i)
			}
		case 1, 2, 3:
			return 0, 0, malformed("CBOR tag %d where a string or map belongs at %d", arg, i)
		case cborLaterBase64URL, cborLaterBase64, cborLaterBase16:
			enc = byte(arg)
		}
		i += n
	}
}

// later returns the byte string v as apimachinery's decoder reads it into a Go string under the
// later encoding enc (see untag), in the arena; v itself when enc is 0.
func (p *cborParser) later(v []byte, enc byte) []byte {
	var n int
	switch enc {
	case 0:
		return v
	case cborLaterBase64URL:
		n = base64.RawURLEncoding.EncodedLen(len(v))
	case cborLaterBase64:
		n = base64.StdEncoding.EncodedLen(len(v))
	default:
		n = hex.EncodedLen(len(v))
	}
	dst := p.ps.arenaFor(n)
	start := len(dst)
	dst = dst[:start+n]
	switch enc {
	case cborLaterBase64URL:
		base64.RawURLEncoding.Encode(dst[start:], v)
	case cborLaterBase64:
		base64.StdEncoding.Encode(dst[start:], v)
	default:
		hex.Encode(dst[start:], v)
	}
	p.ps.arena = dst
	return dst[start:]
}

// str reads the item at i as a string. isStr is false (and next 0) when it is not a byte or
// text string. An indefinite-length string's chunks are joined in *buf (or the arena when buf
// is nil).
func (p *cborParser) str(i int, buf *[]byte) (v []byte, major byte, next int, isStr bool, err error) {
	major, ai, arg, n, err := p.head(i)
	if err != nil || (major != 2 && major != 3) {
		return nil, 0, 0, false, err
	}
	if ai != 31 {
		if arg > uint64(len(p.b)-i-n) {
			return nil, 0, 0, false, malformed("truncated CBOR string at %d", i)
		}
		end := i + n + int(arg)
		return p.b[i+n : end], major, end, true, nil
	}
	end, err := p.skip(i)
	if err != nil {
		return nil, 0, 0, false, err
	}
	var dst []byte
	if buf != nil {
		dst = (*buf)[:0]
	} else {
		dst = p.ps.arenaFor(end - i)
	}
	start := len(dst)
	// The chunks are well-formed: skip checked them.
	for j := i + 1; j < end && p.b[j] != cborBreak; {
		_, _, arg, n, _ := p.head(j)
		dst = append(dst, p.b[j+n:j+n+int(arg)]...)
		j += n + int(arg)
	}
	if buf != nil {
		*buf = dst
	} else {
		p.ps.arena = dst
	}
	return dst[start:], major, end, true, nil
}

// cborMap iterates a map's pairs.
type cborMap struct {
	left  uint64 // pairs left in a definite-length map
	indef bool
	i     int  // the next key, or the end once done
	enc   byte // the later encoding of the map's values (see untag)
}

// openMap starts a map at i (after its tags), inside an item whose later encoding is enc. ok
// is false when the item is null or undefined (and next is past it).
func (p *cborParser) openMap(i int, enc byte, what string) (m cborMap, ok bool, next int, err error) {
	i, enc, err = p.untag(i, enc)
	if err != nil {
		return m, false, 0, err
	}
	if p.b[i] == cborNull || p.b[i] == cborUndefined {
		return m, false, i + 1, nil
	}
	major, ai, arg, n, err := p.head(i)
	if err != nil {
		return m, false, 0, err
	}
	if major != 5 {
		return m, false, 0, malformed("CBOR %s is not a map", what)
	}
	return cborMap{left: arg, indef: ai == 31, i: i + n, enc: enc}, true, 0, nil
}

// next returns the next key and the index of its value, or done. A struct's field names
// (valueKeys false) are matched as they are: a tagged key is not a string, and the map's later
// encoding does not apply. A map[string]string's keys (valueKeys true) are read as its values
// are. key is nil with isStr false when it is not a string. After handling the value the
// caller sets m.i past it.
func (p *cborParser) next(m *cborMap, valueKeys bool) (key []byte, vi int, done bool, err error) {
	if m.indef {
		if m.i >= len(p.b) {
			return nil, 0, false, malformed("truncated CBOR map")
		}
		if p.b[m.i] == cborBreak {
			m.i++
			return nil, 0, true, nil
		}
	} else {
		if m.left == 0 {
			return nil, 0, true, nil
		}
		m.left--
	}
	k, enc := m.i, byte(0)
	if valueKeys {
		if k, enc, err = p.untag(k, m.enc); err != nil {
			return nil, 0, false, err
		}
	}
	key, major, vi, isStr, err := p.str(k, &p.ps.key)
	if err != nil {
		return nil, 0, false, err
	}
	if !isStr {
		if vi, err = p.skip(m.i); err != nil {
			return nil, 0, false, err
		}
	} else if major == 2 && enc != 0 {
		key = p.later(key, enc)
	}
	return key, vi, false, nil
}

// stringField reads a string-typed field at i, inside an item whose later encoding is enc: a
// string sets *dst (and the item's span when loc is non-nil), null or undefined leaves it,
// anything else is malformed.
func (p *cborParser) stringField(i int, enc byte, name string, dst *[]byte, loc *rvLocation) (int, error) {
	i, enc, err := p.untag(i, enc)
	if err != nil {
		return 0, err
	}
	if p.b[i] == cborNull || p.b[i] == cborUndefined {
		return i + 1, nil
	}
	v, major, next, isStr, err := p.str(i, nil)
	if err != nil {
		return 0, err
	}
	if !isStr {
		return 0, malformed("CBOR %s is not a string", name)
	}
	if major == 2 && enc != 0 {
		// The value read is the encoding, not the bytes. A rewrite writes its RV as a text
		// string, which no later encoding converts.
		v, major = p.later(v, enc), 3
	}
	*dst = v
	if loc != nil {
		*loc = rvLocation{format: CBOR, start: i, end: next, cborMajor: major}
	}
	return next, nil
}

// seen records a key among those read, failing on a duplicate.
func seen(set *uint32, bit uint32, key []byte) error {
	if *set&bit != 0 {
		return malformed("duplicate CBOR map key %q", key)
	}
	*set |= bit
	return nil
}

func (ps *parseState) parseCBOR(raw []byte) error {
	p := &cborParser{b: raw, ps: ps}
	m, ok, _, err := p.openMap(0, 0, "watch event")
	if err != nil {
		return err
	}
	if !ok {
		return malformed("CBOR watch event is not a map")
	}
	var keys uint32
	for {
		k, vi, done, err := p.next(&m, false)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		switch string(k) {
		case "type":
			if err = seen(&keys, 1, k); err == nil {
				m.i, err = p.stringField(vi, m.enc, "type", &ps.typ, nil)
			}
		case "object":
			// A RawExtension: decoded on its own, so the envelope's later encoding stops here.
			if err = seen(&keys, 2, k); err == nil {
				m.i, err = p.object(vi)
			}
		default:
			m.i, err = p.skip(vi)
		}
		if err != nil {
			return err
		}
	}
}

func (p *cborParser) object(i int) (int, error) {
	m, ok, next, err := p.openMap(i, 0, "watch event object")
	if err != nil || !ok {
		return next, err
	}
	var keys uint32
	for {
		k, vi, done, err := p.next(&m, false)
		if err != nil {
			return 0, err
		}
		if done {
			return m.i, nil
		}
		if string(k) == "metadata" {
			if err = seen(&keys, 1, k); err == nil {
				m.i, err = p.metadata(vi, m.enc)
			}
		} else {
			m.i, err = p.skip(vi)
		}
		if err != nil {
			return 0, err
		}
	}
}

func (p *cborParser) metadata(i int, enc byte) (int, error) {
	ps := p.ps
	m, ok, next, err := p.openMap(i, enc, "metadata")
	if err != nil || !ok {
		return next, err
	}
	var keys uint32
	for {
		k, vi, done, err := p.next(&m, false)
		if err != nil {
			return 0, err
		}
		if done {
			return m.i, nil
		}
		switch string(k) {
		case "resourceVersion":
			if err = seen(&keys, 1, k); err == nil {
				m.i, err = p.stringField(vi, m.enc, "resourceVersion", &ps.rv, &ps.loc)
			}
		case "uid":
			if err = seen(&keys, 2, k); err == nil {
				m.i, err = p.stringField(vi, m.enc, "uid", &ps.uid, nil)
			}
		case "namespace":
			if err = seen(&keys, 4, k); err == nil {
				m.i, err = p.stringField(vi, m.enc, "namespace", &ps.ns, nil)
			}
		case "name":
			if err = seen(&keys, 8, k); err == nil {
				m.i, err = p.stringField(vi, m.enc, "name", &ps.name, nil)
			}
		case "annotations":
			if err = seen(&keys, 16, k); err == nil {
				m.i, err = p.annotations(vi, m.enc)
			}
		default:
			m.i, err = p.skip(vi)
		}
		if err != nil {
			return 0, err
		}
	}
}

func (p *cborParser) annotations(i int, enc byte) (int, error) {
	m, ok, next, err := p.openMap(i, enc, "annotations")
	if err != nil || !ok {
		return next, err
	}
	var keys uint32
	for {
		k, vi, done, err := p.next(&m, true)
		if err != nil {
			return 0, err
		}
		if done {
			return m.i, nil
		}
		if string(k) != InitialEventsEndAnnotation {
			if m.i, err = p.skip(vi); err != nil {
				return 0, err
			}
			continue
		}
		if err := seen(&keys, 1, k); err != nil {
			return 0, err
		}
		var v []byte
		if m.i, err = p.stringField(vi, m.enc, "annotation", &v, nil); err != nil {
			return 0, err
		}
		p.ps.initialEventsEnd = string(v) == "true"
	}
}

// appendCBORHead appends the head of an item of the given major type and argument, in its
// shortest form.
func appendCBORHead(dst []byte, major byte, arg uint64) []byte {
	m := major << 5
	switch {
	case arg < 24:
		return append(dst, m|byte(arg))
	case arg <= 0xff:
		return append(dst, m|24, byte(arg))
	case arg <= 0xffff:
		return binary.BigEndian.AppendUint16(append(dst, m|25), uint16(arg))
	case arg <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(dst, m|26), uint32(arg))
	}
	return binary.BigEndian.AppendUint64(append(dst, m|27), arg)
}

// rewriteCBOR appends to dst the item raw with its resourceVersion string replaced by rv, of
// the same major type. CBOR containers count items, not bytes, so nothing else changes.
func rewriteCBOR(dst, raw []byte, loc *rvLocation, rv string) ([]byte, error) {
	if loc.cborMajor == 3 && !utf8.ValidString(rv) {
		return nil, malformed("resourceVersion %q is not valid UTF-8 for a CBOR text string", rv)
	}
	dst = append(dst, raw[:loc.start]...)
	dst = appendCBORHead(dst, loc.cborMajor, uint64(len(rv)))
	dst = append(dst, rv...)
	return append(dst, raw[loc.end:]...), nil
}
