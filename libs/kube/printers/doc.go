// Package printers owns Herald's server-side Tables (meta.k8s.io/v1 Table,
// what kubectl get asks for): kube-apiserver's columns and cells for every
// built-in kind (printers.go), a custom resource's CRD printer columns
// through apiextensions-apiserver's own table convertor (table_custom.go),
// and the generic Name and Age columns for any other resource (table.go).
//
// Invariants: a Table lists its items in the order kube-apiserver's
// printer lists them, and each row carries what includeObject asks for
// (the object's PartialObjectMetadata by default). It only reads the
// objects it renders, never talks to the network and keeps no mutable
// package state (the printer table is built once, at init).
package printers
