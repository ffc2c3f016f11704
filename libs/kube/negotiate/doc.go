// Package negotiate owns kube-apiserver's content negotiation for the
// responses Herald serves (GET, LIST, WATCH of a resource): the media type
// (libs/storage's MediaJSON, MediaYAML, MediaProtobuf and their watch
// framings), the transformation a client asks for (Table,
// PartialObjectMetadata, PartialObjectMetadataList), pretty output, the
// checks kube-apiserver's router makes first, and the media type of an
// error. The encodings themselves are libs/storage's.
//
// Invariants: a request is accepted, transformed or refused (406, in
// kube-apiserver's words) exactly as kube-apiserver would for the same
// resource; custom resources have no protobuf of their own.
//
// It never talks to the network and keeps no mutable package state; a
// Negotiator is safe for concurrent use.
package negotiate
