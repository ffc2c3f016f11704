package ingest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/stream"
)

// The publisher appends one leadership term's records to the stream,
// pipelined: it sends up to publish.max-in-flight records (and at most
// maxInFlightBytes of them) before the oldest is acknowledged.
//
// Invariants:
//   - Records are sent in the order they are appended, and their acks are
//     consumed in that order. Only an ack moves lastSeq and lastRev, and
//     what the replica knows the stream holds (knownLast, appends, the
//     metrics): a record in flight is not appended yet.
//   - Every record names the stream sequence it must follow: the one its
//     predecessor gets (lastSeq plus the records in flight before it). A
//     record sent while its predecessor is in flight also names that
//     predecessor's message id (expected-last-msg-id). The sequence alone
//     is not enough there: if another writer's message takes the place of a
//     refused record, the record after the refused one expects exactly that
//     sequence and would land after the stranger's message, a gap before
//     it. With the id JetStream stores a record only right after the record
//     meant to precede it, so the first refusal refuses all that follow.
//     With nothing in flight the predecessor is acknowledged and its
//     sequence pins it; publish.max-in-flight=1 appends as a synchronous
//     publish did, one record and one ack at a time, fenced on the sequence
//     only.
//   - The first failure (refused: fenced; the stream gone; a NATS error or
//     no ack within publishTimeout) ends the term, counted and reported as
//     that record's. Before lead returns, every record still in flight is
//     waited for (JetStream's client fails each at the latest publishTimeout
//     after it was sent), so that none is left in flight when the next term
//     reads the stream's end, and those that landed are counted.
//
// A record of an ended term may still land (its ack was lost or late, the
// lease ran out meanwhile): that is harmless. JetStream stores it only right
// after the record it was sent to follow, so it is the correct next record
// of etcd's history. The next term resumes from the stream's last message,
// and its first append expects that message's sequence: if the late record
// lands after that read, the new term's append is refused (fenced), and the
// term after it resumes after the late record.
type publisher struct {
	i   *Ingest
	max int // records in flight at most
	// lastSeq and lastRev: the stream sequence and revision of the last
	// record acknowledged (or, before any, of the stream's end as the term
	// read it).
	lastSeq uint64
	lastRev int64
	// sentRev is the revision of the last record sent: a progress marker
	// must not precede it.
	sentRev int64
	// inFlight: sent and not yet acknowledged, oldest first; bytes is the
	// size of their payloads.
	inFlight []*inFlight
	bytes    int
}

// inFlight is one record sent and waiting for its ack.
type inFlight struct {
	ack    jetstream.PubAckFuture
	rec    *heraldv1.Record
	msgID  string
	expect uint64 // the stream sequence it must follow
	after  string // the message id it must follow ("": the sequence pins it)
	size   int
	start  time.Time
	// done, if not nil, is called with the record's outcome once its ack
	// is consumed (the revision's span ends).
	done func(error)
}

// publishTimeout bounds the wait for one record's ack, as JetStream's
// default request timeout bounds a synchronous publish.
const publishTimeout = 5 * time.Second

// maxInFlightBytes bounds the payloads in flight (one record always goes):
// NATS's client buffers 8 MiB while it reconnects and fails publishes
// beyond, and a pipeline of the largest records (stream.max-message-bytes)
// would otherwise hold hundreds of MiB.
const maxInFlightBytes = nats.DefaultReconnectBufSize

var (
	errFenced = errors.New("stream was appended to by another writer")
	// errDuplicate: an ack saying the stream already holds the message id.
	errDuplicate = errors.New("duplicate message id")
)

// jsErrCodeStreamWrongLastMsgID is nats-server's JSStreamWrongLastMsgIDErrF,
// which nats.go names no constant for.
const jsErrCodeStreamWrongLastMsgID jetstream.ErrorCode = 10070

// newPublisher is a publisher whose first record follows the stream's
// message lastSeq, of revision lastRev.
func (i *Ingest) newPublisher(lastSeq uint64, lastRev int64) *publisher {
	return &publisher{i: i, max: max(i.cfg.PublishMaxInFlight, 1), lastSeq: lastSeq, lastRev: lastRev, sentRev: lastRev}
}

// publishMarker appends a progress or resync marker and waits until it (and
// everything sent before it) is acknowledged.
func (p *publisher) publishMarker(ctx context.Context, rec *heraldv1.Record) error {
	return p.publish(ctx, stream.SubjectProgress, rec, nil)
}

// publish appends rec on subject with the message headers hdr (trace
// context) and waits until it is acknowledged.
func (p *publisher) publish(ctx context.Context, subject string, rec *heraldv1.Record, hdr nats.Header) error {
	if err := p.send(ctx, subject, rec, hdr, nil); err != nil {
		return err
	}
	return p.flush(ctx)
}

// send appends rec on subject behind the records in flight, first
// consuming the oldest acks while the pipeline is full. done, if not nil,
// is called with the record's outcome once its ack is consumed; it is not
// called if send fails before rec is sent.
func (p *publisher) send(ctx context.Context, subject string, rec *heraldv1.Record, hdr nats.Header, done func(error)) error {
	data, err := stream.Encode(rec)
	if err != nil {
		return err
	}
	for len(p.inFlight) >= p.max || (len(p.inFlight) > 0 && p.bytes+len(data) > maxInFlightBytes) {
		if err := p.settleOldest(ctx); err != nil {
			return err
		}
	}
	if ch := p.i.pause.Load(); ch != nil {
		// Frozen in the middle of an append (fault injection): like a
		// process stopped by a long GC pause, it carries on with the append
		// when it wakes, whatever happened to its leadership meanwhile, and
		// waits for its ack. Only the fence can stop it.
		<-*ch
		if err := p.sendNow(ctx, subject, rec, data, hdr, done); err != nil {
			return err
		}
		return p.flush(context.WithoutCancel(ctx))
	}
	return p.sendNow(ctx, subject, rec, data, hdr, done)
}

