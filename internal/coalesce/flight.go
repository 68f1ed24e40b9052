package coalesce

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/watchsan/watchsan/internal/apistatus"
	"github.com/watchsan/watchsan/internal/upstream"
)

// flight is one upstream read and the members it serves. Its body is kept as a list of
// chunks from the slowest live member's position to what has been read; each member writes
// from its own position at its own pace. Its fields but the constants are guarded by mu;
// cond is signalled at every change (a chunk read, the headers, the end, a member's progress
// or departure).
type flight struct {
	c    *Coalescer
	key  Key
	kind string
	req  *http.Request // the first member's request: the upstream read is a copy of it
	cred upstream.Credentials
	// fixed: the answer is the same whenever the apiserver reads it (Snapshot), so a request
	// may join the read after it began, while it holds the whole answer (joinLate).
	fixed bool

	mu   sync.Mutex
	cond *sync.Cond
	// count is every member that joined (the bound); live the ones still served.
	count   int
	live    map[*member]struct{}
	started bool // run began
	// headers known: resp's status and header, or err (no response).
	ready  bool
	status int
	header http.Header
	err    error
	// chunks hold the body from byte base on; dropped is the absolute index of chunks[0].
	chunks  [][]byte
	base    int64
	dropped int
	end     int64 // bytes read so far
	// done: the body ended; bodyErr says how (nil: at its end).
	done    bool
	bodyErr error
	// cancel ends the upstream read (set by run once sent).
	cancel context.CancelFunc
	// kept: a fixed read, read to its end, whose members all left, kept for keepFixed for
	// later members (joinLate); expired once that passed and no member came.
	kept, expired bool
}

// member is one request a flight serves; its fields are guarded by the flight's mu.
type member struct {
	pos     int64 // bytes written to the client
	ci      int   // absolute index of the chunk holding pos
	off     int   // pos's offset in that chunk
	lagging bool  // ended for lagging: its response is cut
}

func newFlight(c *Coalescer, key Key, kind string, r *http.Request, cred upstream.Credentials, fixed bool) *flight {
	f := &flight{c: c, key: key, kind: kind, req: r, cred: cred, fixed: fixed, live: map[*member]struct{}{}}
	f.cond = sync.NewCond(&f.mu)
	return f
}

// add makes a member of f. The Coalescer's mu is held (f has not started: its body is empty).
func (f *flight) add() *member {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := &member{}
	f.count++
	f.live[m] = struct{}{}
	return m
}

// joinLate makes a member of f, a fixed read that began already, when f still holds its whole
// answer (nothing dropped, nothing broken) and has members, and fewer than maxMembers; nil
// otherwise (f nil included). The Coalescer's mu is held.
func (f *flight) joinLate(maxMembers int) *member {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.holdsAllLocked() || (len(f.live) == 0 && !(f.kept && !f.expired)) || f.count >= maxMembers {
		return nil
	}
	m := &member{}
	f.count++
	f.live[m] = struct{}{}
	return m
}

// holdsAllServing says whether f still holds its whole answer (nothing dropped, no broken
// body) and has members: a member left to leave will tell the Coalescer to forget it.
func (f *flight) holdsAllServing() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.holdsAllLocked() && (len(f.live) > 0 || (f.kept && !f.expired))
}

func (f *flight) holdsAllLocked() bool { return f.dropped == 0 && !(f.done && f.bodyErr != nil) }

// leave ends m's membership; the last member to leave ends the upstream read, and a fixed
// read stops being its key's last.
func (f *flight) leave(m *member) {
	f.mu.Lock()
	if _, ok := f.live[m]; !ok {
		f.mu.Unlock()
		return
	}
	delete(f.live, m)
	last := len(f.live) == 0
	keep := last && f.fixed && f.done && f.bodyErr == nil && f.dropped == 0 && !f.expired &&
		f.c.roomy()
	if last && f.cancel != nil && !f.done {
		f.cancel()
	}
	f.kept = f.kept || keep
	f.trim()
	f.cond.Broadcast()
	f.mu.Unlock()
	switch {
	case keep:
		f.c.cfg.Clock.AfterFunc(keepFixed, f.expire) // ends after keepFixed
	case last && f.fixed:
		f.c.forget(f) // after f.mu: the Coalescer's mu comes first (join)
	}
}

