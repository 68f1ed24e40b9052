package stream

import (
	"bytes"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
)

// JSON watch frames: one {"type":..,"object":{..}} value after another, usually each followed
// by a newline (the reader does not depend on it). Finding a frame's end needs only brackets
// and strings; the parser then walks the top level, the object's top level and its metadata,
// and skips every other value by its brackets.
//
// Decoding follows apimachinery's (sigs.k8s.io/json, case-sensitive keys): for a repeated key
// the last value wins, a repeated "metadata" merges into the earlier one, a repeated "object"
// replaces it, and null leaves a string field as it was.

func isJSONSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// jsonSplitter finds a frame's end by the line fast path where it can (jsonScan.runLine: the
// value that starts the buffer ends exactly before its first newline) and by the exact scan
// otherwise. Both give the same frame on every input (format_json_scan.go), so which one
// ran never changes what the Reader reads, only how fast.
type jsonSplitter struct {
	scan *jsonScan
	// searched is how far the frame's bytes were searched for a newline without one.
	searched int
	// exact: the exact scan has begun on this frame (it is resumable; the line path is not),
	// so it finishes it. noLine turns the line path off (tests compare the paths).
	exact, noLine bool
	// stats counts which path found each frame, and why the line path did not.
	stats jsonLineStats
}

// jsonLineStats counts the splitter's frames by path: lines found by the fast path, and the
// frames left to the exact scan, by the reason.
type jsonLineStats struct {
	lines int
	// noNewline: no newline in the buffer within the frame limit and the frame could not wait
	// for one (the stream ended, or the buffer reached the limit, or a quiet source with a
	// '}' last: maybe a value without its newline). notClosed: the line does not end in '}'
	// (a pretty-printed event's first line, whitespace before the newline). Then runLine's
	// own reasons (jsonLineMiss).
	noNewline, notClosed int
	miss                 [lineMisses]int
}

func (s *jsonSplitter) bind(ps *parseState) {
	s.scan = nil
	if ps != nil {
		s.scan = &ps.js
	}
}

func (s *jsonSplitter) reset() {
	s.scan.record = true
	s.scan.reset(0)
	s.searched, s.exact = 0, false
}

func (s *jsonSplitter) split(b []byte, max int, next arrival) (int, error) {
	if s.scan.pos == 0 && b[0] != '{' {
		return 0, malformed("watch event is not a JSON object (starts with %q)", b[0])
	}
	if !s.exact && !s.noLine {
		lim := min(len(b), max+1)
		if s.searched < lim {
			if nl := bytes.IndexByte(b[s.searched:lim], '\n'); nl >= 0 {
				nl += s.searched
				if b[nl-1] != '}' {
					s.stats.notClosed++
				} else if miss := s.scan.runLine(b[:nl]); miss == lineOK {
					s.stats.lines++
					return nl + 1, nil
				} else {
					s.stats.miss[miss]++
					s.scan.reset(0)
				}
				s.exact = true
			} else {
				s.searched = lim
			}
		}
		if !s.exact {
			// No newline within the limit so far. Wait for one, except where waiting could
			// hold back a whole value: when nothing more comes, when the frame cannot grow
			// within the limit, or when the source is quiet and the buffer ends in '}' (maybe a
			// value without a newline; a value followed on its line by part of another is
			// held until that line's newline, in streams no apiserver writes).
			if len(b) <= max && (next == arriveNow || next == arriveLater && !endsInBrace(b)) {
				return 0, nil
			}
			s.stats.noNewline++
			s.exact = true
		}
	}
	// Never look past the limit, so that the outcome does not depend on how much a read
	// brought in.
	end := s.scan.run(b[:min(len(b), max+1)])
	if s.scan.err != nil {
		return 0, s.scan.err
	}
	if end < 0 || end > max {
		if len(b) > max {
			return 0, ErrFrameTooLarge
		}
		return 0, nil
	}
	// Take the newline that ends the value along with it, when it is already here; never
	// wait for it.
	if end < len(b) && b[end] == '\n' {
		end++
	}
	return end, nil
}

