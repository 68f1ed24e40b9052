// Package ring keeps a shared feed's recent events (Ring), so that a client re-watching from a
// resourceVersion the feed already delivered joins it instead of opening a watch of its own,
// and bounds all feeds' rings together (Budget; docs/design.md section 11, "Bounds").
//
// What it owns: the frames a ring holds (each exactly as its feed delivered it, shared
// read-only with the subscribers' queues), the resourceVersion a ring covers from, the
// evictions by a ring's own bounds and by the budget's total, and their charge against the
// process's memory budget. A ring's own lock guards its frames; the budget takes one ring's
// lock at a time and never a feed's, so delivery never waits for another feed.
//
// What it may import: the standard library, prometheus and internal/budget. Nothing of the
// watch layer: its feed (internal/watch's sharing) calls it, and gives it its bounds, its
// budget and its eviction counter at construction.
package ring
