package fix_test

import (
	"fmt"

	"github.com/watchsan/watchsan/internal/fix"
	"github.com/watchsan/watchsan/internal/stream"
)

// A caller's loop over one watch served by a 1.7-era apiserver: the DELETED of a carries a's
// creation RV. The client gets it once, at 13; when it re-watches from 13 the replay is dropped.
func Example() {
	mem := fix.NewDeleteMemory(0, 0, nil) // one per process
	const scope = "/api/v1/namespaces/default/services|user=ctrl"

	events := []stream.Event{
		{Type: stream.Added, UID: "uid-a", Namespace: "default", Name: "a"},
		{Type: stream.Added, UID: "uid-b", Namespace: "default", Name: "b"},
		{Type: stream.Added, UID: "uid-c", Namespace: "default", Name: "c"},
		{Type: stream.Deleted, UID: "uid-a", Namespace: "default", Name: "a"},
	}
	for i, rv := range []string{"10", "11", "12", "10"} {
		events[i].SetRV(rv)
	}

	s := fix.NewStream(fix.Options{Scope: scope, StartRV: "9", Memory: mem})
	for i := range events {
		ev := &events[i]
		d := s.Decide(ev)
		switch d.Action {
		case fix.Pass:
			fmt.Println("write", ev.Type, ev.Name, ev.RV)
		case fix.Rewrite:
			fmt.Println("write", ev.Type, ev.Name, d.RV, "instead of", ev.RV, "("+d.Reason.String()+")")
		case fix.Drop:
			fmt.Println("drop", ev.Type, ev.Name, ev.RV, "("+d.Reason.String()+")")
		}
	}
	fmt.Println("resume point", s.LastDelivered())

	again := fix.NewStream(fix.Options{Scope: scope, StartRV: s.LastDelivered(), Memory: mem})
	d := again.Decide(&events[3])
	fmt.Println("re-watch:", d.Action, events[3].Type, events[3].Name, "("+d.Reason.String()+")")
	// Output:
	// write ADDED a 10
	// write ADDED b 11
	// write ADDED c 12
	// write DELETED a 13 instead of 10 (delete-regressed)
	// resume point 13
	// re-watch: dropped DELETED a (delete-remembered)
}