// endsInBrace reports whether b's last byte that is not JSON whitespace is '}'.
func endsInBrace(b []byte) bool {
	i := len(b) - 1
	for i >= 0 && isJSONSpace(b[i]) {
		i--
	}
	return i >= 0 && b[i] == '}'
}

// jsonParser walks one complete frame.
type jsonParser struct {
	b  []byte
	ps *parseState
	// span is the next of the splitter's container spans to consider; the parser visits
	// values in increasing order, so it only moves forward.
	span int
}

func (p *jsonParser) ws(i int) int {
	for i < len(p.b) && isJSONSpace(p.b[i]) {
		i++
	}
	return i
}

// plain is skipPlain(p.b, i): the index of the first quote or backslash at or after i, or
// len(p.b). Within the blocks whose masks the line path kept (jsonScan.plain) it is the next
// set bit, found without reading the bytes again; the masks mark exactly those two bytes of
// the frame (a padded last block marks none past the line, and the newline after it is
// neither), so past them the search goes on from the first byte they do not cover.
func (p *jsonParser) plain(i int) int {
	s := &p.ps.js
	for k := i / blockSize; k < s.nplain; k++ {
		m := s.plain[k]
		if k == i/blockSize {
			m &= ^uint64(0) << (i % blockSize)
		}
		if m != 0 {
			return k*blockSize + bits.TrailingZeros64(m)
		}
	}
	return skipPlain(p.b, min(max(i, s.nplain*blockSize), len(p.b)))
}

// str reads the string token at i (p.b[i] == '"'). It returns its content, undecoded, the
// index past the closing quote, and whether the content holds escapes.
func (p *jsonParser) str(i int) (content []byte, next int, esc bool, err error) {
	j := i + 1
	for {
		j = p.plain(j)
		if j >= len(p.b) {
			return nil, 0, false, malformed("unterminated JSON string at %d", i)
		}
		if p.b[j] == '"' {
			return p.b[i+1 : j], j + 1, esc, nil
		}
		esc = true
		j += 2
	}
}

// strValue reads a string value at i, decoding escapes into the arena when there are any.
func (p *jsonParser) strValue(i int) (v []byte, next int, err error) {
	c, next, esc, err := p.str(i)
	if err != nil || !esc {
		return c, next, err
	}
	a := p.ps.arenaFor(len(c))
	n := len(a)
	a, err = unquoteJSON(a, c)
	if err != nil {
		return nil, 0, err
	}
	p.ps.arena = a
	return a[n:], next, nil
}

// key reads an object key at i and the colon after it; it returns the decoded key and the
// index of the value.
func (p *jsonParser) key(i int) (k []byte, next int, err error) {
	if i >= len(p.b) || p.b[i] != '"' {
		return nil, 0, malformed("expected a JSON object key at %d", i)
	}
	c, next, esc, err := p.str(i)
	if err != nil {
		return nil, 0, err
	}
	if esc {
		p.ps.key, err = unquoteJSON(p.ps.key[:0], c)
		if err != nil {
			return nil, 0, err
		}
		c = p.ps.key
	}
	next = p.ws(next)
	if next >= len(p.b) || p.b[next] != ':' {
		return nil, 0, malformed("expected ':' after JSON key at %d", next)
	}
	return c, p.ws(next + 1), nil
}

// members iterates an object's members. Call it with i at '{' to start, and then with i just
// past each value; it returns the next key and the index of its value, or done at '}'.
func (p *jsonParser) members(i int, first bool) (k []byte, vi int, done bool, next int, err error) {
	// The compact shape the apiserver writes, `{"key":v` or `,"key":v` with no whitespace and
	// no escape in the key, read at once; the general path below reads it the same way.
	if b := p.b; i+1 < len(b) && b[i+1] == '"' && b[i] == "{,"[b2i(!first)] {
		if j := p.plain(i + 2); j+2 < len(b) && b[j] == '"' && b[j+1] == ':' && !isJSONSpace(b[j+2]) {
			return b[i+2 : j], j + 2, false, 0, nil
		}
	}
	if first {
		if i >= len(p.b) || p.b[i] != '{' {
			return nil, 0, false, 0, malformed("expected a JSON object at %d", i)
		}
		i = p.ws(i + 1)
		if i < len(p.b) && p.b[i] == '}' {
			return nil, 0, true, i + 1, nil
		}
	} else {
		i = p.ws(i)
		if i >= len(p.b) {
			return nil, 0, false, 0, malformed("unterminated JSON object")
		}
		switch p.b[i] {
		case '}':
			return nil, 0, true, i + 1, nil
		case ',':
			i = p.ws(i + 1)
		default:
			return nil, 0, false, 0, malformed("expected ',' or '}' at %d", i)
		}
	}
	k, vi, err = p.key(i)
	return k, vi, false, 0, err
}

