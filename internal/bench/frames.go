package bench

import (
	"io"
	"net/http"
	"net/url"

	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/stream"
)

// FramesProxy is the frames baseline: the least an exact watch proxy can do. Every event is
// read with watchsan's own stream.Reader (the frame-end scan over every byte and the parse of
// the envelope and the metadata) and written on unchanged, batched as watchsan batches them:
// what was read is written in one flush just before the next read from the upstream that may
// wait (internal/watch, flushBeforeRead). Nothing else: no decision, no metric, no resume.
// Its distance from the pass-through is what reading a stream exactly costs in place; the
// rest of watchsan's distance is the watch layer's. Not in AllPaths: -paths names it, and
// `watchsan-bench profile -path frames` profiles it.
type FramesProxy struct{ watchUpstream }

// NewFramesProxy returns the frames baseline for upstream.
func NewFramesProxy(upstream *url.URL, rt http.RoundTripper) *FramesProxy {
	return &FramesProxy{newWatchUpstream(upstream, rt)}
}

func (p *FramesProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !reqinfo.Parse(r).IsWatch() {
		p.pass.ServeHTTP(w, r)
		return
	}
	resp := p.open(w, r)
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	copyHeader(w.Header(), resp.Header)
	w.WriteHeader(http.StatusOK)
	f, ok := stream.FormatOf(resp.Header.Get("Content-Type"))
	if !ok {
		_, _ = io.Copy(w, resp.Body)
		return
	}
	fl := w.(http.Flusher)
	fl.Flush()
	b := &frameBatch{w: w, fl: fl}
	rd := stream.NewReader(f, flushingBody{src: resp.Body, b: b}, 0)
	for {
		ev, err := rd.Next()
		if err != nil {
			_ = b.flush()
			return
		}
		b.buf = append(b.buf, ev.Raw...)
		// A JSON event's newline is in Raw only when it arrived with the value.
		if f == stream.JSON && ev.Raw[len(ev.Raw)-1] != '\n' {
			b.buf = append(b.buf, '\n')
		}
	}
}

// frameBatch holds the events read since the last flush.
type frameBatch struct {
	w   io.Writer
	fl  http.Flusher
	buf []byte
	err error
}

func (b *frameBatch) flush() error {
	if b.err != nil || len(b.buf) == 0 {
		return b.err
	}
	if _, b.err = b.w.Write(b.buf); b.err == nil {
		b.fl.Flush()
	}
	b.buf = b.buf[:0]
	return b.err
}

// flushingBody flushes the batch before every read from the upstream, and ends the stream once
// a write to the client failed.
type flushingBody struct {
	src io.Reader
	b   *frameBatch
}

func (r flushingBody) Read(p []byte) (int, error) {
	if err := r.b.flush(); err != nil {
		return 0, err
	}
	return r.src.Read(p)
}
