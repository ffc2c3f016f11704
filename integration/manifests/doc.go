// Package manifests holds the test that keeps deploy/k8s honest: every
// overlay renders with kustomize, every object decodes strictly into the
// k8s.io/api types (an unknown or misspelt field fails), and what the
// manifests say about Herald's binaries agrees with the binaries themselves:
// images are the ones `make images` builds, every flag exists, declared
// ports are the ports the flags bind, probes hit /livez and /readyz on the
// admin port, and every address a flag names is a Service port of the
// render. In prod, every internal hop is mutual TLS and NATS gives each
// service its own user: checked on the flags, the mounted Secrets, and a
// NATS server started in-process with the rendered configuration. The
// package has no code of its own; it must never need a cluster or Docker.
package manifests
