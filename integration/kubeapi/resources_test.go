package kubeapi

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The two namespaces the namespaced objects live in: objects 0-3 in nsA,
// object 4 in nsB (so that a namespaced list must leave it out).
const (
	nsA = "herald-e2e-a"
	nsB = "herald-e2e-b"
	// crdGroup is the group of the test's custom resources.
	crdGroup = "e2e.herald.test"
)

// Object indexes: setup creates setupObjects; the watch phase then
// modifies object 0 (a label added), moves object 1 out of the watch
// label selector (tier=gone), deletes object 2, creates object 3 and
// finally annotates object 0 (the marker every watch comparison stops at).
var setupObjects = []int{0, 1, 2, 4}

var tiers = []string{"a", "b", "c", "a", "b"}

// obj is an object's JSON form (apiVersion and kind are added from the case).
type obj = map[string]any

// resourceCase is one resource the test writes and compares.
type resourceCase struct {
	// name is the subtest name: the resource, with its group if any.
	name       string
	gvr        schema.GroupVersionResource
	kind       string
	namespaced bool
	// make returns object i's body (metadata.name, namespace, labels and
	// the type meta are added); nil for a resource whose objects only
	// kube-apiserver itself creates (compared read-only).
	make func(ns string, i int) obj
	// objName names object i; default <resource>-<i>.
	objName func(i int) string
	// status, if set, is written to object i's status subresource after
	// it is created (nil for no status).
	status func(i int) obj
	// fields are field selectors specific to the resource (metadata.name
	// and metadata.namespace are added for every resource).
	fields []string
	// protobuf: kube-apiserver serves the resource in protobuf (built-in
	// kinds; custom resources are JSON only).
	protobuf bool

	// Set by setup.
	watchFrom string // kube-apiserver's list resourceVersion before the watch phase
	marker    string // resourceVersion of the marker write that ends the watch phase
}

func (c *resourceCase) name0(i int) string {
	if c.objName != nil {
		return c.objName(i)
	}
	return fmt.Sprintf("%s-%d", c.gvr.Resource, i)
}

// ns is object i's namespace ("" for cluster-scoped resources).
func (c *resourceCase) ns(i int) string {
	switch {
	case !c.namespaced:
		return ""
	case i == 4:
		return nsB
	default:
		return nsA
	}
}

// path is the collection path in namespace ns ("" for every namespace, or
// for a cluster-scoped resource).
func (c *resourceCase) path(ns string) string {
	p := "/apis/" + c.gvr.Group + "/" + c.gvr.Version
	if c.gvr.Group == "" {
		p = "/api/" + c.gvr.Version
	}
	if ns != "" {
		p += "/namespaces/" + ns
	}
	return p + "/" + c.gvr.Resource
}

func (c *resourceCase) apiVersion() string {
	return schema.GroupVersion{Group: c.gvr.Group, Version: c.gvr.Version}.String()
}

func containers() []obj { return []obj{{"name": "c", "image": "registry.example/app:1"}} }

func podTemplate(app string) obj {
	return obj{"metadata": obj{"labels": obj{"app": app}}, "spec": obj{"containers": containers()}}
}

func selector(app string) obj { return obj{"matchLabels": obj{"app": app}} }

