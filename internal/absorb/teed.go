package absorb

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"strconv"

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
	// codec, a compressed body, a page at another resourceVersion than the list's first),
	// malformed, or cut short.
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
	// gzip: the body is gzip-encoded (the apiserver compresses a response over 128 KiB to a
	// client that accepts gzip: kubectl, client-go); false: identity.
	gzip bool
}

// NewTeed is an empty copy of a list answered in format, read with codec (nil: a format
// absorbing does not read, and the copy is abandoned at once), within b; gzipped: its body is
// gzip-encoded.
func NewTeed(b *Budget, format stream.Format, codec stream.ListCodec, gzipped bool) *Teed {
	t := &Teed{budget: b, format: format, codec: codec, gzip: gzipped}
	if t.codec == nil {
		t.why = ClientListUnread
	}
	return t
}

// Write copies p, the body's next bytes as the client got them, within one state's bound, the
// total, and the quarter of the total all copies may hold (Budget.takeCopy); past any the list
// is abandoned and what it held given back.
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
		if !t.budget.takeCopy(int64(n) - t.held) {
			t.Abandon(ClientListOverBudget)
			return
		}
		t.held = int64(n)
		t.buf = append(make([]byte, 0, n), t.buf...)
	}
	t.buf = append(t.buf, p...)
}

// Format is the format the list is answered in.
func (t *Teed) Format() stream.Format { return t.format }

// Abandon lets the copy go: why (a ClientListResults value) is the result.
func (t *Teed) Abandon(why string) {
	if t.why == "" {
		t.why = why
	}
	t.free()
}

func (t *Teed) free() {
	t.budget.giveCopy(t.held)
	t.held, t.buf = 0, nil
}

// Page reads the page copied into the list read so far, prev (nil: this is the list's first
// page), and returns the list so far and the page's continue token ("": it was the list's
// last). The pages of one list are one snapshot (the apiserver's continue token carries the
// first page's resourceVersion), so a page at another resourceVersion is refused. With no list
// (why, a ClientListResults value), prev was freed. The copy is given back either way.
func (t *Teed) Page(prev *Listed) (l *Listed, cont string, why string, err error) {
	fail := func(why string, err error) (*Listed, string, string, error) {
		if l != nil {
			l.Free()
		} else if prev != nil {
			prev.Free()
		}
		return nil, "", why, err
	}
	if t.why != "" {
		return fail(t.why, nil)
	}
	body := t.buf
	if t.gzip {
		if body, err = gunzip(body, t.budget.perFeed); err != nil {
			t.free()
			if errors.Is(err, ErrListBudget) {
				return fail(ClientListOverBudget, err)
			}
			return fail(ClientListUnread, err)
		}
	}
	page, err := t.codec.DecodeList(body)
	n := int64(len(body))
	t.free()
	if err != nil {
		return fail(ClientListUnread, err)
	}
	l = prev
	if l == nil {
		l = &Listed{codec: t.codec, budget: t.budget, items: map[string]*obj{}}
	} else if rv, ok := stream.ParseRV(page.ResourceVersion); page.ResourceVersion != "" && (!ok || rv != l.rv) {
		return fail(ClientListUnread, fmt.Errorf("a page at resourceVersion %q of a list at %d", page.ResourceVersion, l.rv))
	}
	if err := l.add(page, n); err != nil {
		if errors.Is(err, ErrListBudget) {
			return fail(ClientListOverBudget, err)
		}
		return fail(ClientListUnread, err)
	}
	return l, page.Continue, "", nil
}

// State is the state of the whole list l, complete at its resourceVersion rv, in format (the
// format its frames are read in), or the ClientListResults value why there is none. l is
// freed either way.
func (l *Listed) State(format stream.Format) (s *State, rv string, why string) {
	defer l.Free()
	s, ok := stateOfList(l.budget, format, l)
	if !ok {
		return nil, "", ClientListOverBudget
	}
	return s, strconv.FormatUint(l.rv, 10), ""
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

// gunzip is the gzip body z decoded, at most max bytes (ErrListBudget past them). Its bytes
// are counted when the page decoded from them is added to its list (Listed.add), the
// compressed copy given back first.
func gunzip(z []byte, max int64) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(z))
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	n, err := out.ReadFrom(io.LimitReader(zr, max+1))
	if err != nil {
		return nil, err
	}
	if n > max {
		return nil, ErrListBudget
	}
	return out.Bytes(), nil
}
