// Command ingest tails etcd and appends every revision to the JetStream
// stream. Several replicas run; one leads.
package main

import (
	"herald.dev/libs/service"
	"herald.dev/services/ingest/internal/ingest"
)

func main() {
	var cfg ingest.Config
	service.Main("ingest", &cfg, func(p *service.Process) (*service.Service, error) { return ingest.NewService(cfg, p) })
}
