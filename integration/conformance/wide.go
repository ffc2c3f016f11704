package conformance

// Wide is the e2e tests beyond Conformance (`make conformance SUITE=wide`):
// sig-api-machinery's tests that are not conformance-tagged (server-side
// apply, CRD validation rules and ratcheting, field validation, API
// streaming, chunking and tables, discovery, OpenAPI, quotas, request
// timeouts, ...) and sig-auth's about impersonation, SelfSubjectReview,
// SubjectReview, the Node authorizer and service-account tokens, less what
// needs a running pod or a component the cluster lacks, and what
// kube-apiserver's default feature gates turn off.
var Wide = Suite{
	Name:  "wide",
	Focus: `\[sig-api-machinery\]|\[sig-auth\]`,
	Skip: []SkipEntry{
		{Pattern: Conformance.Focus, Reason: "make conformance runs these"},
	},
}