// expire ends the keeping of a fixed read whose members all left keepFixed ago, unless
// members came meanwhile (the last of them keeps it again).
func (f *flight) expire() {
	f.mu.Lock()
	if len(f.live) > 0 {
		f.mu.Unlock()
		return
	}
	f.expired = true
	f.trim()
	f.mu.Unlock()
	f.c.forget(f)
}

// run sends the upstream read and reads its body into the chunks, never further ahead of the
// fastest member than LagBytes, ending the members that fall further behind than that.
func (f *flight) run() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.mu.Lock()
	f.started, f.cancel = true, cancel
	nobody := len(f.live) == 0
	f.mu.Unlock()
	if nobody {
		f.c.answered(f, false) // every member left before its turn
		return
	}
	f.c.m.Members.WithLabelValues(f.kind).Observe(float64(f.count))
	resp, release, err := f.c.send(ctx, f.upstreamRequest(ctx), f.cred)
	f.mu.Lock()
	f.ready, f.err = true, err
	if err == nil {
		f.status, f.header = resp.StatusCode, resp.Header
	}
	f.cond.Broadcast()
	f.mu.Unlock()
	f.c.answered(f, err == nil) // the pending read of the key goes on the wire now
	if err != nil {
		return
	}
	defer release()
	defer resp.Body.Close()
	f.c.reading.Add(1)
	defer f.c.reading.Add(-1)
	for {
		f.mu.Lock()
		lag := f.c.lagBound()
		for len(f.live) > 0 && f.end-f.fastest() >= lag {
			f.cond.Wait()
			lag = f.c.lagBound()
		}
		if len(f.live) == 0 {
			f.finish(context.Canceled)
			f.mu.Unlock()
			return
		}
		f.mu.Unlock()
		buf := make([]byte, chunkSize)
		n, rerr := resp.Body.Read(buf)
		if n > 0 && n < chunkSize/2 {
			buf = append([]byte(nil), buf[:n]...) // kept as long as a member needs it: no unused capacity
		}
		f.mu.Lock()
		if n > 0 {
			f.chunks = append(f.chunks, buf[:n:n])
			f.end += int64(n)
			f.c.hold(int64(n))
			f.evictLagging(f.c.lagBound() + 2*chunkSize)
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				rerr = nil
			}
			f.finish(rerr)
			f.mu.Unlock()
			if rerr != nil && ctx.Err() == nil {
				f.c.log.Info("an upstream read serving coalesced requests failed; their responses are cut, so their clients retry",
					zap.String("path", f.req.URL.Path), zap.Error(rerr))
			}
			return
		}
		f.cond.Broadcast()
		f.mu.Unlock()
	}
}

// finish records the body's end. f.mu is held.
func (f *flight) finish(err error) {
	f.done, f.bodyErr = true, err
	f.cond.Broadcast()
}

// fastest is the position of the live member furthest ahead. f.mu is held.
func (f *flight) fastest() int64 {
	var p int64
	for m := range f.live {
		p = max(p, m.pos)
	}
	return p
}

// evictLagging ends the live members more than bound behind what has been read, and drops the
// chunks no live member needs any more. f.mu is held.
func (f *flight) evictLagging(bound int64) {
	for m := range f.live {
		if f.end-m.pos > bound {
			m.lagging = true
			delete(f.live, m)
			f.c.m.Lagging.WithLabelValues(f.kind).Inc()
		}
	}
	f.trim()
}

