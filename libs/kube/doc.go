// Package kube owns Herald's knowledge of the Kubernetes API surface that
// every hop shares: the resource registry (what is served and where it lives
// in etcd: libs/storage's built-in table, narrowed or extended by a registry
// file), the decoding of stored values for serving (Decoder: kube-apiserver's
// JSON of the object, resourceVersion, labels and selectable fields, made
// once) and Status errors. Request paths, watch options and selectors are
// libs/kube/request's, server-side Tables libs/kube/printers'.
//
// Invariants: a value that cannot be decoded yields a *DecodeError and no
// Object, never a partial one; an Object's JSON is exactly what
// kube-apiserver serves for the same stored value.
//
// It never talks to the network and keeps no mutable package state.
package kube
