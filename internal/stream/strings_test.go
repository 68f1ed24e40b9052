package stream

import (
	"bytes"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/watch"
)

// An event's strings are carved from blocks shared with other events' (strings.go): each
// stays what it was when read after the Reader has carved hundreds of later ones, in many
// blocks, in every format.
func TestEventStringsOutliveTheirBlock(t *testing.T) {
	var evs []testEvent
	for i := range 300 {
		evs = append(evs, testEvent{watch.Modified, configMap(fmt.Sprintf("ns-%d", i%7), fmt.Sprintf("cm-%04d", i),
			fmt.Sprintf("0d8e5d8c-%04d-4c1a-9d1b-3f7e0a000001", i), fmt.Sprint(1000+i))})
	}
	for _, f := range []Format{JSON, Protobuf, CBOR} {
		t.Run(f.String(), func(t *testing.T) {
			got, err := readAll(f, bytes.NewReader(apiStream(t, f, evs, false)), 1<<20)
			if err != nil || len(got) != len(evs) {
				t.Fatalf("read %d events (%v), want %d", len(got), err, len(evs))
			}
			if n := len(got[0].RV + got[0].UID + got[0].Namespace + got[0].Name); 300*n < 20*strBlock {
				t.Fatalf("the events' strings (%d bytes each) fill fewer than 20 blocks: the test shows nothing", n)
			}
			for i, ev := range got {
				want := fmt.Sprintf("%s/%s %s %d", fmt.Sprintf("ns-%d", i%7), fmt.Sprintf("cm-%04d", i), fmt.Sprintf("0d8e5d8c-%04d-4c1a-9d1b-3f7e0a000001", i), 1000+i)
				if s := fmt.Sprintf("%s/%s %s %s", ev.Namespace, ev.Name, ev.UID, ev.RV); s != want {
					t.Fatalf("event %d reads %q after the later events, want %q", i, s, want)
				}
			}
		})
	}
}
