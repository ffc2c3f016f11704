// Command fanout runs one fanout replica: client watch streams fed by one
// shared upstream stream per resource from the cache.
package main

import (
	"herald.dev/libs/service"
	"herald.dev/services/fanout/internal/fanout"
)

func main() {
	var cfg fanout.Config
	service.Main("fanout", &cfg, func(p *service.Process) (*service.Service, error) { return fanout.NewService(cfg, p) })
}
