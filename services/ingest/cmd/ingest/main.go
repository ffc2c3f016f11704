// Command ingest tails etcd and appends every revision to the JetStream
// stream. Several replicas run; one leads.
package main

import (
	"os"
	"runtime"
	"strconv"

	"herald.dev/libs/service"
	"herald.dev/services/ingest/internal/ingest"
)

func main() {
	// The leader is one sequential pipeline (etcd's watch, a record, an
	// append, its ack): more than one P only adds the scheduler waking an
	// idle thread at every hand-off between goroutines, about a fifth of
	// ingest's CPU at 200 events/s (docs/operations.md). A GOMAXPROCS the
	// runtime accepts (a positive number) in the environment still decides.
	if n, err := strconv.Atoi(os.Getenv("GOMAXPROCS")); err != nil || n <= 0 {
		runtime.GOMAXPROCS(1)
	}
	var cfg ingest.Config
	service.Main("ingest", &cfg, func(p *service.Process) (*service.Service, error) { return ingest.NewService(cfg, p) })
}
