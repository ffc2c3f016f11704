// Package kube owns Herald's knowledge of the Kubernetes API surface that
// every hop shares: the resource registry (what is served and where it lives
// in etcd), the preparation of stored objects for serving (resourceVersion,
// labels and selectable fields, extracted once), request paths, selectors,
// Status errors and server-side Tables.
//
// It never talks to the network and keeps no mutable package state.
package kube
