package stream

import (
	"bytes"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDecodeStatus(t *testing.T) {
	want := &metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired, Message: "too old resource version: 5 (9)"}
	for _, f := range []Format{JSON, Protobuf, CBOR} {
		frame, err := EncodeEvent(f, Error, want)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := NewReader(f, bytes.NewReader(frame), 0).Next()
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		st, err := DecodeStatus(f, ev)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if st.Code != 410 || st.Reason != metav1.StatusReasonExpired || st.Message != want.Message {
			t.Fatalf("%s: decoded %+v", f, st)
		}
		bad := ev.Clone()
		bad.Raw = bad.Raw[:len(bad.Raw)/2]
		if _, err := DecodeStatus(f, bad); err == nil {
			t.Fatalf("%s: a truncated ERROR event decoded", f)
		}
	}
}
