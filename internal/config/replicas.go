package config

import (
	"github.com/spf13/pflag"
)

// Replicas is the configuration of a frontend replica that sheds the client connections
// above its share, so that the replicas behind a load balancer even out after one is added or
// comes back (package shed, docs/design.md section 10.12). Off unless both FrontendReplicas
// and FrontendExpectedConnections are set: without them a replica cannot tell an excess from
// its fair load, and a sidecar or node-local watchsan, the only one its clients have, must
// never shed. The slack, the floor and the least age of a shed connection are package shed's
// defaults, not flags.
type Replicas struct {
	// FrontendReplicas is how many replicas share the clients; 0: shedding is off.
	FrontendReplicas int
	// FrontendExpectedConnections is how many client connections the replicas hold together;
	// a replica's share is it over FrontendReplicas. 0: shedding is off.
	FrontendExpectedConnections int
	// ConnectionShedRate is how many connections a second a replica sheds at most.
	ConnectionShedRate float64
}

const (
	// DefaultConnectionShedRate: one connection a second, so that the clients of a shed
	// replica's excess reconnect over minutes, not at once.
	DefaultConnectionShedRate = 1.0
	// maxConnectionShedRate bounds --connection-shed-rate: shedding is meant to be slow.
	maxConnectionShedRate = 100
)

func defaultReplicas() Replicas {
	return Replicas{ConnectionShedRate: DefaultConnectionShedRate}
}

// flags registers the shedding flags in the group being registered (the listeners').
func (r *Replicas) flags(fs *pflag.FlagSet) {
	fs.IntVar(&r.FrontendReplicas, "frontend-replicas", r.FrontendReplicas, "how many watchsan replicas behind a load balancer share the clients; with --frontend-expected-connections, a replica holding more than its share of the client connections (expected / replicas, a tenth more and at least 10) sheds the excess at --connection-shed-rate: on HTTP/2 a GOAWAY, each watch on the connection ended cleanly, and the client re-watches from its resourceVersion through the load balancer, with no relist (watchsan_connections_shed_total{reason=\"rebalance\"}). 0: never shed (a sidecar or node-local watchsan must not)")
	fs.IntVar(&r.FrontendExpectedConnections, "frontend-expected-connections", r.FrontendExpectedConnections, "how many client connections all --frontend-replicas hold together (such as the nodes times the watching agents on each); set it at or above the real number: too high only makes the replicas even out more coarsely, too low makes every replica shed all the time. 0: never shed")
	fs.Float64Var(&r.ConnectionShedRate, "connection-shed-rate", r.ConnectionShedRate, "most client connections a second a replica sheds while it holds more than its share; more than 0, at most 100")
}

func (r *Replicas) validate(add func(format string, a ...any)) {
	if r.FrontendReplicas < 0 || r.FrontendReplicas > 10000 {
		add("--frontend-replicas %d: want 0 (no shedding) to 10000", r.FrontendReplicas)
	}
	if r.FrontendExpectedConnections < 0 {
		add("--frontend-expected-connections %d: must not be negative", r.FrontendExpectedConnections)
	}
	switch {
	case r.FrontendReplicas > 0 && r.FrontendExpectedConnections == 0:
		add("--frontend-replicas %d needs --frontend-expected-connections: a replica's share is the expected connections over the replicas", r.FrontendReplicas)
	case r.FrontendReplicas == 0 && r.FrontendExpectedConnections > 0:
		add("--frontend-expected-connections %d needs --frontend-replicas: a replica's share is the expected connections over the replicas", r.FrontendExpectedConnections)
	}
	if !(r.ConnectionShedRate > 0 && r.ConnectionShedRate <= maxConnectionShedRate) { // NaN too
		add("--connection-shed-rate %v: want more than 0 and at most %d a second", r.ConnectionShedRate, maxConnectionShedRate)
	}
}

// Shedding says whether this replica sheds connections above its share.
func (r Replicas) Shedding() bool { return r.FrontendReplicas > 0 && r.FrontendExpectedConnections > 0 }