// sendNow sends rec (encoded: data) and adds it to the records in flight.
func (p *publisher) sendNow(ctx context.Context, subject string, rec *heraldv1.Record, data []byte, hdr nats.Header, done func(error)) error {
	f := &inFlight{rec: rec, msgID: p.i.msgID(rec), expect: p.lastSeq + uint64(len(p.inFlight)), size: len(data), done: done}
	opts := []jetstream.PublishOpt{
		jetstream.WithMsgID(f.msgID),
		jetstream.WithExpectStream(p.i.cfg.Stream),
		jetstream.WithExpectLastSequence(f.expect),
	}
	if n := len(p.inFlight); n > 0 {
		f.after = p.inFlight[n-1].msgID
		opts = append(opts, jetstream.WithExpectLastMsgID(f.after))
	}
	f.start = p.i.clock.Now()
	// The client sets the expectations in the message's headers and keeps
	// the message to send again (no responders): each has its own.
	ack, err := p.i.js.PublishMsgAsync(&nats.Msg{Subject: subject, Data: data, Header: maps.Clone(hdr)}, opts...)
	if err != nil {
		return p.failure(ctx, f, err)
	}
	f.ack = ack
	p.inFlight = append(p.inFlight, f)
	p.bytes += f.size
	p.sentRev = rec.Revision
	p.i.m.inFlight.Set(float64(len(p.inFlight)))
	if p.i.sent != nil {
		p.i.sent(len(p.inFlight))
	}
	return nil
}

// oldest is the oldest record's ack and error channels (nil when nothing is
// in flight: a select waits on them for nothing).
func (p *publisher) oldest() (<-chan *jetstream.PubAck, <-chan error) {
	if len(p.inFlight) == 0 {
		return nil, nil
	}
	return p.inFlight[0].ack.Ok(), p.inFlight[0].ack.Err()
}

// settleOldest waits for the oldest record's ack and settles it.
func (p *publisher) settleOldest(ctx context.Context) error {
	okc, errc := p.oldest()
	select {
	case ack := <-okc:
		return p.settle(ctx, ack, nil)
	case err := <-errc:
		return p.settle(ctx, nil, err)
	}
}

// settle takes the oldest record off the pipeline with its outcome (an ack
// or err), accounts for it if it was appended, and returns why it was not.
func (p *publisher) settle(ctx context.Context, ack *jetstream.PubAck, err error) error {
	if f, err := p.take(ack, err); err != nil {
		return p.failure(ctx, f, err)
	}
	return nil
}

// take takes the oldest record off the pipeline with its outcome and, if
// it was appended, accounts for it; err: why it was not.
func (p *publisher) take(ack *jetstream.PubAck, err error) (*inFlight, error) {
	f := p.inFlight[0]
	p.inFlight[0] = nil
	p.inFlight = p.inFlight[1:]
	p.bytes -= f.size
	p.i.m.inFlight.Set(float64(len(p.inFlight)))
	if err == nil && ack.Duplicate {
		err = errDuplicate
	}
	if f.done != nil {
		f.done(err)
	}
	if err != nil {
		return f, err
	}
	p.i.m.publishTime.Observe(p.i.clock.Since(f.start).Seconds())
	p.lastSeq = ack.Sequence
	p.lastRev = f.rec.Revision
	p.i.knownLast = f.rec.Revision
	p.i.appends++
	p.i.m.lastRev.Set(float64(f.rec.Revision))
	if stream.IsMarker(f.rec) {
		p.i.m.records.WithLabelValues("progress").Inc()
	} else {
		p.i.m.records.WithLabelValues("revision").Inc()
		p.i.m.published.Add(float64(len(f.rec.Changes)))
	}
	return f, nil
}

// flush waits until every record in flight is acknowledged, and returns the
// first failure.
func (p *publisher) flush(ctx context.Context) error {
	for len(p.inFlight) > 0 {
		if err := p.settleOldest(ctx); err != nil {
			return err
		}
	}
	return nil
}

// drain waits for every record still in flight once the term has ended (or
// failed): it counts those that landed, and no failure, since the term's is
// already decided.
func (p *publisher) drain() {
	for len(p.inFlight) > 0 {
		okc, errc := p.oldest()
		select {
		case ack := <-okc:
			p.take(ack, nil)
		case err := <-errc:
			p.take(nil, err)
		}
	}
}

// failure is the term's error for record f, which was not appended because
// of err; it counts the failure by cause.
func (p *publisher) failure(ctx context.Context, f *inFlight, err error) error {
	if errors.Is(err, errDuplicate) {
		p.i.m.failures.WithLabelValues("fenced").Inc()
		return fmt.Errorf("%w: message %s already in the stream", errFenced, f.msgID)
	}
	if lost := p.i.streamLost(ctx, err); lost != nil {
		return lost
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
			p.i.m.failures.WithLabelValues("fenced").Inc()
			return fmt.Errorf("%w: expected last sequence %d: %v", errFenced, f.expect, err)
		case jsErrCodeStreamWrongLastMsgID:
			p.i.m.failures.WithLabelValues("fenced").Inc()
			return fmt.Errorf("%w: expected last sequence %d, message %s: %v", errFenced, f.expect, f.after, err)
		}
	}
	p.i.m.failures.WithLabelValues("nats").Inc()
	return fmt.Errorf("publishing %s: %w", f.msgID, err)
}
