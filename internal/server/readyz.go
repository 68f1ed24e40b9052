package server

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/watchsan/watchsan/internal/upstream"
)

// maxUpstreamsNamed bounds the upstreams /readyz names (an HA frontend may discover many).
const maxUpstreamsNamed = 50

// serveReadyz answers /readyz: 200 "ok" while some upstream answers (upstream.Pool.Ready),
// else 503 naming every upstream with its state, since when and its last error
// (upstream.Health); ?verbose lists them in either case, one line each, "[+]" for a healthy
// one, as the apiserver's own /readyz?verbose lists its checks.
func (s *Server) serveReadyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	_, verbose := r.URL.Query()["verbose"]
	stopping, ready := s.stopping.Load(), s.pool.Ready()
	var out strings.Builder
	if verbose {
		listUpstreams(&out, s.pool.Backends(), "\n", true)
		if stopping {
			out.WriteString("[-]shutdown: shutting down\n")
		}
	}
	switch {
	case stopping:
		w.WriteHeader(http.StatusServiceUnavailable)
		out.WriteString("shutting down\n")
	case !ready:
		w.WriteHeader(http.StatusServiceUnavailable)
		if verbose {
			out.WriteString("readyz check failed: no upstream answers\n")
		} else {
			out.WriteString("no upstream answers: ")
			listUpstreams(&out, s.pool.Backends(), "; ", false)
			out.WriteString("\n")
		}
	case verbose:
		out.WriteString("readyz check passed\n")
	case !s.pool.AnyHealthy():
		// Ready on degraded upstreams alone (they answer, and serve while nothing better is
		// left): still ready, but say why none is healthy.
		out.WriteString("ok, but no upstream is healthy: ")
		listUpstreams(&out, s.pool.Backends(), "; ", false)
		out.WriteString("\n")
	default:
		out.WriteString("ok\n")
	}
	_, _ = w.Write([]byte(out.String()))
}

// listUpstreams writes each backend's name and Health, at most maxUpstreamsNamed, separated
// by sep; marked: with "[+]" or "[-]" before each and "upstream ", as a verbose check.
func listUpstreams(out *strings.Builder, bs []*upstream.Backend, sep string, marked bool) {
	for i, b := range bs {
		if i == maxUpstreamsNamed {
			fmt.Fprintf(out, "(%d more upstreams not named)%s", len(bs)-i, sep)
			return
		}
		h := b.Health()
		if marked {
			mark := "[-]"
			if h.State == upstream.Healthy {
				mark = "[+]"
			}
			out.WriteString(mark + "upstream ")
		}
		out.WriteString(b.String() + " " + h.Describe())
		if !marked && i < len(bs)-1 {
			out.WriteString(sep)
		} else if marked {
			out.WriteString(sep)
		}
	}
}
