package absorb

import (
	"fmt"
	"strings"
	"testing"

	"github.com/watchsan/watchsan/internal/stream"
)

// cmList is a JSON ConfigMapList at rv of n configmaps (cont: its continue token).
func cmList(rv, cont string, from, n int) string {
	var its []string
	for i := from; i < from+n; i++ {
		its = append(its, fmt.Sprintf(`{"metadata":{"name":"c%d","namespace":"d","uid":"u%d","resourceVersion":"%d"},"data":{"v":"x"}}`, i, i, 10+i))
	}
	return fmt.Sprintf(`{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":%q,"continue":%q},"items":[%s]}`, rv, cont, strings.Join(its, ","))
}

// teeOf copies body into a new Teed in writes of 7 bytes, as a proxy passes a body on.
func teeOf(b *Budget, body string) *Teed {
	t := NewTeed(b, stream.JSON, stream.ListCodecFor(stream.JSON), false)
	for len(body) > 0 {
		n := min(7, len(body))
		t.Write([]byte(body[:n]))
		body = body[n:]
	}
	return t
}

// A client's list copied in pages is the state at its resourceVersion: every item of every
// page, each a watch event's frame; the copies and the list are given back, and the state
// alone is held.
func TestTeedPagesMakeTheState(t *testing.T) {
	b := NewBudget(1<<20, 4<<20, nil, nil)
	l, cont, why, err := teeOf(b, cmList("30", "p1", 0, 3)).Page(nil)
	if l == nil || cont != "p1" || why != "" || err != nil {
		t.Fatalf("first page: %v %q %q %v", l, cont, why, err)
	}
	l, cont, why, err = teeOf(b, cmList("30", "", 3, 2)).Page(l)
	if l == nil || cont != "" || why != "" || err != nil {
		t.Fatalf("last page: %v %q %q %v", l, cont, why, err)
	}
	s, rv, why := l.State(stream.JSON)
	if s == nil || rv != "30" || why != "" || len(s.objs) != 5 || s.objs["d/c4"].rv != 14 || !strings.HasPrefix(string(s.objs["d/c4"].frame), `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1",`) {
		t.Fatalf("state %v at %q (%q)", s, rv, why)
	}
	if b.Held() != s.bytes || b.copies.Load() != 0 {
		t.Fatalf("%d bytes held, %d of copies; want the state's %d alone", b.Held(), b.copies.Load(), s.bytes)
	}
	s.Free()
	// A page at another resourceVersion is not the same snapshot.
	l, _, _, _ = teeOf(b, cmList("30", "p1", 0, 3)).Page(nil)
	if l, _, why, _ := teeOf(b, cmList("31", "", 3, 2)).Page(l); l != nil || why != ClientListUnread {
		t.Fatalf("a page at another resourceVersion: %v %q", l, why)
	}
	if b.Held() != 0 {
		t.Fatalf("%d bytes held after every list was refused or freed", b.Held())
	}
}

// The copies of lists in flight hold at most a quarter of the total together: a storm of lists
// never takes the budget the feeds' states need; one over it is abandoned, over-budget.
func TestTeedCopiesWithinAQuarterOfTheTotal(t *testing.T) {
	b := NewBudget(1<<20, 64<<10, nil, nil)
	body := cmList("30", "", 0, 60) // about 6 KiB
	var held []*Teed
	for range 8 {
		held = append(held, teeOf(b, body))
	}
	over := 0
	for _, t := range held {
		if t.why == ClientListOverBudget {
			over++
		}
	}
	if over == 0 || b.copies.Load() > b.total/4 || b.Held() != b.copies.Load() {
		t.Fatalf("%d of 8 copies abandoned, copies hold %d, held %d; want some abandoned and at most %d", over, b.copies.Load(), b.Held(), b.total/4)
	}
	for _, t := range held {
		t.Abandon(ClientListUnread)
	}
	if b.Held() != 0 || b.copies.Load() != 0 {
		t.Fatalf("%d bytes held after every copy was let go", b.Held())
	}
}

// BenchmarkTeedList is what keeping a client's list costs: a 500-configmap JSON list (about
// 1 KiB each) copied in 32 KiB writes, decoded, made a state and freed.
func BenchmarkTeedList(b *testing.B) {
	var its []string
	for i := range 500 {
		its = append(its, fmt.Sprintf(`{"metadata":{"name":"c%d","namespace":"d","uid":"u-%08d","resourceVersion":"%d"},"data":{"v":%q}}`, i, i, 10+i, strings.Repeat("x", 900)))
	}
	body := []byte(fmt.Sprintf(`{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"600"},"items":[%s]}`, strings.Join(its, ",")))
	bud := NewBudget(16<<20, 128<<20, nil, nil)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		t := NewTeed(bud, stream.JSON, stream.ListCodecFor(stream.JSON), false)
		for p := body; len(p) > 0; p = p[min(len(p), 32<<10):] {
			t.Write(p[:min(len(p), 32<<10)])
		}
		l, _, _, err := t.Page(nil)
		if err != nil {
			b.Fatal(err)
		}
		s, _, _ := l.State(stream.JSON)
		s.Free()
	}
}
