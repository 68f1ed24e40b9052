package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/watchsan/watchsan/internal/stream"
)

// The client side of every path is the same: HTTP/1.1 over plain TCP on loopback, one
// connection per watch (watchsan's main listener and the baselines serve plain HTTP/1.1; no
// path gets HTTP/2 from the client), no compression asked.

// newClient returns the bench's HTTP client. readBuf is the connection's read buffer.
func newClient(readBuf int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		DisableCompression:  true,
		MaxIdleConnsPerHost: 200,
		IdleConnTimeout:     30 * time.Second,
		ReadBufferSize:      readBuf,
		WriteBufferSize:     4 << 10,
	}}
}

// watchOpts is one client watch.
type watchOpts struct {
	base string // http://host:port of the path
	ns   string
	sc   *Scenario
	// repaired: the path rewrites regressing deletes, so the client must receive the
	// repaired event; otherwise it must receive the event as the upstream sent it.
	repaired bool
	// lent: the path lends its own credentials (WatchsanShare), so the watch sends no token.
	lent bool
	// skipLatency is how many of the first events are left out of the latency samples.
	skipLatency int
	// latency collects send-to-receive times of stamped events.
	latency bool
	// readBuf is the client's frame buffer size.
	readBuf int
	// hold keeps the watch open after the last event until ctx ends (idle watches).
	hold bool
	// onFirst, if not nil, is called when the first event has arrived.
	onFirst func(time.Duration)
}

// watchResult is what one watch saw.
type watchResult struct {
	events     int
	bytes      int64
	exact      int // events byte-identical to what was expected
	parsed     int // events that differed in bytes and were checked parsed instead
	rewritten  int // events whose RV differs from the upstream's (watchsan's repair)
	first      time.Duration
	elapsed    time.Duration
	latencies  []int64 // nanoseconds
	err        error
	statusCode int
}

// runWatch opens one watch and reads sc.Count events, checking each: count, order, type,
// name, and the resourceVersion the path must deliver (repaired or as sent). It compares the
// bytes with the expected frame first (fast, exact); where they differ (a proxy that
// re-encodes) it parses the rest of the stream with internal/stream and checks the fields.
func runWatch(ctx context.Context, hc *http.Client, o watchOpts) (res watchResult) {
	start := time.Now()
	defer func() { res.elapsed = time.Since(start) }()
	f := o.sc.Set.W.Format
	u := fmt.Sprintf("%s/api/v1/namespaces/%s/configmaps?watch=1&resourceVersion=%d", o.base, o.ns, o.sc.Set.W.BaseRV)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		res.err = err
		return
	}
	req.Header.Set("Accept", acceptHeader(f))
	req.Header.Set("User-Agent", "watchsan-bench")
	// A token, as every real client of an apiserver sends (the bench's upstream takes any):
	// watchsan sends anonymous requests over HTTP/1.1 connections of their own (one per watch,
	// internal/upstream/unauthenticated.go), which is not the path a controller's watch takes.
	if !o.lent {
		req.Header.Set("Authorization", "Bearer watchsan-bench")
	}
	resp, err := hc.Do(req)
	if err != nil {
		res.err = err
		return
	}
	defer resp.Body.Close()
	res.statusCode = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		res.err = fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
		return
	}
	if got, ok := stream.FormatOf(resp.Header.Get("Content-Type")); !ok || got != f {
		res.err = fmt.Errorf("content type %q, want %s", resp.Header.Get("Content-Type"), f.ContentType())
		return
	}
	br := bufio.NewReaderSize(resp.Body, max(o.readBuf, 16<<10))
	if o.latency {
		res.latencies = make([]int64, 0, max(0, o.sc.Count-o.skipLatency))
	}
	events := o.sc.Set.events[:o.sc.Count]
	var parser *stream.Reader
	for i := range events {
		exp := &events[i]
		want, off := exp.frame, exp.stamp
		if o.repaired && exp.regressed() {
			want, off = exp.repaired, exp.repairedStamp
		}
		var stamp int64
		if parser == nil {
			ok, err := peekMatch(br, want, off)
			if err != nil {
				res.err = fmt.Errorf("event %d of %d: %w", i, len(events), err)
				return
			}
			if ok {
				b, _ := br.Peek(len(want))
				stamp = readStamp(b, off)
				res.bytes += int64(len(want))
				if _, err := br.Discard(len(want)); err != nil {
					res.err = err
					return
				}
				res.exact++
				if o.repaired && exp.regressed() {
					res.rewritten++
				}
			} else {
				parser = stream.NewReader(f, br, 0)
			}
		}
		if parser != nil {
			ev, err := parser.Next()
			if err != nil {
				res.err = fmt.Errorf("event %d of %d: %w", i, len(events), err)
				return
			}
			wantRV := exp.wireRV
			if o.repaired {
				wantRV = exp.fixedRV
			}
			if ev.Type != exp.typ || ev.Name != exp.name || ev.RV != wantRV {
				res.err = fmt.Errorf("event %d: got %s %s rv=%s, want %s %s rv=%s", i, ev.Type, ev.Name, ev.RV, exp.typ, exp.name, wantRV)
				return
			}
			if ev.RV != exp.wireRV {
				res.rewritten++
			}
			res.parsed++
			res.bytes += int64(len(ev.Raw))
			stamp = readStamp(ev.Raw, stampOffset(ev.Raw))
		}
		now := time.Now()
		if i == 0 {
			res.first = now.Sub(start)
			if o.onFirst != nil {
				o.onFirst(res.first)
			}
		}
		if o.latency && i >= o.skipLatency && stamp > 0 {
			res.latencies = append(res.latencies, now.UnixNano()-stamp)
		}
		res.events++
	}
	if o.hold {
		<-ctx.Done()
	}
	return
}

// peekMatch waits until br holds len(want) bytes that equal want (the timestamp digits at off
// aside), or returns false as soon as the bytes that arrived differ, without waiting for more.
func peekMatch(br *bufio.Reader, want []byte, off int) (bool, error) {
	for {
		n := min(br.Buffered(), len(want))
		b, _ := br.Peek(n)
		if !maskedEqual(b, want[:n], off) {
			return false, nil
		}
		if n == len(want) {
			return true, nil
		}
		if _, err := br.Peek(n + 1); err != nil && !errors.Is(err, bufio.ErrBufferFull) && br.Buffered() <= n {
			return false, err
		}
	}
}

// maskedEqual compares a and b (of equal length) except for the timestamp digits at off.
func maskedEqual(a, b []byte, off int) bool {
	if off < 0 || off >= len(a) {
		return bytes.Equal(a, b)
	}
	end := min(off+stampDigits, len(a))
	return bytes.Equal(a[:off], b[:off]) && bytes.Equal(a[end:], b[end:])
}
