// Package chunked writes a watch's response body: batched through net/http's ResponseWriter
// (Batch), or, once the response head is out, as an HTTP/1.1 chunked body on the client's
// hijacked connection (Conn), and keeps the hijacked connections that shutdown waits for (Set).
//
// What it owns: the connection after the hijack (its deadlines, its chunk framing, its last
// chunk, its close), the one goroutine per connection that waits in a 1-byte Read for the
// client to leave, the count of body bytes written, the batch buffers and their charge against
// the memory budget. One Conn serves both kinds of watch that take their connection
// (docs/design.md section 5, "One write per flush": a private watch writing its batches; section
// 11: a detached shared watch writing its member's queued frames).
//
// What it may import: the standard library and internal/budget. Nothing of the watch layer
// (internal/watch): what it needs is given at construction (the write timeout, the budget
// account, the callbacks in Options). Deadlines are on the real clock, as a connection's
// deadlines are (net.Conn.SetWriteDeadline); it starts no timer of its own.
package chunked
