package conformance

// Wide is the e2e tests beyond Conformance (`make conformance SUITE=wide`):
// sig-api-machinery's tests that are not conformance-tagged (API streaming,
// server-side apply, CRD validation rules and ratcheting, discovery,
// OpenAPI, tables, quotas, request timeouts, watch negotiation, garbage
// collection of custom resources, ...) and sig-auth's, conformance-tagged
// or not, about impersonation (the Node authorizer's tests impersonate a
// node), SelfSubjectReview, SubjectReview, service accounts and their bound
// tokens, and the certificate APIs; less what needs a running pod or a
// component the cluster lacks, and what kube-apiserver's default feature
// gates leave off. Tests that ginkgo.Skip themselves at run time (flaky
// upstream, an API version not served) show as skipped on both sides.
var Wide = Suite{
	Name:  "wide",
	Focus: `\[sig-api-machinery\]|\[sig-auth\]`,
	Skip: []SkipEntry{
		{Pattern: Conformance.Focus,
			Reason: "sig-api-machinery's conformance tests: make conformance runs them"},
		{Match: "[Feature:OffByDefault]",
			Reason: "a feature gate kube-apiserver's defaults leave off (CoordinatedLeaderElection, AtomicWriteVolumeUserFields): fails on kube-apiserver as configured"},
		{Match: "[Disruptive]",
			Reason: "kills or partitions etcd, or restarts kube-apiserver, on GCE or AWS nodes"},
		{Match: "[Flaky]",
			Reason: "marked flaky upstream (kubectl explain of a CRD named as a built-in)"},
		{Match: "[sig-api-machinery] StorageVersion resources [Feature:StorageVersionAPI]",
			Reason: "internal.apiserver.k8s.io/v1alpha1 is off by default (alpha, StorageVersionAPI)"},
		{Match: "[sig-api-machinery] Namespaces should always delete fast (ALL of 100 namespaces in 150 seconds) [Feature:ComprehensiveNamespaceDraining]",
			Reason: "run upstream only where namespace deletion is tuned for it; its 90 per cent variant runs"},
		{Match: "[sig-api-machinery] AdmissionWebhook [Privileged:ClusterAdmin]",
			Reason: "deploys its webhook server as a Deployment: needs running pods"},
		{Match: "[sig-api-machinery] CBOR [Feature:CBOR]",
			Reason: "runs the sample aggregated API server as a Deployment: needs running pods"},
		{Match: "[sig-api-machinery] OpenAPIV3 should contain OpenAPI V3 for Aggregated APIServer",
			Reason: "runs the sample aggregated API server as a Deployment: needs running pods"},
		{Match: "[sig-api-machinery] Generated clientset should create pods, set the deletionTimestamp",
			Reason: "waits for its pod to be Running: needs a kubelet"},
		{Match: "[sig-api-machinery] Garbage collector should delete jobs and pods created by cronjob",
			Reason: "needs the cronjob and job controllers, and pods that run"},
		{Match: "[sig-auth] Certificates API [Privileged:ClusterAdmin] should support building a client with a CSR",
			Reason: "waits for kube-controller-manager's CSR signer, which this cluster does not run"},
		{Match: "[sig-auth] NodeAuthenticator",
			Reason: "talks to a kubelet's port 10250 from a pod: needs a kubelet"},
		{Pattern: `\[sig-auth\] Projected PodCertificate .*(establish an mTLS|honor UserAnnotations|should issue certificate)`,
			Reason: "the kubelet asks for the pod's certificate and mounts it: needs a kubelet"},
		{Match: "[sig-auth] [FeatureGate:ClusterTrustBundle] [FeatureGate:ClusterTrustBundleProjection] should",
			Reason: "the kubelet mounts the trust bundles (or refuses to start the pod): needs a kubelet; the CRUD test runs"},
		{Match: "[sig-auth] ServiceAccounts ServiceAccountIssuerDiscovery should support OIDC discovery",
			Reason: "its pod checks the issuer from inside the cluster: needs a kubelet"},
		{Match: "[sig-auth] ServiceAccounts should mount an API token into pods",
			Reason: "waits for its pod to be Running: needs a kubelet"},
		{Match: "[sig-auth] ServiceAccounts should mount projected service account token",
			Reason: "reads its container's output: needs a kubelet"},
		{Match: "[sig-auth] ServiceAccounts should set ownership and permission when RunAsUser or FsGroup is present",
			Reason: "reads its containers' output: needs a kubelet"},
		{Match: "[sig-auth] ServiceAccounts should support InClusterConfig with token rotation",
			Reason: "its pod reads the rotated token: needs a kubelet"},
		{Match: "[sig-auth] ValidatingAdmissionPolicy can restrict access by-node",
			Reason: "waits for its pod to be Running: needs a kubelet"},
	},
}
