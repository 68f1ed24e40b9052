package faults_test

import (
	"net/http"
	"net/http/httputil"
	"net/url"

	"go.uber.org/zap"

	"github.com/watchsan/watchsan/internal/faults"
)

// A Layer goes in front of a reverse proxy to the apiserver; clients (or watchsan's upstream)
// talk to it instead. Faults change at any time.
func Example() {
	apiserver, _ := url.Parse("https://127.0.0.1:6443")
	proxy := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(apiserver) },
		Transport: http.DefaultTransport, // in tests: rest.TransportFor with the cluster's CA
	}
	layer := faults.New(proxy, zap.NewNop())
	if err := layer.Set(faults.Faults{DeleteOldRV: true, EndWatchAfterDelete: true}); err != nil {
		panic(err)
	}
	// For ResetTCP over HTTP/2 the server must let the layer reach its connections.
	srv := &http.Server{Addr: "127.0.0.1:0", Handler: layer, ConnContext: faults.ConnContext}
	_ = srv // srv.ListenAndServe(), or srv.ServeTLS for HTTP/2 (and GoAway)
}