// skip returns the index past the value at i.
func (p *jsonParser) skip(i int) (int, error) {
	if i >= len(p.b) {
		return 0, malformed("missing JSON value")
	}
	switch p.b[i] {
	case '{', '[':
		spans := p.ps.js.spans
		for p.span < len(spans) && spans[p.span].start < i {
			p.span++
		}
		if p.span < len(spans) && spans[p.span].start == i && spans[p.span].end > i {
			return spans[p.span].end, nil
		}
		// Deeper than the splitter recorded (only in frames the apiserver does not write).
		s := &p.ps.jsSkip
		s.reset(i)
		end := s.run(p.b)
		if s.err != nil {
			return 0, s.err
		}
		if end < 0 {
			return 0, malformed("unterminated JSON value at %d", i)
		}
		return end, nil
	case '"':
		_, next, _, err := p.str(i)
		return next, err
	case ',', '}', ']', ':':
		return 0, malformed("missing JSON value at %d", i)
	}
	// A number or a literal ends at a delimiter, and also at any byte the frame-end scan acts
	// on (a quote, a bracket) or a colon, none of which a valid one contains: the value's
	// member then fails to continue with ',' or '}' (malformed). Read on through them, the
	// parser would see strings where the scan did not (`0",...` opens a string for the scan),
	// and a resourceVersion it located could straddle the scan's string boundaries, which a
	// rewrite of it would then move (FuzzReaderJSON, testdata 4c66bf944e8e9942).
	j := i
	for j < len(p.b) {
		switch p.b[j] {
		case ',', '}', ']', ' ', '\t', '\r', '\n', '"', '{', '[', ':':
			return j, nil
		}
		j++
	}
	return j, nil
}

func (p *jsonParser) isNull(i int) bool { return bytes.HasPrefix(p.b[i:], []byte("null")) }

// stringField reads a string-typed field's value at i: a string sets *dst (and its token's
// span when loc is non-nil), null leaves it, anything else is malformed.
func (p *jsonParser) stringField(i int, name string, dst *[]byte, loc *rvLocation) (int, error) {
	if i < len(p.b) && p.b[i] == '"' {
		v, next, err := p.strValue(i)
		if err != nil {
			return 0, err
		}
		*dst = v
		if loc != nil {
			*loc = rvLocation{format: JSON, start: i, end: next}
		}
		return next, nil
	}
	if i < len(p.b) && p.isNull(i) {
		return i + 4, nil
	}
	return 0, malformed("JSON %s is not a string", name)
}

func (ps *parseState) parseJSON(raw []byte) error {
	p := &jsonParser{b: raw, ps: ps}
	i := p.ws(0)
	// objErr is what is wrong with the current "object": it counts only if no later one
	// replaces it.
	var objErr error
	for first := true; ; first = false {
		k, vi, done, _, err := p.members(i, first)
		if err != nil {
			return err
		}
		if done {
			break
		}
		switch string(k) {
		case "type":
			i, err = p.stringField(vi, "type", &ps.typ, nil)
		case "object":
			// A RawExtension takes any value, a later one replacing it, except null,
			// which leaves it be; client-go decodes only the value that stays, so only that
			// one must be an object and read as one (an earlier one must still end).
			switch {
			case vi < len(raw) && raw[vi] == '{':
				ps.resetObject()
				if i, objErr = p.object(vi); objErr != nil {
					ps.resetObject()
					i, err = p.skip(vi)
				}
			case vi < len(raw) && p.isNull(vi):
				i = vi + 4
			default:
				ps.resetObject()
				objErr = malformed("JSON watch event object is not an object")
				i, err = p.skip(vi)
			}
		default:
			i, err = p.skip(vi)
		}
		if err != nil {
			return err
		}
	}
	return objErr
}

