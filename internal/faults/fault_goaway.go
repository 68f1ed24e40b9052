package faults

import "net/http"

// goAwayFault sends a GOAWAY with the watch's response headers (GoAway). Go's HTTP/2 server
// sends a graceful GOAWAY on the connection when a handler's response carries
// "Connection: close", and strips the header; the stream goes on.
var goAwayFault = fault{
	name: "goaway",
	header: func(a *active, wt *watchReq, h http.Header) {
		if !a.GoAway {
			return
		}
		wt.l.stats.goAways.Add(1)
		h.Set("Connection", "close")
	},
}
