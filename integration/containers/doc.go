// Package containers is Herald's container suite (`make e2e`): three etcd
// members, three NATS JetStream servers (the stream has three replicas), two
// ingest, a 2x2 cache (two shards of two replicas: cache-a owns namespace
// partitions 0-7 of every resource, cache-b partitions 8-15 of every
// namespaced one; see cacheLayout), three fanout and two frontdoor
// replicas, each a container from `make images` on one Docker network, with
// clients on the host talking to frontdoor only. The writer's pods span both
// shards, and fanout and frontdoor reach the shards through --cache.shards.
//
// Every scenario injects one fault (kill, restart, partition, rolling
// restart, scale) while a writer keeps changing pods in etcd and resuming
// clients watch through frontdoor. Invariant, checked against etcd's own
// history with package checker: each client sees every revision once, in
// order, and never 410 Gone unless its revision truly left the window.
//
// The suite never sleeps to synchronise: it polls conditions (readiness,
// client progress) with deadlines, and every container, network and client
// is released with t.Cleanup. It needs a Docker engine; without one it
// skips, or fails when CI=true.
package containers
