package service

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Queue bounds how many expensive operations of one kind (a deep resume:
// a replay read from the stream, or streamed from the caches) run at once.
// Callers beyond the bound wait their turn instead of being refused: a
// watch that resumes late is better than one told to retry and relist. What
// a Queue never does is hold a slot for a caller whose context has ended.
type Queue struct {
	slots   chan struct{}
	running prometheus.Gauge
	waiting prometheus.Gauge
	waited  prometheus.Counter
}

// NewQueue returns a Queue of size slots whose metrics are registered on
// reg as <name>_running, <name>_waiting (gauges) and <name>_queued_total
// (callers that had to wait for a slot); what describes the operation in
// their help text.
func NewQueue(size int, reg prometheus.Registerer, name, what string) *Queue {
	f := promauto.With(reg)
	return &Queue{
		slots:   make(chan struct{}, max(size, 1)),
		running: f.NewGauge(prometheus.GaugeOpts{Name: name + "_running", Help: what + " running now."}),
		waiting: f.NewGauge(prometheus.GaugeOpts{Name: name + "_waiting", Help: what + " waiting for a slot (the concurrency bound is reached)."}),
		waited:  f.NewCounter(prometheus.CounterOpts{Name: name + "_queued_total", Help: what + " that had to wait for a slot."}),
	}
}

// Acquire waits for a slot (or for ctx to end: its error) and returns the
// function that gives it back, to be called exactly once. A nil Queue
// bounds nothing.
func (q *Queue) Acquire(ctx context.Context) (release func(), err error) {
	if q == nil {
		return func() {}, nil
	}
	select {
	case q.slots <- struct{}{}:
	default:
		q.waited.Inc()
		q.waiting.Inc()
		select {
		case q.slots <- struct{}{}:
			q.waiting.Dec()
		case <-ctx.Done():
			q.waiting.Dec()
			return nil, ctx.Err()
		}
	}
	q.running.Inc()
	return func() {
		q.running.Dec()
		<-q.slots
	}, nil
}
