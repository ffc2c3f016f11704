// Package request owns the parsing of a resource request as kube-apiserver
// reads it, done once at the edge (frontdoor) and again, with the same
// code, on the hop that receives it (fanout): the path resolved against the
// registry (Parse, Await: resource, namespace, name, verb), a watch's
// options (ParseWatch, with Query its canonical encoding), a LIST's options
// (ValidateListOptions, ListPlanError), and the label and field selectors
// (ParseSelector) with the rule that turns a change into what a watcher
// with a selector sees (Decide).
//
// Invariants: every error is the Kubernetes Status error kube-apiserver
// returns for the same request (404 for unknown paths, 400 for malformed
// values, 422 for invalid combinations, in its words);
// ParseWatch of Query gives back the same WatchRequest, so two hops never
// disagree about what a watch asked for.
//
// It never talks to the network and keeps no mutable package state.
package request
