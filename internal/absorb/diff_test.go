package absorb

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/watchsan/watchsan/internal/stream"
)

// listOf is a Pager of one JSON ConfigMapList page at rv with items (name, uid, rv).
func listOf(rv string, items ...[3]string) Pager {
	var its []string
	for _, it := range items {
		its = append(its, fmt.Sprintf(`{"metadata":{"name":%q,"namespace":"d","uid":%q,"resourceVersion":%q},"data":{"v":%q}}`, it[0], it[1], it[2], it[2]))
	}
	body := fmt.Sprintf(`{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":%q},"items":[%s]}`, rv, strings.Join(its, ","))
	return func(cont string, max int64) (*stream.ListPage, int64, error) {
		if int64(len(body)) > max {
			return nil, 0, ErrListBudget
		}
		p, err := stream.ListCodecFor(stream.JSON).DecodeList([]byte(body))
		return p, int64(len(body)), err
	}
}

// stateOf is a held state that delivered events.
func stateOf(t *testing.T, b *Budget, events ...string) *Holder {
	t.Helper()
	h := &Holder{}
	h.Hold(NewState(b, stream.JSON), "k")
	for _, e := range events {
		if why := h.Observe(readEvent(t, e)); why != "" {
			t.Fatalf("dropped: %s", why)
		}
	}
	return h
}

// The difference between a state at R and a list at L: a DELETED at R for each object gone or
// replaced (another uid), with its last known object; then ADDED and MODIFIED in ascending
// resourceVersion; then a BOOKMARK at L; nothing for an object unchanged.
func TestDiffTakesTheStateToTheList(t *testing.T) {
	b := NewBudget(1<<20, 1<<20, nil, nil)
	h := stateOf(t, b, cmU("ADDED", "a", "ua", "10"), cmU("ADDED", "b", "ub", "11"), cmU("ADDED", "c", "uc", "12"), cmU("ADDED", "d", "ud", "13"))
	l, err := List(stream.ListCodecFor(stream.JSON), b, listOf("30",
		[3]string{"a", "ua", "10"},  // unchanged
		[3]string{"c", "uc2", "25"}, // replaced: a delete and an add
		[3]string{"d", "ud", "20"},  // modified
		[3]string{"e", "ue", "18"},  // added
	))
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
		got = append(got, fmt.Sprintf("%s %s@%s gone=%v", e.Ev.Type, e.Ev.Name, e.Ev.RV, e.Gone))
	}
	want := []string{"DELETED b@13 gone=true", "DELETED c@13 gone=true", "ADDED e@18 gone=false", "MODIFIED d@20 gone=false", "ADDED c@25 gone=false", "BOOKMARK @30 gone=false"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Fatalf("diff:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if evs[0].Ev.UID != "ub" || evs[4].Ev.UID != "uc2" || !strings.Contains(string(evs[4].Ev.Raw), `"kind":"ConfigMap"`) {
		t.Errorf("the delete carries %q, the add %q (%s): want the state's object and the list's with its kind", evs[0].Ev.UID, evs[4].Ev.UID, evs[4].Ev.Raw)
	}
}

// A list that does not agree with a complete state at R gives no events: one before R, an
// object changed at or before R that the state does not hold as it is.
func TestDiffRefusesAListThatDisagrees(t *testing.T) {
	b := NewBudget(1<<20, 1<<20, nil, nil)
	h := stateOf(t, b, cmU("ADDED", "a", "ua", "10"))
	for name, pages := range map[string]Pager{
		"before R":           listOf("12", [3]string{"a", "ua", "10"}),
		"changed at R":       listOf("30", [3]string{"a", "ua", "13"}),
		"unknown before R":   listOf("30", [3]string{"a", "ua", "10"}, [3]string{"z", "uz", "9"}),
		"beyond the list RV": listOf("30", [3]string{"a", "ua", "31"}),
	} {
		l, err := List(stream.ListCodecFor(stream.JSON), b, pages)
		if err != nil {
			t.Fatal(err)
		}
		if evs, err := h.Diff(stream.JSON, l, 13, 1<<20); err == nil {
			t.Errorf("%s: %d events, want an error", name, len(evs))
		}
		l.Free()
	}
	if n := b.Held(); n == 0 {
		t.Fatal("the state holds nothing")
	}
}

// A list is held against the budget while it is read, and over one state's bound it fails
// with ErrListBudget, giving back what it held.
func TestListHeldWithinTheBudget(t *testing.T) {
	b := NewBudget(400, 1<<20, nil, nil)
	_, err := List(stream.ListCodecFor(stream.JSON), b, listOf("30", [3]string{"a", "ua", "10"}, [3]string{"b", "ub", "11"}))
	if !errors.Is(err, ErrListBudget) || b.Held() != 0 {
		t.Fatalf("a list over the bound: %v, %d bytes held; want ErrListBudget and none", err, b.Held())
	}
}

// A completing list makes the holder hold the list's state at exactly C; one at another
// resourceVersion, or a gone one, leaves it holding none (NotComplete).
func TestCompleteHoldsTheListsState(t *testing.T) {
	b := NewBudget(1<<20, 1<<20, nil, nil)
	h := &Holder{}
	l, err := List(stream.ListCodecFor(stream.JSON), b, listOf("20", [3]string{"a", "ua", "10"}))
	if res, err := h.Complete(b, stream.JSON, "k", "20", l, err); res != CompleteDone || err != nil || h.State() == nil || h.Unable(true) != "" {
		t.Fatalf("complete: %s %v, unable %q", res, err, h.Unable(true))
	}
	h2 := &Holder{}
	l, err = List(stream.ListCodecFor(stream.JSON), b, listOf("21", [3]string{"a", "ua", "10"}))
	if res, _ := h2.Complete(b, stream.JSON, "k", "20", l, err); res != CompleteFailed || h2.State() != nil || h2.Unable(true) != NotComplete {
		t.Fatalf("a list at another resourceVersion: %s, unable %q", res, h2.Unable(true))
	}
	if res, _ := h2.Complete(b, stream.JSON, "k", "20", nil, fmt.Errorf("x: %w", ErrListGone)); res != CompleteGone {
		t.Fatalf("a gone list: %s", res)
	}
	h.Free()
	if b.Held() != 0 {
		t.Fatalf("%d bytes held after every state and list was freed", b.Held())
	}
}
