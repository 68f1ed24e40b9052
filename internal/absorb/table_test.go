package absorb

import (
	"fmt"
	"strings"
	"testing"

	"github.com/watchsan/watchsan/internal/stream"
)

// tableEv is a Table watch event of one configmap row whose object is at rowRV, the Table at
// rv (the same, but in an absorb's DELETED).
func tableEv(typ, name, uid, rowRV, rv string) string {
	return fmt.Sprintf(`{"type":%q,"object":{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":%q},"columnDefinitions":null,"rows":[{"cells":[%q],"object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":%q,"namespace":"d","uid":%q,"resourceVersion":%q}}}]}}`+"\n", typ, rv, name, name, uid, rowRV)
}

// A Table watch's state is keyed by each event's row (the Reader reads no name from a Table):
// ADDED and MODIFIED hold it, a DELETED lets it go, also an absorb's DELETED whose Table is at
// the last delivered resourceVersion and whose row is the object's last; and the diff against a
// Table list takes it to the list in Table events.
func TestTableStateKeyedByRow(t *testing.T) {
	b := NewBudget(1<<20, 1<<20, nil, nil)
	codec := stream.ListCodecForAccept(stream.JSON, "application/json;as=Table;v=v1;g=meta.k8s.io")
	h := &Holder{}
	h.Hold(NewStateOf(b, stream.JSON, codec), "k")
	for _, e := range []string{tableEv("ADDED", "a", "ua", "10", "10"), tableEv("ADDED", "b", "ub", "11", "11"), tableEv("ADDED", "c", "uc", "12", "12"),
		tableEv("MODIFIED", "a", "ua", "13", "13"), tableEv("DELETED", "c", "uc", "12", "13")} {
		if why := h.Observe(readEvent(t, e)); why != "" {
			t.Fatalf("%s dropped the state: %s", e, why)
		}
	}
	s := h.State()
	if len(s.objs) != 2 || s.objs["d/a"] == nil || s.objs["d/a"].rv != 13 || s.objs["d/b"].uid != "ub" {
		t.Fatalf("the state holds %v", s.objs)
	}
	row := func(name, uid, rv string) string {
		return fmt.Sprintf(`{"cells":[%q],"object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":%q,"namespace":"d","uid":%q,"resourceVersion":%q}}}`, name, name, uid, rv)
	}
	body := `{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"20"},"columnDefinitions":[],"rows":[` + row("a", "ua", "13") + "," + row("e", "ue", "15") + `]}`
	l, err := List(codec, b, func(string, int64) (*stream.ListPage, int64, error) {
		p, err := codec.DecodeList([]byte(body))
		return p, int64(len(body)), err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Free()
	evs, err := h.Diff(stream.JSON, l, 13, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		key, uid, _, _ := stream.RowOf(e.Ev.Raw)
		got = append(got, fmt.Sprintf("%s %s/%s@%s", e.Ev.Type, key, uid, e.Ev.RV))
		if e.Ev.Type != stream.Bookmark && !strings.Contains(string(e.Ev.Raw), `"kind":"Table"`) {
			t.Errorf("%s is no Table", e.Ev.Raw)
		}
	}
	if s, want := strings.Join(got, ", "), "DELETED d/b/ub@13, ADDED d/e/ue@15, BOOKMARK /@20"; s != want {
		t.Fatalf("diff [%s], want [%s]", s, want)
	}
	for _, e := range evs {
		if why := h.Observe(e.Ev); why != "" {
			t.Fatalf("the absorb's %s dropped the state: %s", e.Ev.Raw, why)
		}
	}
	if len(s.objs) != 2 || s.objs["d/b"] != nil || s.objs["d/e"] == nil {
		t.Fatalf("after the absorb the state holds %v", s.objs)
	}
}
