// Package stream owns the rules of Herald's JetStream event stream: the one
// place that knows how an etcd revision becomes stream messages and how
// stream messages become changes again. ingest writes with it, every cache
// shard (and its deep replay) reads with it; neither spells any of these
// rules itself. It does not decode the objects in the changes: a reader
// does (the cache's watchevent package turns a change into a watch event).
//
// It owns:
//   - subjects: where a revision's record goes ("herald.ev.<resource>.<partition>",
//     "herald.ev._multi", "herald.ev._other", "herald.progress"), the
//     stream's subject list and the consumers' filters (subject.go);
//   - framing: a revision split into parts that each fit in one message, a
//     change too large for one message cut into fragments across parts,
//     the JetStream message id of every record, progress and resync markers,
//     and the position that follows a record (record.go);
//   - reassembly of split revisions and fragmented changes (assemble.go);
//   - reading: a record at a stream sequence, the last record, the first
//     sequence after a revision, where the stream's complete history starts,
//     and etcd's current revision through the one rev-probe key (read.go).
//
// Invariants of the stream, which these rules exist to keep:
//   - Every etcd revision is in the stream once, in etcd's order: records'
//     revisions never decrease along the stream, and a message id names one
//     record, so JetStream's de-duplication refuses a second copy.
//   - A split revision is appended as parts 0..parts-1 on consecutive
//     sequences of one subject; a reader delivers it complete or not at all
//     (an Assembler never hands out a revision with a part missing,
//     duplicated or borrowed from another revision).
//   - Every record of one revision goes to one subject, so a filtered
//     consumer sees a revision whole or not at all.
//   - Nothing is dropped for its size. etcd accepts a value up to its
//     request limit (1.5 MiB by default) and a delete carries the previous
//     value; NATS servers default to a 1 MiB max_payload. Rather than make
//     every deployment raise max_payload above etcd's limit (and keep the
//     two in step), a change larger than one message is cut into
//     fragments: the change with the first bytes of its value (or previous
//     value), then continuations — changes of the same key with no kind,
//     in the following parts of the same revision — with the rest. etcd
//     changes a key at most once per revision, so a continuation always
//     belongs to the change just before it. A reader that does not join
//     fragments sees an incomplete value and skips it as invalid; it never
//     serves a wrong one.
//   - A progress marker at revision R says every change up to R is already
//     in the stream; a resync marker at R says the history before R has a
//     gap (etcd compacted it before ingest appended it, or the stream was
//     emptied and what it last held is unknown). Only a stream that never
//     held a message starts with a progress marker.
//   - The stream drops messages only from its front (age, size limits,
//     purge): a reader that still finds the sequence after the last one it
//     applied knows nothing it needed is gone.
//
// It never opens a connection, appends, or keeps state beyond one reader's
// Assembler: callers pass the stream or the etcd client, own their
// connections and decide what an error means to them. Bad bytes never panic:
// they are errors.
package stream
