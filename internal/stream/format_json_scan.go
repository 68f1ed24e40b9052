package stream

import (
	"encoding/binary"
	"math/bits"
)

// Finding where a JSON watch frame ends (docs/design.md section 3).
//
// client-go frames a JSON watch stream with a streaming JSON decoder, not by lines: a value
// may span lines and a line may hold several values, and the decoder follows every byte's
// nesting and string state to find each value's end. watchsan must cut the stream where it
// does, so it must know, for every byte, whether it is inside a string and how deep it is.
// The newline that ends each event an apiserver writes cannot stand in for that: a line
// that is one compact JSON value, identical to an apiserver's event up to the end of its
// metadata, can close its object early and carry a second top-level "type" after it
// (`..."data":{}},"type":"DELETED","x":{"y":{...}}}`), which is what client-go would
// decode; whatever bytes a check skipped, such an insertion can sit in them. So the scanner
// classifies every byte, and what makes it fast is doing so 64 bytes at a time.
//
// The reference is the byte loop (runBytes): outside a string a quote opens one and a
// bracket opens or closes a container (every other byte, a backslash included, is passed
// over); inside a string a backslash takes the next byte with it and a quote closes it.
// The block path (runBlocks) computes the same function for a 64-byte block from four
// bitmasks of it (quotes, backslashes, opening and closing brackets; jsonMasks, in assembly
// where there is a kernel for it):
//
//  1. Escaped bytes, as if every backslash were inside a string: in a run of backslashes
//     that begins after a byte that is not one, the backslashes pair up from the run's
//     start, and the byte after an odd-length run is escaped (escapedBits, the carry
//     arithmetic of simdjson's escape scanner). A run that crosses into the next block
//     carries "the next byte is escaped", which is also what the byte loop carries (esc).
//  2. The string mask: the prefix XOR of the unescaped quotes, inverted when the block
//     starts inside a string, is 1 from an opening quote up to the byte before its closing
//     quote.
//  3. If some backslash lies outside that mask, step 1 assumed wrongly for it (outside a
//     string the byte loop passes a backslash over; it escapes nothing), and the block is
//     handed to the byte loop. Otherwise every backslash is inside a string, where both
//     rules are the same rule: by induction over the block's bytes, the byte loop is in a
//     string exactly where the mask says, since a run of backslashes cannot cross a string's
//     end (that is a quote) and each run starts its pairing after a byte that is not a
//     backslash in both; so both see the same quotes open and close the same strings.
//  4. The brackets outside the mask are then the ones the byte loop acts on, in the same
//     order, and each goes through the same push and pop (nesting bound, matching, spans)
//     at the same offset; a frame ends, or fails, at the same byte.
//
// What is left at the end of the buffer, less than a block, goes through the byte loop;
// either path stops in the same state (position, depth, string, escape), so a buffer may be
// scanned in any number of calls and any mix of the two. The fuzzers hold both paths to the
// same frames on arbitrary bytes, and to apimachinery's on the frames it decodes.
//
// The line path (runLine, used by jsonSplitter) is the block path over one line whose end
// is known, with no state between calls; it either settles the line as the exact scan would
// or leaves the frame to the exact scan (its comment has the argument).

// jsonScan finds where a JSON object or array ends, resumably: run can be called again with a
// longer buffer (same prefix) and continues where it stopped. It checks that brackets match
// and strings end, nothing more. When record is set it also notes where each container
// shallower than spanDepth starts and ends, so that the parser can skip those values without
// scanning them a second time.
type jsonScan struct {
	pos   int
	depth int
	// inStr: pos is inside a string; esc: the byte at pos is escaped (a backslash before it
	// in a string had no next byte yet).
	inStr, esc bool
	// objs is a bit stack: bit d-1 is set when the container at depth d is an object.
	objs []uint64
	err  error

	record bool
	// spans are the containers at depths 1..spanDepth, in the order they open; open[d] is
	// the index in spans of the one open at depth d.
	spans []jsonSpan
	open  [spanDepth + 1]int

	// plain[k] marks the quotes and backslashes of the frame's block k (bytes 64k..64k+63),
	// for its first nplain blocks: what runLine saw of a line it settled, kept for the parser
	// (jsonParser.plain). nplain is 0 when the exact scan found the frame.
	plain  [plainBlocks]uint64
	nplain int

	// bytesOnly makes run use the byte loop alone (tests compare the two paths).
	bytesOnly bool
	// stats counts what the scanner did, for the tests that show each path was taken.
	stats jsonScanStats
}