// cases is every resource the test covers, in creation order (namespaces
// first; the CRDs before their custom resources).
func cases() []*resourceCase {
	gv := func(group, version, resource, kind string, namespaced bool) *resourceCase {
		return &resourceCase{gvr: schema.GroupVersionResource{Group: group, Version: version, Resource: resource},
			kind: kind, namespaced: namespaced, protobuf: true}
	}
	with := func(c *resourceCase, make func(ns string, i int) obj, fields ...string) *resourceCase {
		c.make, c.fields = make, fields
		return c
	}
	const ns, cluster = true, false
	nodeOf := func(i int) string { return fmt.Sprintf("node-%d", i%2) }

	namespaces := with(gv("", "v1", "namespaces", "Namespace", cluster), func(string, int) obj { return obj{} },
		"status.phase=Active", "status.phase!=Active")
	namespaces.objName = func(i int) string {
		switch i {
		case 0:
			return nsA
		case 4:
			return nsB
		}
		return fmt.Sprintf("herald-e2e-ns-%d", i)
	}
	crds := with(gv("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", cluster),
		func(_ string, i int) obj { return crd(crdPlurals[i]) })
	crds.objName = func(i int) string { return crdPlurals[i] + "." + crdGroup }
	widgets := with(gv(crdGroup, "v1", "widgets", "Widget", ns), func(_ string, i int) obj {
		return obj{"spec": obj{"color": []string{"red", "blue", "red", "green", "blue"}[i], "size": i}}
	}, "spec.color=red", "spec.color!=red", "spec.color=green")
	widgets.protobuf = false

	pods := with(gv("", "v1", "pods", "Pod", ns), func(_ string, i int) obj {
		return obj{"spec": obj{"nodeName": nodeOf(i), "containers": containers(), "hostNetwork": i == 2, "terminationGracePeriodSeconds": 0}}
	}, "spec.nodeName=node-0", "spec.nodeName!=node-0", "spec.host=node-1", "spec.restartPolicy=Always",
		"spec.schedulerName=default-scheduler", "spec.serviceAccountName=default", "spec.hostNetwork=true",
		"status.phase=Running", "status.phase=Pending", "status.podIP=10.244.0.10", "status.podIP=",
		"status.nominatedNodeName=", "spec.nodeName=node-0,status.phase=Running")
	pods.status = func(i int) obj {
		if i != 0 {
			return nil
		}
		return obj{"phase": "Running", "podIP": "10.244.0.10", "podIPs": []obj{{"ip": "10.244.0.10"}}}
	}
	nodes := with(gv("", "v1", "nodes", "Node", cluster), func(_ string, i int) obj {
		return obj{"spec": obj{"unschedulable": i == 1, "podCIDR": fmt.Sprintf("10.244.%d.0/24", i)}}
	}, "spec.unschedulable=true", "spec.unschedulable=false")
	services := with(gv("", "v1", "services", "Service", ns), func(_ string, i int) obj {
		spec := obj{"selector": obj{"app": "web"}, "ports": []obj{{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}}}
		switch i {
		case 1:
			spec["clusterIP"] = "None"
		case 2:
			spec["type"] = "NodePort"
		}
		return obj{"spec": spec}
	}, "spec.type=ClusterIP", "spec.type=NodePort", "spec.clusterIP=None", "spec.clusterIP!=None")
	endpoints := with(gv("", "v1", "endpoints", "Endpoints", ns), func(_ string, i int) obj {
		return obj{"subsets": []obj{{"addresses": []obj{{"ip": fmt.Sprintf("10.1.0.%d", i+1)}}, "ports": []obj{{"name": "http", "port": 80, "protocol": "TCP"}}}}}
	})
	events := with(gv("", "v1", "events", "Event", ns), func(ns string, i int) obj {
		typ := "Normal"
		if i == 2 {
			typ = "Warning"
		}
		return obj{
			"involvedObject": obj{"kind": "Pod", "namespace": ns, "name": fmt.Sprintf("pods-%d", i%2), "apiVersion": "v1", "fieldPath": "spec.containers{c}"},
			"reason":         []string{"Started", "Pulled", "Failed", "Started", "Pulled"}[i],
			"message":        fmt.Sprintf("event %d", i), "type": typ, "count": 1,
			"source":         obj{"component": "kubelet", "host": nodeOf(i)},
			"firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z",
		}
	}, "involvedObject.kind=Pod", "involvedObject.name=pods-0", "involvedObject.namespace="+nsA,
		"involvedObject.apiVersion=v1", "involvedObject.fieldPath=spec.containers{c}", "involvedObject.uid=",
		"involvedObject.resourceVersion=", "reason=Started", "type=Warning", "type!=Warning", "source=kubelet",
		"reportingComponent=")
	eventsV1 := with(gv("events.k8s.io", "v1", "events", "Event", ns), func(ns string, i int) obj {
		return obj{
			"eventTime":           "2026-01-01T00:00:00.000000Z",
			"reportingController": "e2e.herald.test/controller", "reportingInstance": fmt.Sprintf("instance-%d", i),
			"action": "Testing", "reason": []string{"Tested", "Checked", "Tested", "Checked", "Tested"}[i],
			"regarding": obj{"kind": "Pod", "namespace": ns, "name": fmt.Sprintf("pods-%d", i%2), "apiVersion": "v1"},
			"note":      fmt.Sprintf("note %d", i), "type": "Normal",
		}
	}, "regarding.kind=Pod", "regarding.name=pods-0", "regarding.namespace="+nsA, "regarding.apiVersion=v1",
		"regarding.uid=", "regarding.resourceVersion=", "regarding.fieldPath=", "reason=Tested",
		"reportingController=e2e.herald.test/controller", "type=Normal")
	eventsV1.objName = func(i int) string { return fmt.Sprintf("events-v1-%d", i) }
	secrets := with(gv("", "v1", "secrets", "Secret", ns), func(_ string, i int) obj {
		typ := "Opaque"
		if i == 2 {
			typ = "example.com/custom"
		}
		return obj{"type": typ, "data": obj{"password": base64.StdEncoding.EncodeToString([]byte(fmt.Sprintf("secret-%d", i)))}}
	}, "type=Opaque", "type!=Opaque", "type=example.com/custom")
	replicationControllers := with(gv("", "v1", "replicationcontrollers", "ReplicationController", ns), func(string, int) obj {
		return obj{"spec": obj{"replicas": 0, "selector": obj{"app": "rc"}, "template": podTemplate("rc")}}
	}, "status.replicas=0", "status.replicas!=0")
	jobs := with(gv("batch", "v1", "jobs", "Job", ns), func(string, int) obj {
		t := podTemplate("job")
		t["spec"].(obj)["restartPolicy"] = "Never"
		return obj{"spec": obj{"suspend": true, "backoffLimit": 1, "template": t}}
	}, "status.successful=0", "status.successful!=0")
	csrs := with(gv("certificates.k8s.io", "v1", "certificatesigningrequests", "CertificateSigningRequest", cluster), func(_ string, i int) obj {
		return obj{"spec": obj{"request": csrPEM(i), "signerName": fmt.Sprintf("e2e.herald.test/signer-%d", i%2), "usages": []string{"digital signature"}}}
	}, "spec.signerName=e2e.herald.test/signer-0", "spec.signerName!=e2e.herald.test/signer-0")

	return []*resourceCase{
		namespaces,
		crds,
		with(gv("", "v1", "serviceaccounts", "ServiceAccount", ns), func(string, int) obj { return obj{} }),
		with(gv("", "v1", "configmaps", "ConfigMap", ns), func(_ string, i int) obj { return obj{"data": obj{"key": fmt.Sprintf("value-%d", i)}} }),
		secrets,
		nodes,
		pods,
		services,
		endpoints,
		events,
		with(gv("", "v1", "persistentvolumes", "PersistentVolume", cluster), func(_ string, i int) obj {
			return obj{"spec": obj{"capacity": obj{"storage": "1Gi"}, "accessModes": []string{"ReadWriteOnce"},
				"persistentVolumeReclaimPolicy": "Retain", "hostPath": obj{"path": fmt.Sprintf("/tmp/pv-%d", i)}}}
		}),
		with(gv("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", ns), func(string, int) obj {
			return obj{"spec": obj{"accessModes": []string{"ReadWriteOnce"}, "storageClassName": "",
				"resources": obj{"requests": obj{"storage": "1Gi"}}}}
		}),
		with(gv("", "v1", "limitranges", "LimitRange", ns), func(string, int) obj {
			return obj{"spec": obj{"limits": []obj{{"type": "Container", "default": obj{"cpu": "100m"}}}}}
		}),
		with(gv("", "v1", "resourcequotas", "ResourceQuota", ns), func(_ string, i int) obj {
			return obj{"spec": obj{"hard": obj{"pods": fmt.Sprint(100 + i)}}}
		}),
		with(gv("", "v1", "podtemplates", "PodTemplate", ns), func(string, int) obj { return obj{"template": podTemplate("tmpl")} }),
		replicationControllers,
		with(gv("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", ns), func(_ string, i int) obj {
			return obj{"addressType": "IPv4", "endpoints": []obj{{"addresses": []string{fmt.Sprintf("10.1.0.%d", i+1)}, "conditions": obj{"ready": true}}},
				"ports": []obj{{"name": "http", "port": 80, "protocol": "TCP"}}}
		}),
		with(gv("apps", "v1", "deployments", "Deployment", ns), func(string, int) obj {
			return obj{"spec": obj{"replicas": 1, "selector": selector("deploy"), "template": podTemplate("deploy")}}
		}),
		with(gv("apps", "v1", "replicasets", "ReplicaSet", ns), func(string, int) obj {
			return obj{"spec": obj{"replicas": 1, "selector": selector("rs"), "template": podTemplate("rs")}}
		}),
		with(gv("apps", "v1", "statefulsets", "StatefulSet", ns), func(string, int) obj {
			return obj{"spec": obj{"replicas": 1, "serviceName": "services-0", "selector": selector("sts"), "template": podTemplate("sts")}}
		}),
		with(gv("apps", "v1", "daemonsets", "DaemonSet", ns), func(string, int) obj {
			return obj{"spec": obj{"selector": selector("ds"), "template": podTemplate("ds")}}
		}),
		with(gv("apps", "v1", "controllerrevisions", "ControllerRevision", ns), func(_ string, i int) obj {
			return obj{"revision": i + 1, "data": obj{"spec": obj{"replicas": i}}}
		}),
		jobs,
		with(gv("batch", "v1", "cronjobs", "CronJob", ns), func(string, int) obj {
			t := podTemplate("cron")
			t["spec"].(obj)["restartPolicy"] = "Never"
			return obj{"spec": obj{"schedule": "0 0 * * *", "suspend": true, "jobTemplate": obj{"spec": obj{"template": t}}}}
		}),
		with(gv("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", ns), func(string, int) obj {
			return obj{"spec": obj{"scaleTargetRef": obj{"apiVersion": "apps/v1", "kind": "Deployment", "name": "deployments-0"},
				"minReplicas": 1, "maxReplicas": 3,
				"metrics": []obj{{"type": "Resource", "resource": obj{"name": "cpu", "target": obj{"type": "Utilization", "averageUtilization": 80}}}}}}
		}),
		with(gv("coordination.k8s.io", "v1", "leases", "Lease", ns), func(_ string, i int) obj {
			return obj{"spec": obj{"holderIdentity": fmt.Sprintf("holder-%d", i), "leaseDurationSeconds": 15}}
		}),
		eventsV1,
		with(gv("rbac.authorization.k8s.io", "v1", "roles", "Role", ns), func(string, int) obj {
			return obj{"rules": []obj{{"apiGroups": []string{""}, "resources": []string{"pods"}, "verbs": []string{"get", "list"}}}}
		}),
		with(gv("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", ns), func(ns string, _ int) obj {
			return obj{"roleRef": obj{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "roles-0"},
				"subjects": []obj{{"kind": "ServiceAccount", "name": "default", "namespace": ns}}}
		}),
		with(gv("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", cluster), func(string, int) obj {
			return obj{"rules": []obj{{"apiGroups": []string{""}, "resources": []string{"nodes"}, "verbs": []string{"get"}}}}
		}),
		with(gv("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", cluster), func(string, int) obj {
			return obj{"roleRef": obj{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "clusterroles-0"},
				"subjects": []obj{{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "e2e-user"}}}
		}),
		with(gv("networking.k8s.io", "v1", "ingresses", "Ingress", ns), func(string, int) obj {
			return obj{"spec": obj{"defaultBackend": obj{"service": obj{"name": "services-0", "port": obj{"number": 80}}}}}
		}),
		with(gv("networking.k8s.io", "v1", "ingressclasses", "IngressClass", cluster), func(string, int) obj {
			return obj{"spec": obj{"controller": "e2e.herald.test/ingress"}}
		}),
		with(gv("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", ns), func(string, int) obj {
			return obj{"spec": obj{"podSelector": obj{}, "policyTypes": []string{"Ingress"}}}
		}),
		with(gv("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", ns), func(string, int) obj {
			return obj{"spec": obj{"minAvailable": 1, "selector": selector("web")}}
		}),
		with(gv("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", cluster), func(_ string, i int) obj {
			return obj{"value": 1000 + i, "description": "e2e"}
		}),
		with(gv("storage.k8s.io", "v1", "storageclasses", "StorageClass", cluster), func(string, int) obj {
			return obj{"provisioner": "e2e.herald.test/provisioner"}
		}),
		with(gv("storage.k8s.io", "v1", "csidrivers", "CSIDriver", cluster), func(string, int) obj {
			return obj{"spec": obj{"attachRequired": false}}
		}),
		with(gv("storage.k8s.io", "v1", "csinodes", "CSINode", cluster), func(string, int) obj {
			return obj{"spec": obj{"drivers": []obj{}}}
		}),
		with(gv("storage.k8s.io", "v1", "volumeattachments", "VolumeAttachment", cluster), func(string, int) obj {
			return obj{"spec": obj{"attacher": "e2e.herald.test", "nodeName": "node-0", "source": obj{"persistentVolumeName": "persistentvolumes-0"}}}
		}),
		with(gv("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", cluster), func(string, int) obj { return obj{"handler": "runc"} }),
		csrs,
		with(gv("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", cluster), func(string, int) obj { return obj{"spec": obj{}} }),
		with(gv("flowcontrol.apiserver.k8s.io", "v1", "prioritylevelconfigurations", "PriorityLevelConfiguration", cluster), func(string, int) obj {
			return obj{"spec": obj{"type": "Limited", "limited": obj{"nominalConcurrencyShares": 5, "limitResponse": obj{"type": "Reject"}}}}
		}),
		with(gv("flowcontrol.apiserver.k8s.io", "v1", "flowschemas", "FlowSchema", cluster), func(_ string, i int) obj {
			return obj{"spec": obj{"priorityLevelConfiguration": obj{"name": "global-default"}, "matchingPrecedence": 5000 + i,
				"distinguisherMethod": obj{"type": "ByUser"},
				"rules": []obj{{"subjects": []obj{{"kind": "User", "user": obj{"name": fmt.Sprintf("e2e-user-%d", i)}}},
					"resourceRules": []obj{{"verbs": []string{"get"}, "apiGroups": []string{""}, "resources": []string{"pods"}, "namespaces": []string{"*"}}}}}}}
		}),
		with(gv("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration", cluster), func(_ string, i int) obj {
			return obj{"webhooks": []obj{webhook(i)}}
		}),
		with(gv("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", cluster), func(_ string, i int) obj {
			return obj{"webhooks": []obj{webhook(i)}}
		}),
		with(gv("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy", cluster), func(string, int) obj {
			return obj{"spec": obj{"matchConstraints": obj{"resourceRules": []obj{nothingRule()}}, "validations": []obj{{"expression": "true"}}}}
		}),
		with(gv("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding", cluster), func(string, int) obj {
			return obj{"spec": obj{"policyName": "validatingadmissionpolicies-0", "validationActions": []string{"Deny"}}}
		}),
		// Made by kube-apiserver itself: compared read-only.
		gv("apiregistration.k8s.io", "v1", "apiservices", "APIService", cluster),
		gv("networking.k8s.io", "v1", "servicecidrs", "ServiceCIDR", cluster),
		gv("networking.k8s.io", "v1", "ipaddresses", "IPAddress", cluster),
		widgets,
	}
}

