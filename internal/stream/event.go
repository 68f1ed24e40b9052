// Package stream reads and writes Kubernetes watch streams in the three wire formats the
// apiserver speaks (JSON, protobuf, CBOR), parsing only the event envelope and the object's
// identifying metadata, and leaving every other byte as the apiserver sent it.
//
// A Reader splits a response body into frames (they may arrive split at any byte), bounded
// by a size limit, and reads each frame the way client-go's decoders would read it: for
// every input they decode, it reports the same type, resourceVersion, uid, namespace, name
// and initial-events-end mark (the tests hold it to that with apimachinery as the oracle).
// It does not validate what it skips, so some frames a client would reject pass as events;
// none of those can change what it reports. A Writer writes an event on unchanged, or with
// only its resourceVersion replaced in place.
//
// It imports nothing else of watchsan's.
package stream

import (
	"errors"
	"math"
)

// Event types, as the apiserver writes them.
const (
	Added    = "ADDED"
	Modified = "MODIFIED"
	Deleted  = "DELETED"
	Bookmark = "BOOKMARK"
	Error    = "ERROR"
)

// InitialEventsEndAnnotation marks the bookmark that ends the initial phase of a watch
// (sendInitialEvents=true, or allowWatchBookmarks=true from RV "" or "0" on modern servers).
const InitialEventsEndAnnotation = "k8s.io/initial-events-end"

// Event is one watch event as read from the wire. Raw aliases the reader's buffer and the
// *Event itself is reused: both are valid until the next call to the Reader's Next. Copy what
// must outlive that (Clone). The string fields are ordinary immutable strings, safe to keep;
// they share a block of at most 512 bytes with other events' strings (strings.go), so a
// holder of many strings from different events, such as a cache by object, clones them
// (strings.Clone) to hold only their own bytes.
type Event struct {
	// Type is ADDED, MODIFIED, DELETED, BOOKMARK or ERROR (or whatever the upstream sent).
	Type string
	// RV is the object's metadata.resourceVersion, "" when absent. For a Status (ERROR
	// events), a Table or a list it is the ListMeta's.
	RV string
	// RVInt is RV as an unsigned integer; RVIsInt says whether RV parsed as one.
	RVInt   uint64
	RVIsInt bool
	// UID, Namespace and Name identify the object; empty where the object has none.
	UID       string
	Namespace string
	Name      string
	// InitialEventsEnd is true for a BOOKMARK annotated k8s.io/initial-events-end: "true".
	InitialEventsEnd bool
	// Raw is the whole frame exactly as it was on the wire, framing included: the 4-byte
	// length prefix for protobuf; for JSON the value and the newline after it when that had
	// arrived with it (the Reader never waits for it; whitespace between values is dropped,
	// and a Writer puts the newline back).
	Raw []byte

	// rv locates the resourceVersion value inside Raw for in-place rewriting.
	rv rvLocation
}

// maxLens is how many protobuf length fields can enclose a resourceVersion: its own length,
// metadata, Unknown.raw, RawExtension.raw and WatchEvent.object (the 4-byte frame length is
// handled apart).
const maxLens = 5

// rvLocation says where the resourceVersion's encoding sits in Event.Raw, so that a Writer can
// replace it without decoding anything else.
type rvLocation struct {
	// format is the format Raw was read in; zero when nothing was located.
	format Format
	// start and end delimit the value's encoding in Raw: for JSON the string token with its
	// quotes; for CBOR the whole string item (head and content, or every chunk and the break
	// of an indefinite-length string); for protobuf the bytes after the length varint.
	start, end int
	// cborMajor is the CBOR major type of the value (2 byte string, 3 text string).
	cborMajor byte
	// lens are the protobuf length varints that enclose the value, outermost first; the last
	// is the value's own length. Each covers the bytes of its field's content.
	lens  [maxLens]pbLen
	nlens int
}

// pbLen is one length varint in a protobuf frame: Raw[start:end] encodes val.
type pbLen struct {
	start, end int
	val        uint64
}

// Clone returns a deep copy of e that stays valid after the reader moves on.
func (e *Event) Clone() *Event {
	if e == nil {
		return nil
	}
	c := *e
	if e.Raw != nil {
		c.Raw = append(make([]byte, 0, len(e.Raw)), e.Raw...)
	}
	return &c
}

// CanRewriteRV reports whether a Writer can replace e's resourceVersion in place: the event was
// read by a Reader and its object has a resourceVersion field. (In protobuf the field is
// present even when empty, so an event with RV "" may be rewritable; in JSON and CBOR an
// empty RV is omitted and is not.)
func (e *Event) CanRewriteRV() bool { return e.rv.format != 0 }

// SetRV sets RV and derives RVInt and RVIsInt from it. Decimal integers compare numerically;
// anything else is opaque (docs/design.md section 2).
func (e *Event) SetRV(rv string) {
	e.RV = rv
	e.RVInt, e.RVIsInt = ParseRV(rv)
}

// ParseRV reports rv's value when it is an unsigned decimal integer without sign or leading
// zeros (how etcd-backed apiservers write it). "" is not an integer; "0" is 0. It does not
// allocate.
func ParseRV(rv string) (uint64, bool) {
	if rv == "" || len(rv) > 20 || (len(rv) > 1 && rv[0] == '0') {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(rv); i++ {
		c := rv[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (math.MaxUint64-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// Errors a Reader returns besides io.EOF (clean end between frames) and
// io.ErrUnexpectedEOF (the stream ended inside a frame).
var (
	// ErrFrameTooLarge: a frame exceeded the reader's size limit.
	ErrFrameTooLarge = errors.New("watch frame exceeds the size limit")
	// ErrMalformed wraps every parse failure of a frame's bytes.
	ErrMalformed = errors.New("malformed watch frame")
	// ErrOverBudget: the Reader's Budget refused the buffer a frame needed.
	ErrOverBudget = errors.New("watch frame refused by the memory budget")
	// ErrClosed: the Reader was closed (Close).
	ErrClosed = errors.New("watch reader closed")
)
