package storage

import (
	certificatesv1 "k8s.io/api/certificates/v1"
	resourcev1 "k8s.io/api/resource/v1"
	storagemigrationv1 "k8s.io/api/storagemigration/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// The built-in resource table: every resource kube-apiserver v1.37 serves by
// default and keeps in etcd, read from k8s.io/kubernetes v1.37.2:
//   - which resources and versions: pkg/controlplane/instance.go
//     (DefaultAPIResourceConfigSource: GA group versions only) and each
//     group's pkg/registry/<group>/rest/*.go (feature-gated resources
//     included when their gate is on by default in 1.37);
//   - storage versions: pkg/kubeapiserver/default_storage_factory_builder.go
//     (the group's preferred version, except ResourceEncodingOverrides);
//   - key prefixes: SpecialDefaultResourcePrefixes in the same file, the
//     resource name otherwise; cohabiting resources (events.k8s.io events)
//     share the core resource's storage;
//   - short names and categories: ShortNames()/Categories() in
//     pkg/registry/<group>/<resource>/storage/storage.go;
//   - field labels: AddFieldLabelConversionFunc in pkg/apis/<group>/<version>/
//     conversion.go, or runtime.DefaultMetaV1FieldSelectorConversion
//     (metadata.name, metadata.namespace) when a kind registers none;
//     selectable field values: GetAttrs/ToSelectableFields in the registry's
//     strategy.go (see fields.go).
// The kubecheck module (make storage-check) proves the key prefixes, storage
// versions and field labels against kube-apiserver's own storage factory,
// storage codec and scheme; scope, short names and categories are for the
// end-to-end test against a running kube-apiserver's discovery.
// Not listed, because kube-apiserver keeps nothing for them in etcd or does
// not serve them by default: bindings, componentstatuses, the review
// resources (tokenreviews, subjectaccessreviews, ...), alpha and beta-only
// resources (leasecandidates, workloads, podgroups, ...).

// metaLabels is runtime.DefaultMetaV1FieldSelectorConversion: what every kind
// without its own conversion function accepts, cluster-scoped ones included.
var metaLabels = []string{"metadata.name", "metadata.namespace"}

func labelsOf(ls ...string) map[string]string {
	m := make(map[string]string, len(ls))
	for _, l := range ls {
		m[l] = l
	}
	return m
}

// builtin returns a fresh copy of the table on every call so that no caller
// can change what another one sees.
func builtin() []*Resource {
	type opt func(*Resource)
	short := func(s ...string) opt { return func(r *Resource) { r.ShortNames = s } }
	cat := func(c ...string) opt { return func(r *Resource) { r.Categories = c } }
	key := func(k string) opt { return func(r *Resource) { r.KeyPrefix = k } }
	fl := func(ls ...string) opt { return func(r *Resource) { r.FieldLabels = labelsOf(ls...) } }
	stored := func(group, version, kind string) opt {
		return func(r *Resource) { r.StorageGroup, r.StorageVersion, r.StorageKind = group, version, kind }
	}
	// sameFields: the served version's Go type has the stored one's
	// fields (TestSameFieldsConversions), so kube-apiserver's conversion
	// through its internal version copies every field it has.
	sameFields := func(served func() runtime.Object) opt {
		return func(r *Resource) { r.Convert = convertSameFields(served) }
	}
	mk := func(gv, resource, kind string, namespaced bool, opts ...opt) *Resource {
		group, version := "", gv
		for i := len(gv) - 1; i >= 0; i-- {
			if gv[i] == '/' {
				group, version = gv[:i], gv[i+1:]
				break
			}
		}
		r := &Resource{
			Group: group, Version: version, Resource: resource, Kind: kind,
			StorageGroup: group, StorageVersion: version, StorageKind: kind,
			Namespaced: namespaced, KeyPrefix: resource,
			FieldLabels: labelsOf(metaLabels...),
		}
		for _, o := range opts {
			o(r)
		}
		return r
	}
	const ns, cluster = true, false
	all := cat("all")
	ext := cat("api-extensions")
	eventLabels := fl("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
		"involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
		"involvedObject.fieldPath", "reason", "reportingComponent", "source", "type",
		"metadata.namespace", "metadata.name")

	// pkg/kubeapiserver/default_storage_factory_builder.go's
	// DefaultWatchCacheSizes: no watch cache for events.
	uncached := func(r *Resource) { r.NotWatchCached = true }
	eventsV1 := mk("events.k8s.io/v1", "events", "Event", ns, short("ev"), key("events"), stored("", "v1", "Event"), uncached)
	eventsV1.Convert = convertEventsV1
	// pkg/apis/events/v1/conversion.go: events.k8s.io names mapped onto
	// the core Event's selectable fields.
	eventsV1.FieldLabels = map[string]string{
		"reason":                    "reason",
		"regarding.kind":            "involvedObject.kind",
		"regarding.namespace":       "involvedObject.namespace",
		"regarding.name":            "involvedObject.name",
		"regarding.uid":             "involvedObject.uid",
		"regarding.apiVersion":      "involvedObject.apiVersion",
		"regarding.resourceVersion": "involvedObject.resourceVersion",
		"regarding.fieldPath":       "involvedObject.fieldPath",
		"reportingController":       "reportingComponent",
		"type":                      "type",
		"metadata.namespace":        "metadata.namespace",
		"metadata.name":             "metadata.name",
	}
	crds := mk("apiextensions.k8s.io/v1", "customresourcedefinitions", "CustomResourceDefinition", cluster,
		short("crd", "crds"), ext, key("apiextensions.k8s.io/customresourcedefinitions"),
		stored("apiextensions.k8s.io", "v1beta1", "CustomResourceDefinition"))
	crds.Convert = convertCRD
	pods := mk("v1", "pods", "Pod", ns, short("po"), all,
		fl("metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy",
			"spec.schedulerName", "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
			"status.podIP", "status.podIPs", "status.nominatedNodeName"))
	pods.FieldLabels["spec.host"] = "spec.nodeName"

	return []*Resource{
		// core (legacy group), pkg/registry/core/rest/storage_core*.go
		mk("v1", "configmaps", "ConfigMap", ns, short("cm")),
		mk("v1", "endpoints", "Endpoints", ns, short("ep"), key("services/endpoints")),
		mk("v1", "events", "Event", ns, short("ev"), eventLabels, uncached),
		mk("v1", "limitranges", "LimitRange", ns, short("limits")),
		mk("v1", "namespaces", "Namespace", cluster, short("ns"), fl("status.phase", "metadata.name")),
		mk("v1", "nodes", "Node", cluster, short("no"), key("minions"), fl("metadata.name", "spec.unschedulable")),
		mk("v1", "persistentvolumeclaims", "PersistentVolumeClaim", ns, short("pvc")),
		mk("v1", "persistentvolumes", "PersistentVolume", cluster, short("pv")),
		pods,
		mk("v1", "podtemplates", "PodTemplate", ns),
		mk("v1", "replicationcontrollers", "ReplicationController", ns, short("rc"), all, key("controllers"),
			fl("metadata.name", "metadata.namespace", "status.replicas")),
		mk("v1", "resourcequotas", "ResourceQuota", ns, short("quota")),
		mk("v1", "secrets", "Secret", ns, fl("type", "metadata.namespace", "metadata.name")),
		mk("v1", "serviceaccounts", "ServiceAccount", ns, short("sa")),
		mk("v1", "services", "Service", ns, short("svc"), all, key("services/specs"),
			fl("metadata.namespace", "metadata.name", "spec.clusterIP", "spec.type")),

		mk("admissionregistration.k8s.io/v1", "mutatingadmissionpolicies", "MutatingAdmissionPolicy", cluster, ext),
		mk("admissionregistration.k8s.io/v1", "mutatingadmissionpolicybindings", "MutatingAdmissionPolicyBinding", cluster, ext),
		mk("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", cluster, ext),
		mk("admissionregistration.k8s.io/v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy", cluster, ext),
		mk("admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding", cluster, ext),
		mk("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration", cluster, ext),

		// Served by kube-apiserver's apiextensions and aggregator servers;
		// their storage keys carry the group.
		// CRDs are still stored as v1beta1 (kube-apiserver's
		// pkg/controlplane/apiserver/apiextensions.go) and converted to v1
		// on read, as kube-apiserver converts them (convert.go).
		crds,
		mk("apiregistration.k8s.io/v1", "apiservices", "APIService", cluster, ext,
			key("apiregistration.k8s.io/apiservices")),

		mk("apps/v1", "controllerrevisions", "ControllerRevision", ns),
		mk("apps/v1", "daemonsets", "DaemonSet", ns, short("ds"), all),
		mk("apps/v1", "deployments", "Deployment", ns, short("deploy"), all),
		// apps/v1 registers no field label conversion: only metadata.*,
		// although the registry's field set also has status.replicas.
		mk("apps/v1", "replicasets", "ReplicaSet", ns, short("rs"), all),
		mk("apps/v1", "statefulsets", "StatefulSet", ns, short("sts"), all),

		mk("autoscaling/v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", ns, short("hpa"), all),
		mk("autoscaling/v1", "horizontalpodautoscalers", "HorizontalPodAutoscaler", ns, short("hpa"), all,
			stored("autoscaling", "v2", "HorizontalPodAutoscaler")),

		mk("batch/v1", "cronjobs", "CronJob", ns, short("cj"), all),
		mk("batch/v1", "jobs", "Job", ns, all, fl("metadata.name", "metadata.namespace", "status.successful")),

		mk("certificates.k8s.io/v1", "certificatesigningrequests", "CertificateSigningRequest", cluster, short("csr"),
			fl("metadata.name", "spec.signerName")),
		mk("certificates.k8s.io/v1", "clustertrustbundles", "ClusterTrustBundle", cluster,
			fl("metadata.name", "spec.signerName"), stored("certificates.k8s.io", "v1beta1", "ClusterTrustBundle"),
			sameFields(func() runtime.Object { return &certificatesv1.ClusterTrustBundle{} })),
		// v1 lacks v1beta1's spec.pkixPublicKey and spec.proofOfPossession,
		// which kube-apiserver's conversion to v1 drops (autoConvert only);
		// every other field is the same.
		mk("certificates.k8s.io/v1", "podcertificaterequests", "PodCertificateRequest", ns,
			fl("metadata.name", "spec.signerName", "spec.podName", "spec.nodeName"),
			stored("certificates.k8s.io", "v1beta1", "PodCertificateRequest"),
			sameFields(func() runtime.Object { return &certificatesv1.PodCertificateRequest{} })),

		mk("coordination.k8s.io/v1", "leases", "Lease", ns),

		mk("discovery.k8s.io/v1", "endpointslices", "EndpointSlice", ns),

		eventsV1,

		mk("flowcontrol.apiserver.k8s.io/v1", "flowschemas", "FlowSchema", cluster),
		mk("flowcontrol.apiserver.k8s.io/v1", "prioritylevelconfigurations", "PriorityLevelConfiguration", cluster),

		mk("networking.k8s.io/v1", "ingressclasses", "IngressClass", cluster),
		mk("networking.k8s.io/v1", "ingresses", "Ingress", ns, short("ing"), key("ingress")),
		mk("networking.k8s.io/v1", "ipaddresses", "IPAddress", cluster, short("ip")),
		mk("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", ns, short("netpol")),
		mk("networking.k8s.io/v1", "servicecidrs", "ServiceCIDR", cluster),

		mk("node.k8s.io/v1", "runtimeclasses", "RuntimeClass", cluster),

		mk("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", ns, short("pdb")),

		mk("rbac.authorization.k8s.io/v1", "clusterrolebindings", "ClusterRoleBinding", cluster),
		mk("rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", cluster),
		mk("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", ns),
		mk("rbac.authorization.k8s.io/v1", "roles", "Role", ns),

		mk("resource.k8s.io/v1", "deviceclasses", "DeviceClass", cluster),
		mk("resource.k8s.io/v1", "devicetaintrules", "DeviceTaintRule", cluster,
			stored("resource.k8s.io", "v1beta2", "DeviceTaintRule"),
			sameFields(func() runtime.Object { return &resourcev1.DeviceTaintRule{} })),
		mk("resource.k8s.io/v1", "resourceclaims", "ResourceClaim", ns),
		mk("resource.k8s.io/v1", "resourceclaimtemplates", "ResourceClaimTemplate", ns),
		mk("resource.k8s.io/v1", "resourceslices", "ResourceSlice", cluster,
			fl("metadata.name", "spec.nodeName", "spec.driver", "spec.pool.name")),

		mk("scheduling.k8s.io/v1", "priorityclasses", "PriorityClass", cluster, short("pc")),

		mk("storage.k8s.io/v1", "csidrivers", "CSIDriver", cluster),
		mk("storage.k8s.io/v1", "csinodes", "CSINode", cluster),
		mk("storage.k8s.io/v1", "csistoragecapacities", "CSIStorageCapacity", ns),
		mk("storage.k8s.io/v1", "storageclasses", "StorageClass", cluster, short("sc")),
		mk("storage.k8s.io/v1", "volumeattachments", "VolumeAttachment", cluster),
		mk("storage.k8s.io/v1", "volumeattributesclasses", "VolumeAttributesClass", cluster, short("vac")),

		mk("storagemigration.k8s.io/v1", "storageversionmigrations", "StorageVersionMigration", cluster,
			stored("storagemigration.k8s.io", "v1beta1", "StorageVersionMigration"),
			sameFields(func() runtime.Object { return &storagemigrationv1.StorageVersionMigration{} })),
	}
}

// Builtins returns the built-in resource table, one entry per served group,
// version and resource, in a fresh slice the caller owns.
func Builtins() []*Resource { return builtin() }
