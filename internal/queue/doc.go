// Package queue is a shared watch's subscriber's queue of frames (Frames): the frames its feed
// delivered and its client has not been written yet, oldest first, in fixed blocks, so that a
// queue holds no more than its entries and a block's worth besides, and nothing once emptied.
//
// What it owns: the entries and the blocks that hold them; the frames are its caller's,
// shared read-only. What one entry costs beyond its frame's bytes (EntryCost) is its own
// measure, which the subscriber counts against its bound and the memory budget
// (docs/design.md section 11, "Bounds"). It takes no lock: its subscriber's guards it.
//
// What it may import: the standard library only. Nothing of the watch layer: the subscriber
// (internal/watch's sharing) calls it.
package queue