func (p *jsonParser) object(i int) (int, error) {
	for first := true; ; first = false {
		k, vi, done, next, err := p.members(i, first)
		if err != nil {
			return 0, err
		}
		if done {
			return next, nil
		}
		if string(k) == "metadata" && vi < len(p.b) && p.b[vi] == '{' {
			i, err = p.metadata(vi)
		} else {
			i, err = p.skip(vi)
		}
		if err != nil {
			return 0, err
		}
	}
}

func (p *jsonParser) metadata(i int) (int, error) {
	ps := p.ps
	for first := true; ; first = false {
		k, vi, done, next, err := p.members(i, first)
		if err != nil {
			return 0, err
		}
		if done {
			return next, nil
		}
		switch string(k) {
		case "resourceVersion":
			i, err = p.stringField(vi, "resourceVersion", &ps.rv, &ps.loc)
		case "uid":
			i, err = p.stringField(vi, "uid", &ps.uid, nil)
		case "namespace":
			i, err = p.stringField(vi, "namespace", &ps.ns, nil)
		case "name":
			i, err = p.stringField(vi, "name", &ps.name, nil)
		case "annotations":
			switch {
			case vi < len(p.b) && p.b[vi] == '{':
				i, err = p.annotations(vi)
			case vi < len(p.b) && p.isNull(vi):
				// null sets the map to nil.
				ps.initialEventsEnd = false
				i = vi + 4
			default:
				err = malformed("JSON annotations is not an object")
			}
		default:
			i, err = p.skip(vi)
		}
		if err != nil {
			return 0, err
		}
	}
}

func (p *jsonParser) annotations(i int) (int, error) {
	for first := true; ; first = false {
		k, vi, done, next, err := p.members(i, first)
		if err != nil {
			return 0, err
		}
		if done {
			return next, nil
		}
		if string(k) != InitialEventsEndAnnotation {
			if i, err = p.skip(vi); err != nil {
				return 0, err
			}
			continue
		}
		var v []byte
		switch {
		case vi < len(p.b) && p.b[vi] == '"':
			v, i, err = p.strValue(vi)
		case vi < len(p.b) && p.isNull(vi):
			// null sets a map value to its zero value.
			i = vi + 4
		default:
			err = malformed("JSON annotation %s is not a string", InitialEventsEndAnnotation)
		}
		if err != nil {
			return 0, err
		}
		p.ps.initialEventsEnd = string(v) == "true"
	}
}

// unquoteJSON appends the decoded content of a JSON string (without its quotes) to dst, as
// encoding/json decodes it: invalid or unpaired \u surrogates become U+FFFD.
func unquoteJSON(dst, s []byte) ([]byte, error) {
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			j := bytes.IndexByte(s[i:], '\\')
			if j < 0 {
				return append(dst, s[i:]...), nil
			}
			dst = append(dst, s[i:i+j]...)
			i += j
			continue
		}
		if i+1 >= len(s) {
			return nil, malformed("bad escape in JSON string")
		}
		switch e := s[i+1]; e {
		case '"', '\\', '/':
			dst = append(dst, e)
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, ok := hex4(s[i+2:])
			if !ok {
				return nil, malformed("bad \\u escape in JSON string")
			}
			i += 6
			if utf16.IsSurrogate(r) {
				if len(s) >= i+6 && s[i] == '\\' && s[i+1] == 'u' {
					if r2, ok := hex4(s[i+2:]); ok {
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							dst = utf8.AppendRune(dst, dec)
							i += 6
							continue
						}
					}
				}
				r = utf8.RuneError
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default:
			return nil, malformed("bad escape \\%c in JSON string", e)
		}
		i += 2
	}
	return dst, nil
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// appendJSONString appends s as a JSON string token, escaped as encoding/json escapes it
// (without HTML escaping: resourceVersions never need it, and the apiserver's own
// serializer does not use it either).
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