// crdPlurals: object i of the customresourcedefinitions case defines
// crdPlurals[i]; "widgets" (object 0) is the custom resource every check
// runs on; the one created mid-run (TestCRDCreatedMidRun) is not here.
var crdPlurals = []string{"widgets", "gadgets", "gizmos", "sprockets", "doodads"}

// crd is a namespaced CRD in crdGroup with one served and stored version,
// a selectable field and printer columns (one of them wide-only).
func crd(plural string) obj {
	kind := strings.ToUpper(plural[:1]) + strings.TrimSuffix(plural[1:], "s")
	return obj{"spec": obj{
		"group": crdGroup, "scope": "Namespaced",
		"names": obj{"plural": plural, "singular": strings.TrimSuffix(plural, "s"), "kind": kind, "listKind": kind + "List",
			"shortNames": []string{plural[:2] + "x"}, "categories": []string{"herald-e2e"}},
		"versions": []obj{{
			"name": "v1", "served": true, "storage": true,
			"schema": obj{"openAPIV3Schema": obj{"type": "object", "properties": obj{
				"spec": obj{"type": "object", "properties": obj{"color": obj{"type": "string"}, "size": obj{"type": "integer"}}},
			}}},
			"selectableFields": []obj{{"jsonPath": ".spec.color"}},
			"additionalPrinterColumns": []obj{
				{"name": "Color", "type": "string", "jsonPath": ".spec.color"},
				{"name": "Size", "type": "integer", "jsonPath": ".spec.size", "priority": 1},
				{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
			},
		}},
	}}
}

// nothingRule matches a resource nobody writes: the admission
// configurations the test stores must not affect any request.
func nothingRule() obj {
	return obj{"apiGroups": []string{"nothing.e2e.herald.test"}, "apiVersions": []string{"v1"},
		"operations": []string{"CREATE"}, "resources": []string{"nothings"}}
}

func webhook(i int) obj {
	return obj{"name": fmt.Sprintf("w%d.e2e.herald.test", i), "clientConfig": obj{"url": "https://127.0.0.1:1/hook"},
		"rules": []obj{nothingRule()}, "sideEffects": "None", "admissionReviewVersions": []string{"v1"}, "failurePolicy": "Ignore"}
}

// csrPEM is a fresh PKCS#10 request, base64 as the API field wants it.
func csrPEM(i int) string {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: fmt.Sprintf("e2e-%d", i)}}, key)
	if err != nil {
		panic(err)
	}
	return base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}
