package storage

import (
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	certificatesv1beta1 "k8s.io/api/certificates/v1beta1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
)

// selectableFields is the field set kube-apiserver's registry computes for
// obj (GetAttrs / ToSelectableFields in k8s.io/kubernetes pkg/registry, v1.37),
// on the stored version, whose field values equal the internal ones for
// every kind listed. Kinds not listed use generic.ObjectMetaFieldsSet:
// metadata.name, plus metadata.namespace when namespaced.
func selectableFields(obj runtime.Object, m metav1.Object, namespaced bool) fields.Set {
	f := fields.Set{"metadata.name": m.GetName()}
	if namespaced {
		f["metadata.namespace"] = m.GetNamespace()
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		f["spec.nodeName"] = o.Spec.NodeName
		f["spec.restartPolicy"] = string(o.Spec.RestartPolicy)
		f["spec.schedulerName"] = o.Spec.SchedulerName
		f["spec.serviceAccountName"] = o.Spec.ServiceAccountName
		f["spec.hostNetwork"] = strconv.FormatBool(o.Spec.HostNetwork)
		f["status.phase"] = string(o.Status.Phase)
		podIP := ""
		if len(o.Status.PodIPs) > 0 {
			podIP = o.Status.PodIPs[0].IP
		}
		f["status.podIP"] = podIP
		f["status.nominatedNodeName"] = o.Status.NominatedNodeName
	case *corev1.Node:
		f["spec.unschedulable"] = strconv.FormatBool(o.Spec.Unschedulable)
	case *corev1.Namespace:
		f["status.phase"] = string(o.Status.Phase)
		f["name"] = o.Name // legacy, kept by the registry
	case *corev1.PersistentVolume:
		f["name"] = o.Name
	case *corev1.PersistentVolumeClaim:
		f["name"] = o.Name
	case *corev1.Secret:
		f["type"] = string(o.Type)
	case *corev1.Service:
		f["spec.clusterIP"] = o.Spec.ClusterIP
		f["spec.type"] = string(o.Spec.Type)
	case *corev1.ReplicationController:
		f["status.replicas"] = strconv.Itoa(int(o.Status.Replicas))
	case *corev1.Event:
		source := o.Source.Component
		if source == "" {
			source = o.ReportingController
		}
		f["involvedObject.kind"] = o.InvolvedObject.Kind
		f["involvedObject.namespace"] = o.InvolvedObject.Namespace
		f["involvedObject.name"] = o.InvolvedObject.Name
		f["involvedObject.uid"] = string(o.InvolvedObject.UID)
		f["involvedObject.apiVersion"] = o.InvolvedObject.APIVersion
		f["involvedObject.resourceVersion"] = o.InvolvedObject.ResourceVersion
		f["involvedObject.fieldPath"] = o.InvolvedObject.FieldPath
		f["reason"] = o.Reason
		f["reportingComponent"] = o.ReportingController
		f["source"] = source
		f["type"] = o.Type
	case *appsv1.ReplicaSet:
		f["status.replicas"] = strconv.Itoa(int(o.Status.Replicas))
	case *batchv1.Job:
		f["status.successful"] = strconv.Itoa(int(o.Status.Succeeded))
	case *certificatesv1.CertificateSigningRequest:
		f["spec.signerName"] = o.Spec.SignerName
	case *certificatesv1beta1.ClusterTrustBundle:
		f["spec.signerName"] = o.Spec.SignerName
	case *certificatesv1beta1.PodCertificateRequest:
		f["spec.signerName"] = o.Spec.SignerName
		f["spec.podName"] = o.Spec.PodName
		f["spec.nodeName"] = string(o.Spec.NodeName)
	case *resourcev1.ResourceSlice:
		nodeName := ""
		if o.Spec.NodeName != nil {
			nodeName = *o.Spec.NodeName
		}
		f["spec.nodeName"] = nodeName
		f["spec.driver"] = o.Spec.Driver
		f["spec.pool.name"] = o.Spec.Pool.Name
	}
	return f
}
