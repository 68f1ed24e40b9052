package stream

import (
	"bytes"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor/direct"
)

// DecodeStatus decodes the metav1.Status an ERROR event carries, with apimachinery's decoders.
// It is for the rare ERROR event (the caller needs its code: 410 means "relist"), never the
// per-event path.
func DecodeStatus(f Format, ev *Event) (*metav1.Status, error) {
	var we metav1.WatchEvent
	var err error
	switch f {
	case JSON:
		err = json.Unmarshal(ev.Raw, &we)
	case Protobuf:
		if len(ev.Raw) < 4 {
			return nil, fmt.Errorf("%w: short protobuf frame", ErrMalformed)
		}
		err = we.Unmarshal(ev.Raw[4:])
	case CBOR:
		err = direct.Unmarshal(ev.Raw, &we)
	default:
		return nil, fmt.Errorf("stream: DecodeStatus: unknown format %d", int(f))
	}
	if err != nil {
		return nil, fmt.Errorf("%w: ERROR event: %w", ErrMalformed, err)
	}
	raw := we.Object.Raw
	var st metav1.Status
	switch f {
	case JSON:
		err = json.Unmarshal(raw, &st)
	case Protobuf:
		if !bytes.HasPrefix(raw, protobufMagic) {
			return nil, fmt.Errorf("%w: ERROR event object lacks the protobuf prefix", ErrMalformed)
		}
		var u runtime.Unknown
		if err = u.Unmarshal(raw[len(protobufMagic):]); err == nil {
			err = st.Unmarshal(u.Raw)
		}
	case CBOR:
		err = direct.Unmarshal(raw, &st)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: ERROR event status: %w", ErrMalformed, err)
	}
	return &st, nil
}
