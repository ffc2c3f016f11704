// Command ingest tails etcd and appends every revision to the JetStream
// stream. Several replicas run; one leads.
package main

import (
	"os"
	"runtime"

	"herald.dev/libs/service"
	"herald.dev/services/ingest/internal/ingest"
)

func main() {
	// The leader is one sequential pipeline (etcd's watch, a record, an
	// append, its ack): more than one P only adds the scheduler waking an
	// idle thread at every hand-off between goroutines, about a fifth of
	// ingest's CPU at 200 events/s (docs/operations.md). The environment's
	// GOMAXPROCS still decides.
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		runtime.GOMAXPROCS(1)
	}
	var cfg ingest.Config
	service.Main("ingest", &cfg, func(p *service.Process) (*service.Service, error) { return ingest.NewService(cfg, p) })
}
