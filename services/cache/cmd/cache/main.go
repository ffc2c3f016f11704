// Command cache runs one cache shard replica: current objects and a window
// of recent revisions, served over gRPC.
package main

import (
	"herald.dev/libs/service"
	"herald.dev/services/cache/internal/cache"
)

func main() {
	var cfg cache.Config
	service.Main("cache", &cfg, func(p *service.Process) (*service.Service, error) { return cache.NewService(cfg, p) })
}
