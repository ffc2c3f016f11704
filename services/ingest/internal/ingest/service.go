package ingest

import (
	"herald.dev/libs/service"
)

// NewService is an ingest replica's lifecycle: it is Running as soon as it
// is started, and Run does the rest (connect with retries, elect a leader,
// tail etcd), because a replica that is not the leader, or whose etcd or
// NATS is down, must keep trying rather than fail. /readyz: Running and
// Ready ("ingest": the stream is set up, NATS connected, etcd reachable).
func NewService(cfg Config, p *service.Process) (*service.Service, error) {
	in, err := New(cfg, p.Log, p.Admin.Registry, WithTracer(p.Telemetry.Tracer("herald.dev/services/ingest")))
	if err != nil {
		return nil, err
	}
	p.Admin.AddReadyCheck("ingest", in.Ready)
	if cfg.FaultInjection {
		for path, h := range in.FaultHandlers() {
			p.Admin.Handle(path, h)
		}
	}
	return service.NewService("ingest", nil, in.Run, nil), nil
}
