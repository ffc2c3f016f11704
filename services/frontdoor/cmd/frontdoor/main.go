// Command frontdoor serves the Kubernetes list/watch API over HTTPS:
// authentication, RBAC, limits, LIST/GET from the cache, WATCH through
// fanout replicas.
package main

import (
	"herald.dev/libs/service"
	"herald.dev/services/frontdoor/internal/frontdoor"
)

func main() {
	var cfg frontdoor.Config
	service.Main("frontdoor", &cfg, func(p *service.Process) (*service.Service, error) { return frontdoor.NewService(cfg, p) })
}
