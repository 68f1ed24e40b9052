package stream

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// TestWriteStatus: the ERROR event decodes, with client-go's decoder, to the Status given.
func TestWriteStatus(t *testing.T) {
	st := expired()
	st.Details = &metav1.StatusDetails{Name: "x", RetryAfterSeconds: 1}
	for _, f := range formats {
		var out bytes.Buffer
		if err := NewWriter(f, &out).WriteStatus(st); err != nil {
			t.Fatal(err)
		}
		got, err := decodeOracle(t, f, out.Bytes())
		if err != nil || len(got) != 1 {
			t.Fatalf("%s: %d events, %v", f, len(got), err)
		}
		if got[0].Type != watch.Error {
			t.Fatalf("%s: type %s", f, got[0].Type)
		}
		// (client-go's decoder clears TypeMeta; decoding needed it to be v1 Status.)
		if !equality.Semantic.DeepEqual(got[0].Obj, st) {
			t.Fatalf("%s: got %#v", f, got[0].Obj)
		}
		// Our reader reads it too.
		evs, err := readAll(f, &out, 0)
		if err != nil || len(evs) != 1 || evs[0].Type != Error {
			t.Fatalf("%s: re-read %v, %v", f, evs, err)
		}
		if st.APIVersion != "" {
			t.Fatal("WriteStatus modified its argument")
		}
	}
}

func TestWriteJSONNewline(t *testing.T) {
	ev := &Event{Raw: []byte(`{"type":"ADDED","object":{}}`)}
	var out bytes.Buffer
	if err := NewWriter(JSON, &out).Write(ev); err != nil {
		t.Fatal(err)
	}
	if out.String() != string(ev.Raw)+"\n" {
		t.Fatalf("wrote %q", out.String())
	}
	if string(ev.Raw) != `{"type":"ADDED","object":{}}` {
		t.Fatal("Write modified the event")
	}
	if err := NewWriter(JSON, &out).Write(&Event{}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("empty event: %v", err)
	}
}

type failWriter struct{ err error }

func (f failWriter) Write(p []byte) (int, error) { return 0, f.err }

func TestWriterErrors(t *testing.T) {
	stream := apiStream(t, JSON, []testEvent{{watch.Added, configMap("ns", "a", "u", "5")}}, false)
	evs, err := readAll(JSON, bytes.NewReader(stream), 0)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("broken pipe")
	w := NewWriter(JSON, failWriter{boom})
	if err := w.Write(evs[0]); !errors.Is(err, boom) {
		t.Fatalf("Write: %v", err)
	}
	if err := w.WriteWithRV(evs[0], "6"); !errors.Is(err, boom) {
		t.Fatalf("WriteWithRV: %v", err)
	}
	if err := w.WriteStatus(expired()); !errors.Is(err, boom) {
		t.Fatalf("WriteStatus: %v", err)
	}
	// An event of another format is refused, not mangled.
	var out bytes.Buffer
	if err := NewWriter(Protobuf, &out).WriteWithRV(evs[0], "6"); err == nil || out.Len() != 0 {
		t.Fatalf("cross-format rewrite: %v, wrote %d bytes", err, out.Len())
	}
	// A hand-made event has nothing to rewrite.
	if err := NewWriter(JSON, &out).WriteWithRV(&Event{Raw: stream}, "6"); !errors.Is(err, ErrMalformed) {
		t.Fatalf("hand-made event: %v", err)
	}
}

// TestRewriteKeepsClone: a clone can be rewritten after the reader has moved on.
func TestRewriteKeepsClone(t *testing.T) {
	for _, f := range formats {
		stream := apiStream(t, f, sampleEvents(), false)
		rd := NewReader(f, bytes.NewReader(stream), 0)
		first, err := rd.Next()
		if err != nil {
			t.Fatal(err)
		}
		c := first.Clone()
		for {
			if _, err := rd.Next(); err != nil {
				break
			}
		}
		var out bytes.Buffer
		if err := NewWriter(f, &out).WriteWithRV(c, "555"); err != nil {
			t.Fatal(err)
		}
		evs, err := readAll(f, &out, 0)
		if err != nil || len(evs) != 1 || evs[0].RV != "555" || evs[0].Name != "cm-a" {
			t.Fatalf("%s: %v %v", f, evs, err)
		}
	}
}

func TestEncodeEventNeedsKind(t *testing.T) {
	_, err := EncodeEvent(JSON, Added, configMap("a", "b", "c", "1"))
	if err == nil || !strings.Contains(err.Error(), "apiVersion/kind") {
		t.Fatalf("got %v", err)
	}
	if _, err := EncodeEvent(JSON, Added, nil); err == nil {
		t.Fatal("nil object accepted")
	}
}
