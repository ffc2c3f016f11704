package stream

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// consumerInactivity is how long the server keeps a reader's consumer
// that nobody pulls from (its process died before Stop deleted it).
const consumerInactivity = time.Minute

// Messages is a reader's ordered view of the stream: the messages of its
// subjects from a sequence on. Stop ends it and deletes its consumer.
type Messages struct {
	jetstream.MessagesContext
	st   jetstream.Stream
	cons jetstream.Consumer
}

// Consume reads the messages of subjects from sequence from on, in stream
// order, through an ordered consumer (it recreates itself past a lost
// message or a reconnect, without a gap or a duplicate).
//
// A consumer is server state: an ordered consumer that is only stopped
// stays on the server until its inactivity threshold (five minutes by
// default), so one consumer per reader — a deep replay per resuming watch —
// piles up past the server's and the account's limits under a wave of
// resumes. Stop deletes it, and one left behind by a dead process goes
// after consumerInactivity.
func Consume(ctx context.Context, st jetstream.Stream, subjects []string, from uint64, opts ...jetstream.PullMessagesOpt) (*Messages, error) {
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects:    subjects,
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       from,
		InactiveThreshold: consumerInactivity,
	})
	if err != nil {
		return nil, fmt.Errorf("stream consumer: %w", err)
	}
	it, err := cons.Messages(opts...)
	if err != nil {
		return nil, fmt.Errorf("stream consumer: %w", err)
	}
	return &Messages{MessagesContext: it, st: st, cons: cons}, nil
}

// Stop stops reading and deletes the consumer on the server (best effort,
// bounded: a server that does not answer drops it after its inactivity
// threshold).
func (m *Messages) Stop() {
	m.MessagesContext.Stop()
	info := m.cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = m.st.DeleteConsumer(ctx, info.Name)
}

// Pending is the number of messages of the reader's subjects the stream
// holds that it has not delivered yet.
func (m *Messages) Pending(ctx context.Context) (uint64, error) {
	info, err := m.cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("stream consumer info: %w", err)
	}
	return info.NumPending, nil
}
