// Package heraldv1 owns the wire contracts between Herald's services,
// generated from herald.proto (`make proto`; CI fails on drift):
//   - Record: one message on the JetStream event stream, written only by the
//     ingest leader and read by every cache shard (libs/stream frames and
//     reads it).
//   - Cache: the gRPC service a cache shard offers to fanout and frontdoor
//     (LIST and watch-from-revision; libs/cacheclient merges shards).
//
// It imports nothing from the services and holds no logic beyond reading
// an Event's labels and fields (Pairs): every rule about these messages
// lives in the package that owns the concept.
package heraldv1
