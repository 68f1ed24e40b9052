package demo

import (
	"context"
	"errors"
	"fmt"
	"net/http/httputil"
	"net/url"

	"go.uber.org/zap"
	"k8s.io/client-go/rest"

	"github.com/watchsan/watchsan/internal/memapi"
	"github.com/watchsan/watchsan/test/cluster"
)

// ErrNoBinaries is returned by Run with Options.Real when the control-plane binaries are not
// cached; the error wrapping it says how to build them.
var ErrNoBinaries = errors.New("the real control plane's binaries are not cached")

// CheckReal reports whether Run can use the real control plane (Options.Real): an error
// wrapping ErrNoBinaries, which says how to build them, when its binaries are not cached.
func CheckReal() error {
	if _, err := cluster.Binaries(); err != nil {
		return fmt.Errorf("%w: %w", ErrNoBinaries, err)
	}
	return nil
}

// startEmbedded serves the in-memory apiserver on a loopback port.
func startEmbedded(log *zap.Logger) (*upstream, error) {
	api := memapi.New(log, memapi.Services, memapi.ConfigMaps)
	u, stopServer, err := serve(api, log)
	if err != nil {
		return nil, err
	}
	return &upstream{
		name:    "in-memory apiserver (memapi)",
		handler: api,
		config:  &rest.Config{Host: u, QPS: -1},
		stop: func() {
			api.Close() // ends its watches, so the server's Close does not cut them mid-event
			stopServer()
		},
	}, nil
}

// startReal starts etcd and a kube-apiserver from the harness; the fault layers reach it
// through a reverse proxy that adds the admin token and verifies the cluster's CA.
func startReal(ctx context.Context, log *zap.Logger) (*upstream, error) {
	if err := CheckReal(); err != nil {
		return nil, err
	}
	c, err := cluster.Start(ctx, cluster.Options{})
	if err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	cfg := c.RESTConfig(0, c.AdminToken)
	target, err := url.Parse(c.APIServers[0].URL)
	if err != nil {
		c.Stop()
		return nil, fmt.Errorf("apiserver URL: %w", err)
	}
	tr, err := rest.TransportFor(cfg)
	if err != nil {
		c.Stop()
		return nil, fmt.Errorf("transport to the apiserver: %w", err)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport: tr, // adds the admin token
		ErrorLog:  zap.NewStdLog(log.Named("proxy")),
	}
	return &upstream{
		name:    "kube-apiserver " + c.APIServers[0].URL + " (real, from the test harness)",
		handler: proxy,
		config:  cfg,
		stop:    c.Stop,
	}, nil
}