// jsonScanStats counts the scanner's work by path.
type jsonScanStats struct {
	// blocks went through the block path; byteBlocks were handed to the byte loop because
	// a backslash lay outside a string; tailBytes went through the byte loop because less
	// than a block was left (or the block path was off).
	blocks, byteBlocks, tailBytes int
}

// spanDepth: the event is depth 1, its object 2, the object's fields' values 3 (spec,
// metadata) and metadata's fields' values 4 (labels, managedFields): the deepest values the
// parser may skip.
const spanDepth = 4

// plainBlocks is how many blocks' quote-or-backslash masks runLine keeps for the parser: the
// first 2 KiB of a frame, where an apiserver writes the envelope and the object's metadata
// (managedFields, which can be longer, the parser skips by its span).
const plainBlocks = 32

// jsonSpan is a container's extent in the frame; end is 0 while it is open.
type jsonSpan struct{ start, end int }

func (s *jsonScan) reset(pos int) {
	s.pos, s.depth, s.inStr, s.esc, s.err = pos, 0, false, false, nil
	s.nplain = 0
	s.spans = s.spans[:0]
	if s.objs == nil {
		s.objs = make([]uint64, 1, 4)
	}
}

// Word-at-a-time search for a quote or a backslash among 8 bytes.
const (
	lsb        = 0x0101010101010101
	msb        = 0x8080808080808080
	quotes     = '"' * lsb
	backslashs = '\\' * lsb
)

// quoteOrBackslash returns a mask whose lowest set bit is the top bit of w's first byte that is
// a quote or a backslash, 0 when there is none. (x-lsb)&^x&msb flags the first zero byte of x
// exactly; above it a borrow may flag others, never below.
func quoteOrBackslash(w uint64) uint64 {
	q, bs := w^quotes, w^backslashs
	return ((q-lsb)&^q | (bs-lsb)&^bs) & msb
}

