package absorb

import (
	"errors"
	"fmt"
	"strings"

	"github.com/watchsan/watchsan/internal/stream"
)

// ErrListGone: the list's resourceVersion is gone (compacted). A Pager wraps it.
var ErrListGone = errors.New("the list's resourceVersion is gone")

// ErrListBudget: the list would pass the state's budget. A Pager returns it for a page over
// its max.
var ErrListBudget = errors.New("the list is larger than the watch's state budget")

// Pager gets one page of a scope's list: cont is the previous page's continue token ("" for the
// first page), max the bytes its body may have; it returns the page decoded and its body's
// size, or an error (ErrListBudget for a body over max, ErrListGone wrapped for a 410).
type Pager func(cont string, max int64) (*stream.ListPage, int64, error)

// Listed is a list of a feed's scope, read whole (List); Free gives back what it holds.
type Listed struct {
	codec            stream.ListCodec // the feed's format's
	budget           *Budget
	held             int64 // bytes taken from the budget while it is held
	kind, apiVersion string
	rv               uint64
	items            map[string]*obj // by namespace/name; frame: the item as a watch event's object
	pages            int
}

// RV is the list's resourceVersion, Len its objects, Pages the pages it was read in.
func (l *Listed) RV() uint64 { return l.rv }
func (l *Listed) Len() int   { return len(l.items) }
func (l *Listed) Pages() int { return l.pages }

// Free gives back to the budget what the list held.
func (l *Listed) Free() { l.budget.give(l.held) }

// List reads a scope's list whole in codec's format, page by page through page, holding what
// it read against b (each page's bytes and each item's Overhead), within one state's bound.
func List(codec stream.ListCodec, b *Budget, page Pager) (*Listed, error) {
	l := &Listed{codec: codec, budget: b, items: map[string]*obj{}}
	cont := ""
	for {
		p, n, err := page(cont, b.perFeed-l.held)
		if err == nil {
			err = l.add(p, n)
		}
		if err != nil {
			l.Free()
			return nil, err
		}
		cont = p.Continue
		if cont == "" {
			return l, nil
		}
	}
}

// add reads the page p, of n bytes, into l, holding them against the budget (with each item's
// Overhead), within one state's bound. The first page sets the list's kind, apiVersion and
// resourceVersion.
func (l *Listed) add(p *stream.ListPage, n int64) error {
	cost := n + int64(len(p.Items))*Overhead
	if l.held+cost > l.budget.perFeed || !l.budget.take(cost) {
		return ErrListBudget
	}
	l.held += cost
	l.pages++
	if l.pages == 1 {
		l.kind, l.apiVersion = strings.TrimSuffix(p.Kind, "List"), p.APIVersion
		rv, ok := stream.ParseRV(p.ResourceVersion)
		if !ok || l.kind == "" || l.apiVersion == "" {
			return fmt.Errorf("the list's kind %q, apiVersion %q or resourceVersion %q is not one watchsan reads", p.Kind, p.APIVersion, p.ResourceVersion)
		}
		l.rv = rv
	}
	for _, raw := range p.Items {
		key, it, err := l.codec.Item(l.kind, l.apiVersion, raw)
		if err != nil {
			return err
		}
		l.items[key] = &obj{uid: it.UID, rv: it.RV, frame: it.Object}
	}
	return nil
}