// trim drops the chunks before the slowest live member's position (all of them when none is
// left); a fixed read keeps all of its answer while it has members and it is within the lag
// bound, for the requests that may still join it (joinLate). f.mu is held.
func (f *flight) trim() {
	if f.fixed && !f.expired && (len(f.live) > 0 || f.kept) && f.end <= f.c.lagBound() {
		return
	}
	slowest := f.end
	for m := range f.live {
		slowest = min(slowest, m.pos)
	}
	for len(f.chunks) > 0 && f.base+int64(len(f.chunks[0])) <= slowest {
		n := int64(len(f.chunks[0]))
		f.base += n
		f.c.hold(-n)
		f.chunks[0] = nil
		f.chunks = f.chunks[1:]
		f.dropped++
	}
}

// upstreamRequest is the first member's request as the upstream read sends it: its path,
// query and headers (the ones every member shares, Classify's key, and the first member's
// ignored ones), without the connection's own headers, with ctx.
func (f *flight) upstreamRequest(ctx context.Context) *http.Request {
	in := f.req
	u := *in.URL
	out := (&http.Request{Method: http.MethodGet, URL: &u, Header: make(http.Header, len(in.Header)),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}).WithContext(ctx)
	for k, v := range in.Header {
		out.Header[k] = append([]string(nil), v...)
	}
	for _, f := range in.Header.Values("Connection") {
		for _, k := range strings.Split(f, ",") {
			out.Header.Del(strings.TrimSpace(k))
		}
	}
	for _, k := range []string{"Connection", "Proxy-Connection", "Keep-Alive", "Te", "Transfer-Encoding", "Upgrade"} {
		out.Header.Del(k)
	}
	upstream.SetForwarded(out, in)
	return out
}

// serve writes f's answer to m's client w as it arrives: the status and headers as the
// apiserver sent them, then the body from m's position. A member ended for lagging, or whose
// upstream body broke, has its response cut (the handler aborts), so its client sees an error
// and retries rather than a short answer.
func (f *flight) serve(w http.ResponseWriter, r *http.Request, m *member) {
	stop := context.AfterFunc(r.Context(), func() {
		f.mu.Lock()
		f.cond.Broadcast()
		f.mu.Unlock()
	})
	defer stop()
	defer f.leave(m)
	ctx := r.Context()
	f.mu.Lock()
	for !f.ready && ctx.Err() == nil {
		f.cond.Wait()
	}
	if !f.ready {
		f.mu.Unlock()
		return // the client left; nobody to answer
	}
	status, header, err := f.status, f.header, f.err
	f.mu.Unlock()
	if err != nil {
		apistatus.Write(w, apistatus.ForUpstreamError(upstream.Name(err), err))
		return
	}
	upstream.CopyEndToEnd(w.Header(), header)
	w.WriteHeader(status)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	f.mu.Lock()
	for {
		if m.lagging {
			f.mu.Unlock()
			panic(http.ErrAbortHandler)
		}
		if m.pos < f.end {
			// A live member's chunk is never dropped (evictLagging keeps every chunk from the
			// slowest live member's position on), so it is read here and after the write.
			chunk := f.chunks[m.ci-f.dropped]
			f.mu.Unlock()
			n, werr := w.Write(chunk[m.off:])
			if werr == nil {
				werr = rc.Flush()
			}
			f.mu.Lock()
			m.pos += int64(n)
			if m.off += n; m.off == len(chunk) {
				m.ci, m.off = m.ci+1, 0
				f.trim() // this member may have been the slowest
			}
			f.cond.Broadcast() // the reader may be waiting for the fastest member
			if werr != nil {
				f.mu.Unlock()
				return // the client left
			}
			continue
		}
		if f.done {
			err := f.bodyErr
			f.mu.Unlock()
			if err != nil {
				panic(http.ErrAbortHandler)
			}
			return
		}
		if ctx.Err() != nil {
			f.mu.Unlock()
			return
		}
		f.cond.Wait()
	}
}
