package stream

import (
	"mime"
	"strings"
)

// Format is the wire format of a watch stream.
type Format int

// The three formats an apiserver answers a watch in.
const (
	// JSON: a sequence of {"type":..,"object":{..}} values, one per line in practice.
	JSON Format = iota + 1
	// Protobuf: 4-byte big-endian length frames, each a metav1.WatchEvent message.
	Protobuf
	// CBOR: an RFC 8742 sequence of self-described CBOR items, each a {type, object} map.
	CBOR
)

// String returns the format's short name ("json", "protobuf", "cbor"), for logs and metric labels.
func (f Format) String() string {
	switch f {
	case JSON:
		return "json"
	case Protobuf:
		return "protobuf"
	case CBOR:
		return "cbor"
	}
	return "unknown"
}

// ContentType is the Content-Type of a watch response in this format, as the apiserver writes it.
func (f Format) ContentType() string {
	switch f {
	case JSON:
		return "application/json"
	case Protobuf:
		return "application/vnd.kubernetes.protobuf;stream=watch"
	case CBOR:
		return "application/cbor-seq"
	}
	return ""
}

// FormatOf reports the format of a watch response from its Content-Type. Parameters are
// tolerated ("application/json;charset=utf-8"); "application/cbor" is accepted as well as the
// "application/cbor-seq" the apiserver sends, since a CBOR item sequence is self-delimiting
// either way. Anything else (YAML, an HTML error page, a Table as text) is not a watch format.
func FormatOf(contentType string) (Format, bool) {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		// Be as lenient as client-go, which falls back to the bare type before ';'.
		mt, _, _ = strings.Cut(contentType, ";")
		mt = strings.ToLower(strings.TrimSpace(mt))
	}
	switch mt {
	case "application/json":
		return JSON, true
	case "application/vnd.kubernetes.protobuf":
		return Protobuf, true
	case "application/cbor-seq", "application/cbor":
		return CBOR, true
	}
	return 0, false
}
