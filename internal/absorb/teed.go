package absorb

import (
	"fmt"

	"github.com/watchsan/watchsan/internal/stream"
)

// A client's own list, kept as the state at its resourceVersion (docs/design.md section 12, "a
// client's own list"). A client that lists and then watches from the list's resourceVersion
// L (kubectl get -w, older reflectors, scripts) holds exactly that list: a list answered whole,
// at resourceVersion "" (a consistent read) or "0" (the watch cache's), is the scope's true
// state at L, and so what the client holds when its watch begins at L. Teed is a copy of such
// a list's body as it is written to the client (the client never waits for it), held within
// the budget; State makes it a state complete at L, which the caller parks for that client's
// watch from L.

// The values of watchsan_watch_absorb_client_lists_total's result label (ClientListResults).
const (
	// ClientListParked: the list was parked as the state at its resourceVersion.
	ClientListParked = "parked"
	// ClientListOverBudget: the list, or its state, would pass --watch-absorb-state-bytes or
	// --watch-absorb-total-bytes.
	ClientListOverBudget = "over-budget"
	// ClientListUnread: not a list absorbing reads (an error status, a format without a list
	// codec, a compressed body, a page of a paginated list), malformed, or cut short.
	ClientListUnread = "unread"
)

// ClientListResults lists watchsan_watch_absorb_client_lists_total's results.
var ClientListResults = []string{ClientListParked, ClientListOverBudget, ClientListUnread}

// Teed is one list response's body, copied as it is written (NewTeed). Its fields are its
// writer's (the request's handler) alone.
type Teed struct {
	budget *Budget
	format stream.Format
	codec  stream.ListCodec
	buf    []byte
	// held is what buf holds of the budget: its capacity.
	held int64
	// why, once set, says why the list is abandoned (a ClientListResults value); "": it is
	// being read.
	why string
}

// NewTeed is an empty copy of a list answered in format, read with codec (nil: a format
// absorbing does not read, and the copy is abandoned at once), within b.
func NewTeed(b *Budget, format stream.Format, codec stream.ListCodec) *Teed {
	t := &Teed{budget: b, format: format, codec: codec}
	if t.codec == nil {
		t.why = ClientListUnread
	}
	return t
}

// Write copies p, the body's next bytes as the client got them, within one state's bound and
// the total; past either the list is abandoned and what it held given back.
func (t *Teed) Write(p []byte) {
	if t.why != "" || len(p) == 0 {
		return
	}
	if int64(len(t.buf)+len(p)) > t.budget.perFeed {
		t.Abandon(ClientListOverBudget)
		return
	}
	if len(t.buf)+len(p) > cap(t.buf) {
		n := max(2*cap(t.buf), len(t.buf)+len(p), 4096)
		n = int(min(int64(n), t.budget.perFeed))
		if !t.budget.take(int64(n) - t.held) {
			t.Abandon(ClientListOverBudget)
			return
		}
		t.held = int64(n)
		t.buf = append(make([]byte, 0, n), t.buf...)
	}
	t.buf = append(t.buf, p...)
}

// Abandon lets the copy go: why (a ClientListResults value) is the result.
func (t *Teed) Abandon(why string) {
	if t.why == "" {
		t.why = why
	}
	t.free()
}

func (t *Teed) free() {
	t.budget.give(t.held)
	t.held, t.buf = 0, nil
}

// State is the state of the whole list copied, complete at its resourceVersion rv, or the
// ClientListResults value why there is none. The copy is given back either way.
func (t *Teed) State() (s *State, rv string, why string, err error) {
	if t.why != "" {
		return nil, "", t.why, nil
	}
	defer t.free()
	page, err := t.codec.DecodeList(t.buf)
	if err != nil {
		return nil, "", ClientListUnread, err
	}
	if page.Continue != "" {
		// One page of a paginated list: the client holds the whole list only after its last.
		return nil, "", ClientListUnread, fmt.Errorf("a page of a paginated list")
	}
	l, err := List(t.codec, t.budget, func(string, int64) (*stream.ListPage, int64, error) { return page, 0, nil })
	if err != nil {
		return nil, "", ClientListUnread, err
	}
	defer l.Free()
	s, ok := stateOfList(t.budget, t.format, l)
	if !ok {
		return nil, "", ClientListOverBudget, ErrListBudget
	}
	return s, page.ResourceVersion, "", nil
}

// stateOfList is the state of the list l, complete at its resourceVersion, in format (the list's
// codec's), within b; false when it would pass the budget.
func stateOfList(b *Budget, format stream.Format, l *Listed) (*State, bool) {
	s := NewStateOf(b, format, l.codec)
	for k, it := range l.items {
		if !s.put(k, &obj{uid: it.uid, rv: it.rv, frame: l.codec.Frame(stream.Added, it.frame)}) {
			s.Free()
			return nil, false
		}
	}
	return s, true
}
