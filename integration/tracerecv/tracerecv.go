// Package tracerecv is an OTLP/gRPC trace collector in the test's or the
// benchmark's own process: Herald's processes export their spans to it (the
// OTEL_* environment: Env), and it hands each span to a callback with the
// service.name of the process that sent it.
package tracerecv

import (
	"context"
	"net"
	"strconv"
	"sync"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// Receiver is a running collector.
type Receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	addr string
	srv  *grpc.Server

	mu sync.Mutex // serializes fn
	fn func(service string, sp *tracepb.Span)
}

// Start listens on 127.0.0.1 and calls fn for every span received, one
// call at a time.
func Start(fn func(service string, sp *tracepb.Span)) (*Receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Receiver{addr: ln.Addr().String(), fn: fn}
	// A batch of the SDK's default 512 spans is well under gRPC's 4 MB.
	r.srv = grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(r.srv, r)
	go r.srv.Serve(ln)
	return r, nil
}

// Addr is the collector's host:port.
func (r *Receiver) Addr() string { return r.addr }

// Env is what a process's environment needs to export every span to r:
// the endpoint, every trace sampled, and spans exported at most
// scheduleDelayMS milliseconds after they end (the SDK's default is 5 s).
func (r *Receiver) Env(scheduleDelayMS int) []string {
	return []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + r.addr,
		"OTEL_EXPORTER_OTLP_INSECURE=true",
		"OTEL_TRACES_SAMPLER=always_on",
		"OTEL_BSP_SCHEDULE_DELAY=" + strconv.Itoa(scheduleDelayMS),
	}
}

// Stop stops the collector; spans in flight are dropped.
func (r *Receiver) Stop() { r.srv.Stop() }

// Export implements the OTLP trace service.
func (r *Receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		svc := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				svc = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				r.fn(svc, sp)
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}