// skipPlain returns the index of the first '"' or '\\' in b at or after i, or len(b).
func skipPlain(b []byte, i int) int {
	for ; i+8 <= len(b); i += 8 {
		if m := quoteOrBackslash(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
	}
	for i < len(b) && b[i] != '"' && b[i] != '\\' {
		i++
	}
	return i
}

// jsonStructural marks the bytes the scanner acts on outside strings.
var jsonStructural = [256]bool{'"': true, '{': true, '}': true, '[': true, ']': true}

// run returns the index just past the container that starts at the scan's first position, or
// -1 when b ends first (or on error, in s.err).
func (s *jsonScan) run(b []byte) int {
	if haveMaskKernel && !s.bytesOnly && len(b)-s.pos >= blockSize {
		if end := s.runBlocks(b); end >= 0 || s.err != nil {
			return end
		}
	}
	s.stats.tailBytes += max(len(b)-s.pos, 0)
	return s.runBytes(b)
}

// runBytes is the byte loop: the reference, and the path for what is not a whole block.
func (s *jsonScan) runBytes(b []byte) int {
	i := s.pos
	if s.esc && i < len(b) {
		s.esc = false
		i++
	}
	for i < len(b) {
		if s.inStr {
			i = skipPlain(b, i)
			if i >= len(b) {
				break
			}
			if b[i] == '"' {
				s.inStr = false
				i++
				continue
			}
			// A backslash escapes the next byte, which may not be here yet.
			if i+1 >= len(b) {
				s.esc = true
				i = len(b)
				break
			}
			i += 2
			continue
		}
		for i < len(b) && !jsonStructural[b[i]] {
			i++
		}
		if i >= len(b) {
			break
		}
		c := b[i]
		i++
		if c == '"' {
			s.inStr = true
			continue
		}
		if s.bracket(c, i-1) {
			s.pos = i
			return i
		}
		if s.err != nil {
			return -1
		}
	}
	s.pos = i
	return -1
}

// bracket applies one bracket outside a string at offset i; it reports whether it closed the
// outermost container (the error, if any, is in s.err).
func (s *jsonScan) bracket(c byte, i int) bool {
	switch c {
	case '{', '[':
		if s.depth >= maxDepth {
			s.err = malformed("JSON nested deeper than %d", maxDepth)
			return false
		}
		w, bit := s.depth/64, uint64(1)<<(s.depth%64)
		for len(s.objs) <= w {
			s.objs = append(s.objs, 0)
		}
		if c == '{' {
			s.objs[w] |= bit
		} else {
			s.objs[w] &^= bit
		}
		s.depth++
		if s.record && s.depth <= spanDepth {
			s.open[s.depth] = len(s.spans)
			s.spans = append(s.spans, jsonSpan{start: i})
		}
		return false
	}
	if s.depth == 0 {
		s.err = malformed("unbalanced %q in JSON", c)
		return false
	}
	if s.record && s.depth <= spanDepth {
		s.spans[s.open[s.depth]].end = i + 1
	}
	s.depth--
	isObj := s.objs[s.depth/64]&(1<<(s.depth%64)) != 0
	if isObj != (c == '}') {
		s.err = malformed("mismatched %q in JSON", c)
		return false
	}
	return s.depth == 0
}

// blockSize is what the block path takes at a time: one bit of a uint64 per byte.
const blockSize = 64

// maskBatch is how many blocks' masks are computed in one call: enough to amortize the call,
// few enough that little is computed past a frame's end.
const maskBatch = 8

// jsonMasks are the bitmasks of one 64-byte block: bit k is set when byte k is a quote, a
// backslash, '{' or '[' (open), '}' or ']' (close).
type jsonMasks struct{ quote, bslash, open, close uint64 }

// runBlocks scans whole blocks from s.pos while there are any, and returns as run does;
// -1 with no error means it stopped at a block boundary short of the end.
func (s *jsonScan) runBlocks(b []byte) int {
	// The masks of up to maskBatch blocks, computed together; on the stack, so that a Reader
	// holds nothing for them while its watch is idle.
	var masks [maskBatch]jsonMasks
	for len(b)-s.pos >= blockSize {
		n := min((len(b)-s.pos)/blockSize, maskBatch)
		jsonMasksOf(b[s.pos:s.pos+n*blockSize], masks[:n])
		for k := range n {
			base := s.pos
			m := &masks[k]
			esc, next := escapedBits(m.bslash, b2u(s.esc))
			in := prefixXor(m.quote&^esc) ^ -b2u(s.inStr)
			if m.bslash&^in != 0 {
				// A backslash outside a string: the byte loop's rules, for this block.
				s.stats.byteBlocks++
				if end := s.runBytes(b[:base+blockSize]); end >= 0 || s.err != nil {
					return end
				}
				continue
			}
			s.stats.blocks++
			s.inStr, s.esc = in>>63 != 0, next != 0
			for br := (m.open | m.close) &^ in; br != 0; br &= br - 1 {
				i := base + bits.TrailingZeros64(br)
				c := b[i]
				// bracket's work inline while the stack fits objs[0] and nothing fails (bit 5
				// tells '{' and '}' from '[' and ']', bit 1 an opening bracket from a closing one).
				d := s.depth
				obj := uint64(c >> 5 & 1)
				switch {
				case d >= 63:
				case c&2 != 0:
					s.objs[0] = s.objs[0]&^(1<<d) | obj<<d
					s.depth = d + 1
					if d < spanDepth && s.record {
						s.open[d+1] = len(s.spans)
						s.spans = append(s.spans, jsonSpan{start: i})
					}
					continue
				case d > 0 && s.objs[0]>>(d-1)&1 == obj:
					if d <= spanDepth && s.record {
						s.spans[s.open[d]].end = i + 1
					}
					s.depth = d - 1
					if d == 1 {
						s.pos = i + 1
						return i + 1
					}
					continue
				}
				if s.bracket(c, i) {
					s.pos = i + 1
					return i + 1
				}
				if s.err != nil {
					return -1
				}
			}
			s.pos = base + blockSize
		}
	}
	return -1
}

// oddBits are the odd bit positions of a block mask.
const oddBits = 0xAAAAAAAAAAAAAAAA

// escapedBits returns the mask of a block's bytes that a backslash escapes, counting every
// backslash (step 1 above), given its backslashes and whether its first byte is escaped
// (first is 0 or 1); and whether the next block's first byte is (0 or 1). This is simdjson's
// arithmetic: subtracting the run starts from the odd bits turns each run of backslashes into
// alternating escape and escaped bits whose phase follows the run's start.
func escapedBits(bs, first uint64) (escaped, next uint64) {
	if bs == 0 {
		return first, 0
	}
	potential := bs &^ first
	code := ((potential<<1 | oddBits) - potential) ^ oddBits
	escaped = code ^ (bs | first)
	return escaped, (code & bs) >> 63
}

// prefixXor returns the mask whose bit k is the parity of x's bits 0..k.
func prefixXor(x uint64) uint64 {
	x ^= x << 1
	x ^= x << 2
	x ^= x << 4
	x ^= x << 8
	x ^= x << 16
	x ^= x << 32
	return x
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// jsonMasksGeneric computes jsonMasksOf's result byte by byte: the reference for the kernels,
// and the path where there is none.
func jsonMasksGeneric(b []byte, out []jsonMasks) {
	for k := range out {
		var m jsonMasks
		for j, c := range b[k*blockSize : (k+1)*blockSize] {
			bit := uint64(1) << j
			switch c {
			case '"':
				m.quote |= bit
			case '\\':
				m.bslash |= bit
			case '{', '[':
				m.open |= bit
			case '}', ']':
				m.close |= bit
			}
		}
		out[k] = m
	}
}

// jsonLineMiss says why runLine did not settle a line (lineOK when it did).
type jsonLineMiss int

const (
	lineOK jsonLineMiss = iota
	// lineBackslash: a backslash outside a string (the block rule would be wrong for it).
	lineBackslash
	// lineEarly: the value ends before the line does (several values on the line, or bytes
	// after the value).
	lineEarly
	// lineOpen: the value does not end within the line (it spans lines, or a raw newline is
	// inside a string, or the line is truncated).
	lineOpen
	// lineDeep: nested deeper than the one-word bracket stack of the line path.
	lineDeep
	// lineBad: a closing bracket that matches no opening one; the exact scan says which.
	lineBad
	lineMisses
)

// spaces is a block of spaces: neither quotes, backslashes nor brackets.
var spaces = [blockSize]byte{
	' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ',
	' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ',
	' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ',
	' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ',
}

// lineDepth is the nesting the line path follows: its stack of bracket kinds is one word.
const lineDepth = 63

// runLine is the line fast path (docs/design.md section 3). line is a buffer's bytes up to its
// first newline (not included) and s is freshly reset at 0. It returns lineOK when the value
// that starts at line[0] ends exactly at line's last byte, having recorded the spans run
// would record; anything else is a miss, and then s must be reset and the exact scan run on
// the buffer.
//
// Why it is exact: on lineOK, the exact scan (run, on the whole buffer, however it arrives)
// ends the frame at len(line) with the same spans, and on any other input the caller runs
// the exact scan itself, so the frame is always the exact scan's. The line path is the block
// path of runBlocks applied to the line: the same masks, the same escape and string
// arithmetic, the same rule that a backslash outside a string is not decided here (a miss),
// and the same push and pop of every bracket outside a string in order; it stops at the
// first point the exact scan would stop (an end, or an error, which it leaves to the exact
// scan to report). The masks of the last, partial block are those of a block whose bytes
// past the line are neither quotes, backslashes nor brackets (all zero bits): the line's last
// 64 bytes' masks shifted down, or for a line shorter than a block the line padded with
// spaces. A raw mask bit is the class of its byte alone, and every bit computed from them of
// a real byte depends only on the bytes at and before it (the escape carry and the prefix
// XOR run upwards), so what comes after the line changes nothing of the line's. So the value ends at line's last byte for
// the line path exactly when it does for the exact scan, which then stops there, with what
// follows (the newline) unread.
//
// On lineOK it also keeps the quote-or-backslash masks of the line's first blocks (plain):
// a classification of each byte by its value alone, which the parser uses in place of
// skipPlain (jsonParser.plain) for the same answer.
//
// What it gains over run: the line's end is known, so the masks of the whole line come in
// full batches, the tail too, and there is no state to carry between calls; what it still
// does is look at every byte: the newline an apiserver writes after each event proves
// nothing about the bytes before it (see the comment at the top of this file).
func (s *jsonScan) runLine(line []byte) jsonLineMiss {
	n := len(line)
	var masks [maskBatch]jsonMasks
	pad := spaces
	// inStr is all ones while inside a string at a block's end; esc is 1 when the next
	// block's first byte is escaped. objs is the stack of bracket kinds: bit d-1 is set when
	// the container at depth d is an object.
	var inStr, esc, objs uint64
	depth, rec := 0, s.record
	for base := 0; base < n; {
		k := min((n-base)/blockSize, maskBatch)
		if k > 0 {
			jsonMasksOf(line[base:base+k*blockSize], masks[:k])
		} else if n >= blockSize {
			// The last, partial block: the masks of the line's last 64 bytes, shifted down so
			// that bit 0 is base's byte; the bits above the line's end come in as zeros.
			jsonMasksOf(line[n-blockSize:], masks[:1])
			m, sh := &masks[0], uint(blockSize-(n-base))
			m.quote, m.bslash, m.open, m.close = m.quote>>sh, m.bslash>>sh, m.open>>sh, m.close>>sh
			k = 1
		} else {
			copy(pad[:], line) // pad is all spaces past the line
			jsonMasksOf(pad[:], masks[:1])
			k = 1
		}
		for j := range k {
			m := &masks[j]
			if b := base / blockSize; b < plainBlocks {
				s.plain[b] = m.quote | m.bslash
			}
			e, next := escapedBits(m.bslash, esc)
			in := prefixXor(m.quote&^e) ^ inStr
			if m.bslash&^in != 0 {
				return lineBackslash
			}
			inStr, esc = uint64(int64(in)>>63), next
			for br := (m.open | m.close) &^ in; br != 0; br &= br - 1 {
				i := base + bits.TrailingZeros64(br)
				c := line[i]
				// Bit 1 tells an opening bracket from a closing one, bit 5 '{' and '}' from '['
				// and ']' (as in runBlocks). objs is a stack of kinds, the innermost in bit 0.
				obj := uint64(c >> 5 & 1)
				if c&2 != 0 {
					if depth >= lineDepth {
						return lineDeep
					}
					objs = objs<<1 | obj
					depth++
					if depth <= spanDepth && rec {
						s.open[depth] = len(s.spans)
						s.spans = append(s.spans, jsonSpan{start: i})
					}
					continue
				}
				if depth == 0 || objs&1 != obj {
					return lineBad
				}
				objs >>= 1
				if depth <= spanDepth {
					if rec {
						s.spans[s.open[depth]].end = i + 1
					}
					if depth == 1 {
						if i != n-1 {
							return lineEarly
						}
						s.pos = n
						s.nplain = min(base/blockSize+1, plainBlocks)
						return lineOK
					}
				}
				depth--
			}
			base += blockSize
		}
	}
	return lineOpen
}
