package stream

import "unsafe"

// An event's strings (RV, UID, Namespace, Name) are carved from a block shared by the strings
// of several events, so that reading an event allocates once per block rather than once per
// event: about 6% of watchsan's CPU at 1 KiB events went to that one allocation and the
// garbage collection it fed.
//
// Why the strings are ordinary immutable strings: a block's bytes are written once, by the
// append that carves a string, before the string exists, and never again; the next string
// is carved after them, and a full block is replaced by a new one, not reused. A string
// keeps its block alive, which bounds what a kept string can hold to strBlock bytes; a holder
// of many strings of different events (a cache by object) clones them (stream.Event).

// strBlock is a block's size: the strings of a few typical events.
const strBlock = 512

// blockFor is the size of a new block for n bytes of strings. A Reader's first block holds
// its first event's strings exactly: a Reader made for one frame (an absorb's list item)
// allocates no more than before, and a string of it holds no other bytes.
func blockFor(n int, first bool) int {
	if first {
		return n
	}
	return max(n, strBlock)
}

// str appends b to the block, which has room for it, and returns it as a string.
func (ps *parseState) str(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	n := len(ps.strs)
	ps.strs = append(ps.strs, b...)
	return unsafe.String(&ps.strs[n], len(b))
}
