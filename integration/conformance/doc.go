// Package conformance runs Kubernetes' own e2e tests (k8s.io/kubernetes
// v1.37.2's sig-api-machinery [Conformance] tests that need no running pods,
// webhooks or aggregated API servers: the Conformance suite; or the Wide
// suite, sig-api-machinery's other tests and sig-auth's) against a real
// cluster twice: first against kube-apiserver, the baseline, then through
// Herald in cluster mode in front of the same cluster, and compares the two
// runs test by test (`make conformance`, `make conformance SUITE=wide`).
//
// The cluster is real and small: one etcd, kube-apiserver v1.37.2 (protobuf
// storage, Secrets encrypted with aescbc, --authorization-mode=Node,RBAC,
// NodeRestriction),
// kube-controller-manager running only the controllers the e2e framework
// and the selected tests need, and one Node object marked Ready and
// untainted (no kubelet, no scheduler: no pod runs). Herald reads the cluster's etcd and its frontdoor
// forwards what it does not serve from its cache to kube-apiserver as the
// caller; the Herald run's kubeconfig points at frontdoor with the same
// admin identity of the cluster as the baseline's.
//
// Results come from ginkgo's JSON report of each run, never from its
// console output. A test counts as passed only in state "passed"; a test
// skipped at run time is shown as skipped and counts for neither side. The
// run fails if Herald does not pass a test kube-apiserver passes, or if
// kube-apiserver passes none (a broken baseline proves nothing).
package conformance
