package upstream

import (
	"net/http"
	"strings"
)

// hopHeaders are connection-level headers never relayed (RFC 9110 7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// CopyEndToEnd copies src's headers into dst but the hop-by-hop ones (and those src's
// Connection names): what a response or request relayed by watchsan itself (a watch, a
// coalesced read) carries on. The values are src's, shared, not copied: nothing writes a
// header's values in place, and each is capped at its length, so that an append to dst's
// makes a slice of its own and never writes into src's.
func CopyEndToEnd(dst, src http.Header) {
	for k, vv := range src {
		dst[k] = vv[:len(vv):len(vv)]
	}
	for _, k := range hopHeaders {
		dst.Del(k)
	}
	for _, f := range src.Values("Connection") {
		for _, k := range strings.Split(f, ",") {
			dst.Del(strings.TrimSpace(k))
		}
	}
}
