// Package absorb is the 410 state and list-diff (docs/design.md section 12): what a feed's
// subscribers hold, kept so that a 410 at the feed's resume point can be answered with the
// difference between a fresh list and that state instead of reaching the clients.
//
// It owns a feed's state (State, within a Budget all states share), the states of ended
// watches parked for their clients' re-watches (Parked), a feed's hold on its state and the
// pacing of its absorbs (Holder), reading a list whole within the budget (List, through a
// Pager its caller gives) and the events that take a state to a list (Holder.Diff). It decides
// and returns; it never writes to a client nor sends a request: the feed (internal/watch)
// sends the events it returns, counts and logs them, and fetches the pages.
//
// It may import internal/stream (the wire formats and their list codecs), internal/budget and
// internal/upstream (the Backoff an absorb's list is paced by), and nothing of the watch layer.
package absorb
