// Package kube owns the resource registry every hop shares and what belongs
// to a resource: what is served and where it lives in etcd (Registry,
// Resource: libs/storage's built-in table, narrowed or extended by a
// registry file, and the custom resources learned from CRDs: crd.go,
// crdschema.go), its selectable fields (fields.go), the placement of
// resources on cache shards (ShardMap), the decoding of its stored values
// for serving (Decoder: kube-apiserver's JSON of the object,
// resourceVersion, labels and selectable fields, made once), and the
// Kubernetes Status errors every hop answers with (status.go,
// grpcstatus.go, compacted.go).
//
// Its sub-packages build on it: request (request paths, watch and LIST
// options, selectors), printers (server-side Tables) and negotiate (content
// negotiation). None of them is imported here.
//
// Invariants: a value that cannot be decoded yields a *DecodeError and no
// Object, never a partial one; an Object's JSON is exactly what
// kube-apiserver serves for the same stored value.
//
// It never talks to the network and keeps no mutable package state.
package kube
