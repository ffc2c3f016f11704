package printers

import (
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	certificatesv1beta1 "k8s.io/api/certificates/v1beta1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	rbacv1beta1 "k8s.io/api/rbac/v1beta1"
	resourcev1 "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/duration"

	"herald.dev/libs/storage"
)

// The Table columns and cells of the built-in kinds, as kube-apiserver's
// table convertors make them (read from k8s.io/kubernetes v1.37.2:
// pkg/printers/internalversion/printers.go, always with the wide columns;
// rest.NewDefaultTableConvertor for the kinds whose registry uses it;
// kube-aggregator's APIService convertor). kube-apiserver prints its
// internal types; these print the served versions (k8s.io/api), whose
// fields the printed ones map onto one to one. Column descriptions come from
// the same SwaggerDoc() strings kube-apiserver uses.

// printer renders the rows of one kind.
type printer struct {
	columns []metav1.TableColumnDefinition
	// row fills in a row's cells (and conditions) from the object's JSON.
	row func(obj []byte, now time.Time, row *metav1.TableRow) error
	// order, if set, is the order kube-apiserver prints a list's items in
	// (a permutation of their indexes); nil: as listed.
	order func(items [][]byte) []int
}

// typed makes a printer of a k8s.io/api type.
func typed[T any](columns []metav1.TableColumnDefinition, cells func(o *T, now time.Time, row *metav1.TableRow)) printer {
	return printer{columns: columns, row: func(b []byte, now time.Time, row *metav1.TableRow) error {
		o := new(T)
		if err := json.Unmarshal(b, o); err != nil {
			return err
		}
		cells(o, now, row)
		return nil
	}}
}

var (
	objectMetaDoc = metav1.ObjectMeta{}.SwaggerDoc()
	nameColumn    = metav1.TableColumnDefinition{Name: "Name", Type: "string", Format: "name", Description: objectMetaDoc["name"]}
	ageColumn     = metav1.TableColumnDefinition{Name: "Age", Type: "string", Description: objectMetaDoc["creationTimestamp"]}
)

func col(name, typ, desc string) metav1.TableColumnDefinition {
	return metav1.TableColumnDefinition{Name: name, Type: typ, Description: desc}
}

func wide(name, typ, desc string) metav1.TableColumnDefinition {
	return metav1.TableColumnDefinition{Name: name, Type: typ, Description: desc, Priority: 1}
}

// since is kube-apiserver's translateTimestampSince.
func since(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}

func sinceMicro(t metav1.MicroTime, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}

func containerCells(cs []corev1.Container) (string, string) {
	names, images := make([]string, len(cs)), make([]string, len(cs))
	for i, c := range cs {
		names[i], images[i] = c.Name, c.Image
	}
	return strings.Join(names, ","), strings.Join(images, ",")
}

func boolPtr(b *bool) string {
	if b == nil {
		return "<unset>"
	}
	if *b {
		return "True"
	}
	return "False"
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

func listWithMore(list []string, more bool, count, max int) string {
	ret := strings.Join(list, ",")
	if more {
		return fmt.Sprintf("%s + %d more...", ret, count-max)
	}
	if ret == "" {
		ret = "<unset>"
	}
	return ret
}

const containersDesc, imagesDesc = "Names of each container in the template.", "Images referenced by each container in the template."

// builtinPrinters is keyed by the served group and kind. It is built once
// and only read.
var builtinPrinters = map[schema.GroupKind]printer{}

func addPrinter(group, kind string, p printer) {
	builtinPrinters[schema.GroupKind{Group: group, Kind: kind}] = p
}

// defaultPrinter is rest.NewDefaultTableConvertor's table.
var defaultPrinter = printer{
	columns: []metav1.TableColumnDefinition{nameColumn, {Name: "Created At", Type: "date", Description: objectMetaDoc["creationTimestamp"]}},
	row: func(b []byte, _ time.Time, row *metav1.TableRow) error {
		var o struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := json.Unmarshal(b, &o); err != nil {
			return err
		}
		row.Cells = []any{o.Metadata.Name, o.Metadata.CreationTimestamp.Time.UTC().Format(time.RFC3339)}
		return nil
	},
}

func init() {
	for _, gk := range []schema.GroupKind{
		{Group: "rbac.authorization.k8s.io", Kind: "Role"}, {Group: "rbac.authorization.k8s.io", Kind: "ClusterRole"},
		{Kind: "LimitRange"}, {Group: "storage.k8s.io", Kind: "CSIStorageCapacity"},
	} {
		builtinPrinters[gk] = defaultPrinter
	}
	addCorePrinters()
	addAppsPrinters()
	addOtherPrinters()
	addPrinter("apiextensions.k8s.io", "CustomResourceDefinition", crdPrinter)
}

// crdPrinter is apiextensions-apiserver's CustomResourceDefinition table
// (pkg/registry/customresourcedefinition/tableconvertor, v1.37): the
// served versions sorted, the storage one marked, and the creation time
// as a timestamp rather than an age.
var crdPrinter = typed([]metav1.TableColumnDefinition{
	nameColumn,
	col("Scope", "string", "Cluster/Namespaced"),
	col("Versions", "string", "Served versions"),
	{Name: "Created At", Type: "date", Description: objectMetaDoc["creationTimestamp"]},
	wide("Group", "string", "API group"),
	wide("Kind", "string", "CustomResource kind"),
	wide("ShortNames", "string", "Short names"),
	wide("Established", "boolean", "Established status"),
}, func(o *apiextensionsv1.CustomResourceDefinition, _ time.Time, row *metav1.TableRow) {
	var versions []string
	for _, v := range o.Spec.Versions {
		if v.Served {
			if v.Storage {
				v.Name += "(storage)"
			}
			versions = append(versions, v.Name)
		}
	}
	sort.Strings(versions)
	established := false
	for _, c := range o.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			established = true
		}
	}
	row.Cells = []any{o.Name, string(o.Spec.Scope), strings.Join(versions, ","), o.CreationTimestamp.Time.UTC().Format(time.RFC3339),
		o.Spec.Group, o.Spec.Names.Kind, strings.Join(o.Spec.Names.ShortNames, ","), established}
})

func addCorePrinters() {
	podStatus, podSpec := corev1.PodStatus{}.SwaggerDoc(), corev1.PodSpec{}.SwaggerDoc()
	addPrinter("", "Pod", typed([]metav1.TableColumnDefinition{
		nameColumn,
		col("Ready", "string", "The aggregate readiness state of this pod for accepting traffic."),
		col("Status", "string", "The aggregate status of the containers in this pod."),
		col("Restarts", "string", "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
		ageColumn,
		wide("IP", "string", podStatus["podIP"]),
		wide("Node", "string", podSpec["nodeName"]),
		wide("Nominated Node", "string", podStatus["nominatedNodeName"]),
		wide("Readiness Gates", "string", podSpec["readinessGates"]),
	}, printPod))

	addPrinter("", "PodTemplate", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Containers", "string", containersDesc), col("Images", "string", imagesDesc),
		col("Pod Labels", "string", "The labels for the pod template."),
	}, func(o *corev1.PodTemplate, _ time.Time, row *metav1.TableRow) {
		names, images := containerCells(o.Template.Spec.Containers)
		row.Cells = []any{o.Name, names, images, labels.FormatLabels(o.Template.Labels)}
	}))

	rcSpec, rcStatus := corev1.ReplicationControllerSpec{}.SwaggerDoc(), corev1.ReplicationControllerStatus{}.SwaggerDoc()
	addPrinter("", "ReplicationController", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Desired", "integer", rcSpec["replicas"]), col("Current", "integer", rcStatus["replicas"]),
		col("Ready", "integer", rcStatus["readyReplicas"]), ageColumn,
		wide("Containers", "string", containersDesc), wide("Images", "string", imagesDesc), wide("Selector", "string", rcSpec["selector"]),
	}, func(o *corev1.ReplicationController, now time.Time, row *metav1.TableRow) {
		var cs []corev1.Container
		if o.Spec.Template != nil {
			cs = o.Spec.Template.Spec.Containers
		}
		names, images := containerCells(cs)
		row.Cells = []any{o.Name, int64(deref(o.Spec.Replicas, 0)), int64(o.Status.Replicas), int64(o.Status.ReadyReplicas),
			since(o.CreationTimestamp, now), names, images, labels.FormatLabels(o.Spec.Selector)}
	}))

	svcSpec := corev1.ServiceSpec{}.SwaggerDoc()
	addPrinter("", "Service", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Type", "string", svcSpec["type"]), col("Cluster-IP", "string", svcSpec["clusterIP"]),
		col("External-IP", "string", svcSpec["externalIPs"]), col("Port(s)", "string", svcSpec["ports"]), ageColumn,
		wide("Selector", "string", svcSpec["selector"]),
	}, func(o *corev1.Service, now time.Time, row *metav1.TableRow) {
		internalIP := "<none>"
		if len(o.Spec.ClusterIPs) > 0 {
			internalIP = o.Spec.ClusterIPs[0]
		}
		ports := make([]string, len(o.Spec.Ports))
		for i, p := range o.Spec.Ports {
			ports[i] = fmt.Sprintf("%d/%s", p.Port, p.Protocol)
			if p.NodePort > 0 {
				ports[i] = fmt.Sprintf("%d:%d/%s", p.Port, p.NodePort, p.Protocol)
			}
		}
		portStr := strings.Join(ports, ",")
		if portStr == "" {
			portStr = "<none>"
		}
		row.Cells = []any{o.Name, string(o.Spec.Type), internalIP, serviceExternalIP(o), portStr, since(o.CreationTimestamp, now),
			labels.FormatLabels(o.Spec.Selector)}
	}))

	addPrinter("", "Endpoints", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Endpoints", "string", corev1.Endpoints{}.SwaggerDoc()["subsets"]), ageColumn,
	}, func(o *corev1.Endpoints, now time.Time, row *metav1.TableRow) {
		row.Cells = []any{o.Name, formatEndpoints(o), since(o.CreationTimestamp, now)}
	}))

	nodeStatus, nodeInfo := corev1.NodeStatus{}.SwaggerDoc(), corev1.NodeSystemInfo{}.SwaggerDoc()
	addPrinter("", "Node", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Status", "string", "The status of the node"), col("Roles", "string", "The roles of the node"), ageColumn,
		col("Version", "string", nodeInfo["kubeletVersion"]),
		wide("Internal-IP", "string", nodeStatus["addresses"]), wide("External-IP", "string", nodeStatus["addresses"]),
		wide("OS-Image", "string", nodeInfo["osImage"]), wide("Kernel-Version", "string", nodeInfo["kernelVersion"]),
		wide("Container-Runtime", "string", nodeInfo["containerRuntimeVersion"]),
	}, printNode))

	event := corev1.Event{}.SwaggerDoc()
	eventColumns := []metav1.TableColumnDefinition{
		col("Last Seen", "string", event["lastTimestamp"]), col("Type", "string", event["type"]),
		col("Reason", "string", event["reason"]), col("Object", "string", event["involvedObject"]),
		wide("Subobject", "string", corev1.ObjectReference{}.SwaggerDoc()["fieldPath"]), wide("Source", "string", event["source"]),
		col("Message", "string", event["message"]), wide("First Seen", "string", event["firstTimestamp"]),
		wide("Count", "string", event["count"]),
		{Name: "Name", Type: "string", Format: "name", Priority: 1, Description: objectMetaDoc["name"]},
	}
	addPrinter("", "Event", typed(eventColumns, func(o *corev1.Event, now time.Time, row *metav1.TableRow) {
		printEvent(o, now, row)
	}))
	addPrinter("events.k8s.io", "Event", typed(eventColumns, func(o *eventsv1.Event, now time.Time, row *metav1.TableRow) {
		printEvent(storage.CoreEventFromEventsV1(o), now, row)
	}))

	addPrinter("", "Namespace", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Status", "string", "The status of the namespace"), ageColumn,
	}, func(o *corev1.Namespace, now time.Time, row *metav1.TableRow) {
		row.Cells = []any{o.Name, string(o.Status.Phase), since(o.CreationTimestamp, now)}
	}))

	secret := corev1.Secret{}.SwaggerDoc()
	addPrinter("", "Secret", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Type", "string", secret["type"]), col("Data", "string", secret["data"]), ageColumn,
	}, func(o *corev1.Secret, now time.Time, row *metav1.TableRow) {
		row.Cells = []any{o.Name, string(o.Type), int64(len(o.Data)), since(o.CreationTimestamp, now)}
	}))

	addPrinter("", "ServiceAccount", typed([]metav1.TableColumnDefinition{nameColumn, ageColumn},
		func(o *corev1.ServiceAccount, now time.Time, row *metav1.TableRow) {
			row.Cells = []any{o.Name, since(o.CreationTimestamp, now)}
		}))

	pvSpec, pvStatus := corev1.PersistentVolumeSpec{}.SwaggerDoc(), corev1.PersistentVolumeStatus{}.SwaggerDoc()
	addPrinter("", "PersistentVolume", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Capacity", "string", pvSpec["capacity"]), col("Access Modes", "string", pvSpec["accessModes"]),
		col("Reclaim Policy", "string", pvSpec["persistentVolumeReclaimPolicy"]), col("Status", "string", pvStatus["phase"]),
		col("Claim", "string", pvSpec["claimRef"]), col("StorageClass", "string", "StorageClass of the pv"),
		col("VolumeAttributesClass", "string", "VolumeAttributesClass of the pv"), col("Reason", "string", pvStatus["reason"]),
		ageColumn, wide("VolumeMode", "string", pvSpec["volumeMode"]),
	}, func(o *corev1.PersistentVolume, now time.Time, row *metav1.TableRow) {
		claim := ""
		if o.Spec.ClaimRef != nil {
			claim = o.Spec.ClaimRef.Namespace + "/" + o.Spec.ClaimRef.Name
		}
		size := o.Spec.Capacity[corev1.ResourceStorage]
		phase := o.Status.Phase
		if o.DeletionTimestamp != nil {
			phase = "Terminating"
		}
		class := o.Spec.StorageClassName
		if c, ok := o.Annotations[corev1.BetaStorageClassAnnotation]; ok {
			class = c
		}
		volumeMode := "<unset>"
		if o.Spec.VolumeMode != nil {
			volumeMode = string(*o.Spec.VolumeMode)
		}
		row.Cells = []any{o.Name, size.String(), accessModes(o.Spec.AccessModes), string(o.Spec.PersistentVolumeReclaimPolicy),
			string(phase), claim, class, deref(o.Spec.VolumeAttributesClassName, "<unset>"), o.Status.Reason,
			since(o.CreationTimestamp, now), volumeMode}
	}))

	pvcSpec, pvcStatus := corev1.PersistentVolumeClaimSpec{}.SwaggerDoc(), corev1.PersistentVolumeClaimStatus{}.SwaggerDoc()
	addPrinter("", "PersistentVolumeClaim", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Status", "string", pvcStatus["phase"]), col("Volume", "string", pvcSpec["volumeName"]),
		col("Capacity", "string", pvcStatus["capacity"]), col("Access Modes", "string", pvcStatus["accessModes"]),
		col("StorageClass", "string", "StorageClass of the pvc"), col("VolumeAttributesClass", "string", "VolumeAttributesClass of the pvc"),
		ageColumn, wide("VolumeMode", "string", pvcSpec["volumeMode"]),
	}, func(o *corev1.PersistentVolumeClaim, now time.Time, row *metav1.TableRow) {
		phase := o.Status.Phase
		if o.DeletionTimestamp != nil {
			phase = "Terminating"
		}
		capacity, modes := "", ""
		if o.Spec.VolumeName != "" {
			modes = accessModes(o.Status.AccessModes)
			q := o.Status.Capacity[corev1.ResourceStorage]
			capacity = q.String()
		}
		class := deref(o.Spec.StorageClassName, "")
		if c, ok := o.Annotations[corev1.BetaStorageClassAnnotation]; ok {
			class = c
		}
		volumeMode := "<unset>"
		if o.Spec.VolumeMode != nil {
			volumeMode = string(*o.Spec.VolumeMode)
		}
		row.Cells = []any{o.Name, string(phase), o.Spec.VolumeName, capacity, modes, class,
			deref(o.Spec.VolumeAttributesClassName, "<unset>"), since(o.CreationTimestamp, now), volumeMode}
	}))

	addPrinter("", "ConfigMap", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Data", "string", corev1.ConfigMap{}.SwaggerDoc()["data"]), ageColumn,
	}, func(o *corev1.ConfigMap, now time.Time, row *metav1.TableRow) {
		row.Cells = []any{o.Name, int64(len(o.Data) + len(o.BinaryData)), since(o.CreationTimestamp, now)}
	}))

	addPrinter("", "ResourceQuota", typed([]metav1.TableColumnDefinition{
		nameColumn,
		col("Request", "string", "Request represents a minimum amount of cpu/memory that a container may consume."),
		col("Limit", "string", "Limits control the maximum amount of cpu/memory that a container may use independent of contention on the node."),
		ageColumn,
	}, func(o *corev1.ResourceQuota, now time.Time, row *metav1.TableRow) {
		names := make([]string, 0, len(o.Status.Hard))
		for n := range o.Status.Hard {
			names = append(names, string(n))
		}
		sort.Strings(names)
		var req, lim strings.Builder
		for _, n := range names {
			w := &req
			if pieces := strings.Split(n, "."); len(pieces) > 1 && pieces[0] == "limits" {
				w = &lim
			}
			used, hard := o.Status.Used[corev1.ResourceName(n)], o.Status.Hard[corev1.ResourceName(n)]
			fmt.Fprintf(w, "%s: %s/%s, ", n, used.String(), hard.String())
		}
		row.Cells = []any{o.Name, strings.TrimSuffix(req.String(), ", "), strings.TrimSuffix(lim.String(), ", "), since(o.CreationTimestamp, now)}
	}))
}

func accessModes(modes []corev1.PersistentVolumeAccessMode) string {
	has := map[corev1.PersistentVolumeAccessMode]bool{}
	for _, m := range modes {
		has[m] = true
	}
	var out []string
	for _, m := range []struct {
		mode  corev1.PersistentVolumeAccessMode
		short string
	}{{corev1.ReadWriteOnce, "RWO"}, {corev1.ReadOnlyMany, "ROX"}, {corev1.ReadWriteMany, "RWX"}, {corev1.ReadWriteOncePod, "RWOP"}} {
		if has[m.mode] {
			out = append(out, m.short)
		}
	}
	return strings.Join(out, ",")
}

func serviceExternalIP(s *corev1.Service) string {
	switch s.Spec.Type {
	case corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort:
		if len(s.Spec.ExternalIPs) > 0 {
			return strings.Join(s.Spec.ExternalIPs, ",")
		}
		return "<none>"
	case corev1.ServiceTypeLoadBalancer:
		lbIngress := s.Status.LoadBalancer.Ingress
		ips := loadBalancerAddresses(len(lbIngress), func(i int) (string, string) { return lbIngress[i].IP, lbIngress[i].Hostname })
		lb := strings.Join(ips, ",")
		if len(s.Spec.ExternalIPs) > 0 {
			var out []string
			if lb != "" {
				out = append(out, ips...)
			}
			return strings.Join(append(out, s.Spec.ExternalIPs...), ",")
		}
		if lb != "" {
			return lb
		}
		return "<pending>"
	case corev1.ServiceTypeExternalName:
		return s.Spec.ExternalName
	}
	return "<unknown>"
}

// loadBalancerAddresses is kube-apiserver's loadBalancerStatusStringer (of
// a Service's or an Ingress's status) before joining: each ingress point's
// IP, else its hostname, once each, sorted. at returns point i's.
func loadBalancerAddresses(n int, at func(i int) (ip, hostname string)) []string {
	seen := map[string]bool{}
	var out []string
	for i := range n {
		v, host := at(i)
		if v == "" {
			v = host
		}
		if v != "" && !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	sort.Strings(out)
	return out
}

func formatEndpoints(e *corev1.Endpoints) string {
	if len(e.Subsets) == 0 {
		return "<none>"
	}
	const max = 3
	var list []string
	more, count := false, 0
	add := func(s string) {
		if len(list) == max {
			more = true
			return
		}
		list = append(list, s)
	}
	for _, ss := range e.Subsets {
		if len(ss.Ports) == 0 {
			count += len(ss.Addresses)
			for _, a := range ss.Addresses {
				add(a.IP)
			}
			continue
		}
		for _, p := range ss.Ports {
			count += len(ss.Addresses)
			for _, a := range ss.Addresses {
				add(net.JoinHostPort(a.IP, strconv.Itoa(int(p.Port))))
			}
		}
	}
	ret := strings.Join(list, ",")
	if more {
		return fmt.Sprintf("%s + %d more...", ret, count-max)
	}
	return ret
}

func printPod(pod *corev1.Pod, now time.Time, row *metav1.TableRow) {
	restarts, sidecarRestarts := 0, 0
	total, ready := len(pod.Spec.Containers), 0
	var lastRestart, lastSidecarRestart metav1.Time
	reason := string(pod.Status.Phase)
	if pod.Status.Reason != "" {
		reason = pod.Status.Reason
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonSchedulingGated {
			reason = corev1.PodReasonSchedulingGated
		}
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		row.Conditions = []metav1.TableRowCondition{{Type: metav1.RowCompleted, Status: metav1.ConditionTrue, Reason: string(corev1.PodSucceeded), Message: "The pod has completed successfully."}}
	case corev1.PodFailed:
		row.Conditions = []metav1.TableRowCondition{{Type: metav1.RowCompleted, Status: metav1.ConditionTrue, Reason: string(corev1.PodFailed), Message: "The pod failed."}}
	}
	sidecar := map[string]bool{}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sidecar[c.Name] = true
			total++
		}
	}
	later := func(t *metav1.Time, s corev1.ContainerStatus) {
		if term := s.LastTerminationState.Terminated; term != nil && t.Before(&term.FinishedAt) {
			*t = term.FinishedAt
		}
	}
	initializing := false
	for i, c := range pod.Status.InitContainerStatuses {
		restarts += int(c.RestartCount)
		later(&lastRestart, c)
		if sidecar[c.Name] {
			sidecarRestarts += int(c.RestartCount)
			later(&lastSidecarRestart, c)
		}
		switch term := c.State.Terminated; {
		case term != nil && term.ExitCode == 0:
			continue
		case sidecar[c.Name] && c.Started != nil && *c.Started:
			if c.Ready {
				ready++
			}
			continue
		case term != nil:
			switch {
			case term.Reason != "":
				reason = "Init:" + term.Reason
			case term.Signal != 0:
				reason = fmt.Sprintf("Init:Signal:%d", term.Signal)
			default:
				reason = fmt.Sprintf("Init:ExitCode:%d", term.ExitCode)
			}
		case c.State.Waiting != nil && c.State.Waiting.Reason != "" && c.State.Waiting.Reason != "PodInitializing":
			reason = "Init:" + c.State.Waiting.Reason
		default:
			reason = fmt.Sprintf("Init:%d/%d", i, len(pod.Spec.InitContainers))
		}
		initializing = true
		break
	}
	initialized := false
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodInitialized && c.Status == corev1.ConditionTrue {
			initialized = true
		}
	}
	if !initializing || initialized {
		restarts, lastRestart = sidecarRestarts, lastSidecarRestart
		hasRunning, errorReason := false, ""
		for i := len(pod.Status.ContainerStatuses) - 1; i >= 0; i-- {
			c := pod.Status.ContainerStatuses[i]
			restarts += int(c.RestartCount)
			later(&lastRestart, c)
			switch term := c.State.Terminated; {
			case c.State.Waiting != nil && c.State.Waiting.Reason != "":
				reason = c.State.Waiting.Reason
			case term != nil:
				switch {
				case term.Reason != "":
					reason = term.Reason
				case term.Signal != 0:
					reason = fmt.Sprintf("Signal:%d", term.Signal)
				default:
					reason = fmt.Sprintf("ExitCode:%d", term.ExitCode)
				}
				if term.ExitCode != 0 {
					errorReason = reason
				}
			case c.Ready && c.State.Running != nil:
				hasRunning = true
				ready++
			}
		}
		if reason == "Completed" {
			podReady := false
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					podReady = true
				}
			}
			switch {
			case hasRunning && podReady:
				reason = "Running"
			case errorReason != "":
				reason = errorReason
			case hasRunning:
				reason = "NotReady"
			}
		}
	}
	terminal := pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded
	switch {
	case pod.DeletionTimestamp != nil && pod.Status.Reason == "NodeLost":
		reason = "Unknown"
	case pod.DeletionTimestamp != nil && !terminal:
		reason = "Terminating"
	}
	restartsStr := strconv.Itoa(restarts)
	if restarts != 0 && !lastRestart.IsZero() {
		restartsStr = fmt.Sprintf("%d (%s ago)", restarts, since(lastRestart, now))
	}
	podIP := ""
	if len(pod.Status.PodIPs) > 0 {
		podIP = pod.Status.PodIPs[0].IP
	}
	orNone := func(s string) string {
		if s == "" {
			return "<none>"
		}
		return s
	}
	gates := "<none>"
	if len(pod.Spec.ReadinessGates) > 0 {
		trueConditions := 0
		for _, g := range pod.Spec.ReadinessGates {
			for _, c := range pod.Status.Conditions {
				if c.Type == g.ConditionType {
					if c.Status == corev1.ConditionTrue {
						trueConditions++
					}
					break
				}
			}
		}
		gates = fmt.Sprintf("%d/%d", trueConditions, len(pod.Spec.ReadinessGates))
	}
	row.Cells = []any{pod.Name, fmt.Sprintf("%d/%d", ready, total), reason, restartsStr, since(pod.CreationTimestamp, now),
		orNone(podIP), orNone(pod.Spec.NodeName), orNone(pod.Status.NominatedNodeName), gates}
}

func printNode(o *corev1.Node, now time.Time, row *metav1.TableRow) {
	var status []string
	for _, c := range o.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		if c.Status == corev1.ConditionTrue {
			status = []string{string(c.Type)}
		} else {
			status = []string{"Not" + string(c.Type)}
		}
	}
	if len(status) == 0 {
		status = append(status, "Unknown")
	}
	if o.Spec.Unschedulable {
		status = append(status, "SchedulingDisabled")
	}
	roleSet := map[string]bool{}
	for k, v := range o.Labels {
		switch {
		case strings.HasPrefix(k, "node-role.kubernetes.io/"):
			if role := strings.TrimPrefix(k, "node-role.kubernetes.io/"); role != "" {
				roleSet[role] = true
			}
		case k == "kubernetes.io/role" && v != "":
			roleSet[v] = true
		}
	}
	roleList := make([]string, 0, len(roleSet))
	for r := range roleSet {
		roleList = append(roleList, r)
	}
	sort.Strings(roleList)
	roles := strings.Join(roleList, ",")
	if roles == "" {
		roles = "<none>"
	}
	info := o.Status.NodeInfo
	unknown := func(s string) string {
		if s == "" {
			return "<unknown>"
		}
		return s
	}
	kernel := unknown(info.KernelVersion)
	if info.Architecture != "" {
		kernel += " (" + info.Architecture + ")"
	}
	address := func(t corev1.NodeAddressType) string {
		for _, a := range o.Status.Addresses {
			if a.Type == t {
				return a.Address
			}
		}
		return "<none>"
	}
	row.Cells = []any{o.Name, strings.Join(status, ","), roles, since(o.CreationTimestamp, now), info.KubeletVersion,
		address(corev1.NodeInternalIP), address(corev1.NodeExternalIP), unknown(info.OSImage), kernel, unknown(info.ContainerRuntimeVersion)}
}

func printEvent(o *corev1.Event, now time.Time, row *metav1.TableRow) {
	first := since(o.FirstTimestamp, now)
	if o.FirstTimestamp.IsZero() {
		first = sinceMicro(o.EventTime, now)
	}
	last := since(o.LastTimestamp, now)
	if o.LastTimestamp.IsZero() {
		last = first
	}
	count := o.Count
	if o.Series != nil {
		last = sinceMicro(o.Series.LastObservedTime, now)
		count = o.Series.Count
	} else if count == 0 {
		count = 1
	}
	target := strings.ToLower(o.InvolvedObject.Kind)
	if o.InvolvedObject.Name != "" {
		target += "/" + o.InvolvedObject.Name
	}
	nonEmpty := func(a, b string) string {
		if a != "" {
			return a
		}
		return b
	}
	source := nonEmpty(o.Source.Component, o.ReportingController)
	if instance := nonEmpty(o.Source.Host, o.ReportingInstance); instance != "" {
		source += ", " + instance
	}
	row.Cells = []any{last, o.Type, o.Reason, target, o.InvolvedObject.FieldPath, source, strings.TrimSpace(o.Message),
		first, int64(count), o.Name}
}

func addAppsPrinters() {
	rsSpec, rsStatus := appsv1.ReplicaSetSpec{}.SwaggerDoc(), appsv1.ReplicaSetStatus{}.SwaggerDoc()
	addPrinter("apps", "ReplicaSet", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Desired", "integer", rsSpec["replicas"]), col("Current", "integer", rsStatus["replicas"]),
		col("Ready", "integer", rsStatus["readyReplicas"]), ageColumn,
		wide("Containers", "string", containersDesc), wide("Images", "string", imagesDesc), wide("Selector", "string", rsSpec["selector"]),
	}, func(o *appsv1.ReplicaSet, now time.Time, row *metav1.TableRow) {
		names, images := containerCells(o.Spec.Template.Spec.Containers)
		row.Cells = []any{o.Name, int64(deref(o.Spec.Replicas, 0)), int64(o.Status.Replicas), int64(o.Status.ReadyReplicas),
			since(o.CreationTimestamp, now), names, images, metav1.FormatLabelSelector(o.Spec.Selector)}
	}))

	dsStatus := appsv1.DaemonSetStatus{}.SwaggerDoc()
	addPrinter("apps", "DaemonSet", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Desired", "integer", dsStatus["desiredNumberScheduled"]), col("Current", "integer", dsStatus["currentNumberScheduled"]),
		col("Ready", "integer", dsStatus["numberReady"]), col("Up-to-date", "integer", dsStatus["updatedNumberScheduled"]),
		col("Available", "integer", dsStatus["numberAvailable"]), col("Node Selector", "string", corev1.PodSpec{}.SwaggerDoc()["nodeSelector"]),
		ageColumn, wide("Containers", "string", containersDesc), wide("Images", "string", imagesDesc),
		wide("Selector", "string", appsv1.DaemonSetSpec{}.SwaggerDoc()["selector"]),
	}, func(o *appsv1.DaemonSet, now time.Time, row *metav1.TableRow) {
		s := o.Status
		names, images := containerCells(o.Spec.Template.Spec.Containers)
		row.Cells = []any{o.Name, int64(s.DesiredNumberScheduled), int64(s.CurrentNumberScheduled), int64(s.NumberReady),
			int64(s.UpdatedNumberScheduled), int64(s.NumberAvailable), labels.FormatLabels(o.Spec.Template.Spec.NodeSelector),
			since(o.CreationTimestamp, now), names, images, metav1.FormatLabelSelector(o.Spec.Selector)}
	}))

	addPrinter("apps", "StatefulSet", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Ready", "string", "Number of the pod with ready state"), ageColumn,
		wide("Containers", "string", containersDesc), wide("Images", "string", imagesDesc),
	}, func(o *appsv1.StatefulSet, now time.Time, row *metav1.TableRow) {
		names, images := containerCells(o.Spec.Template.Spec.Containers)
		row.Cells = []any{o.Name, fmt.Sprintf("%d/%d", o.Status.ReadyReplicas, deref(o.Spec.Replicas, 0)), since(o.CreationTimestamp, now), names, images}
	}))

	depStatus := appsv1.DeploymentStatus{}.SwaggerDoc()
	addPrinter("apps", "Deployment", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Ready", "string", "Number of the pod with ready state"), col("Up-to-date", "string", depStatus["updatedReplicas"]),
		col("Available", "string", depStatus["availableReplicas"]), ageColumn,
		wide("Containers", "string", containersDesc), wide("Images", "string", imagesDesc),
		wide("Selector", "string", appsv1.DeploymentSpec{}.SwaggerDoc()["selector"]),
	}, func(o *appsv1.Deployment, now time.Time, row *metav1.TableRow) {
		sel := "<invalid>"
		if s, err := metav1.LabelSelectorAsSelector(o.Spec.Selector); err == nil {
			sel = s.String()
		}
		names, images := containerCells(o.Spec.Template.Spec.Containers)
		row.Cells = []any{o.Name, fmt.Sprintf("%d/%d", o.Status.ReadyReplicas, deref(o.Spec.Replicas, 0)), int64(o.Status.UpdatedReplicas),
			int64(o.Status.AvailableReplicas), since(o.CreationTimestamp, now), names, images, sel}
	}))

	addPrinter("apps", "ControllerRevision", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Controller", "string", "Controller of the object"),
		col("Revision", "string", appsv1.ControllerRevision{}.SwaggerDoc()["revision"]), ageColumn,
	}, func(o *appsv1.ControllerRevision, now time.Time, row *metav1.TableRow) {
		controller := "<none>"
		if ref := metav1.GetControllerOf(o); ref != nil {
			gv, _ := schema.ParseGroupVersion(ref.APIVersion)
			if gk := gv.WithKind(ref.Kind).GroupKind(); !gk.Empty() {
				controller = strings.ToLower(gk.String()) + "/" + ref.Name
			} else {
				controller = ref.Name
			}
		}
		row.Cells = []any{o.Name, controller, o.Revision, since(o.CreationTimestamp, now)}
	}))

	jobStatus := batchv1.JobStatus{}.SwaggerDoc()
	addPrinter("batch", "Job", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Status", "string", "Status of the job."), col("Completions", "string", jobStatus["succeeded"]),
		col("Duration", "string", "Time required to complete the job."), ageColumn,
		wide("Containers", "string", containersDesc), wide("Images", "string", imagesDesc),
		wide("Selector", "string", batchv1.JobSpec{}.SwaggerDoc()["selector"]),
	}, func(o *batchv1.Job, now time.Time, row *metav1.TableRow) {
		var completions string
		switch p := deref(o.Spec.Parallelism, 0); {
		case o.Spec.Completions != nil:
			completions = fmt.Sprintf("%d/%d", o.Status.Succeeded, *o.Spec.Completions)
		case p > 1:
			completions = fmt.Sprintf("%d/1 of %d", o.Status.Succeeded, p)
		default:
			completions = fmt.Sprintf("%d/1", o.Status.Succeeded)
		}
		var dur string
		switch {
		case o.Status.StartTime == nil:
		case o.Status.CompletionTime == nil:
			dur = duration.HumanDuration(now.Sub(o.Status.StartTime.Time))
		default:
			dur = duration.HumanDuration(o.Status.CompletionTime.Sub(o.Status.StartTime.Time))
		}
		has := func(t batchv1.JobConditionType) bool {
			for _, c := range o.Status.Conditions {
				if c.Type == t && c.Status == corev1.ConditionTrue {
					return true
				}
			}
			return false
		}
		status := "Running"
		switch {
		case has(batchv1.JobComplete):
			status = "Complete"
		case has(batchv1.JobFailed):
			status = "Failed"
		case o.DeletionTimestamp != nil:
			status = "Terminating"
		case has(batchv1.JobSuspended):
			status = "Suspended"
		case has(batchv1.JobFailureTarget):
			status = "FailureTarget"
		case has(batchv1.JobSuccessCriteriaMet):
			status = "SuccessCriteriaMet"
		}
		names, images := containerCells(o.Spec.Template.Spec.Containers)
		row.Cells = []any{o.Name, status, completions, dur, since(o.CreationTimestamp, now), names, images, metav1.FormatLabelSelector(o.Spec.Selector)}
	}))

	cjSpec, cjStatus := batchv1.CronJobSpec{}.SwaggerDoc(), batchv1.CronJobStatus{}.SwaggerDoc()
	addPrinter("batch", "CronJob", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Schedule", "string", cjSpec["schedule"]), col("Timezone", "string", cjSpec["timeZone"]),
		col("Suspend", "boolean", cjSpec["suspend"]), col("Active", "integer", cjStatus["active"]),
		col("Last Schedule", "string", cjStatus["lastScheduleTime"]), ageColumn,
		wide("Containers", "string", containersDesc), wide("Images", "string", imagesDesc),
		wide("Selector", "string", batchv1.JobSpec{}.SwaggerDoc()["selector"]),
	}, func(o *batchv1.CronJob, now time.Time, row *metav1.TableRow) {
		last := "<none>"
		if o.Status.LastScheduleTime != nil {
			last = since(*o.Status.LastScheduleTime, now)
		}
		names, images := containerCells(o.Spec.JobTemplate.Spec.Template.Spec.Containers)
		row.Cells = []any{o.Name, o.Spec.Schedule, deref(o.Spec.TimeZone, "<none>"), boolPtr(o.Spec.Suspend), int64(len(o.Status.Active)),
			last, since(o.CreationTimestamp, now), names, images, metav1.FormatLabelSelector(o.Spec.JobTemplate.Spec.Selector)}
	}))

	hpaSpec := autoscalingv2.HorizontalPodAutoscalerSpec{}.SwaggerDoc()
	addPrinter("autoscaling", "HorizontalPodAutoscaler", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Reference", "string", hpaSpec["scaleTargetRef"]), col("Targets", "string", hpaSpec["metrics"]),
		col("MinPods", "string", hpaSpec["minReplicas"]), col("MaxPods", "string", hpaSpec["maxReplicas"]),
		col("Replicas", "string", autoscalingv2.HorizontalPodAutoscalerStatus{}.SwaggerDoc()["currentReplicas"]), ageColumn,
	}, func(o *autoscalingv2.HorizontalPodAutoscaler, now time.Time, row *metav1.TableRow) {
		minPods := "<unset>"
		if o.Spec.MinReplicas != nil {
			minPods = strconv.Itoa(int(*o.Spec.MinReplicas))
		}
		row.Cells = []any{o.Name, o.Spec.ScaleTargetRef.Kind + "/" + o.Spec.ScaleTargetRef.Name, hpaMetrics(o.Spec.Metrics, o.Status.CurrentMetrics),
			minPods, int64(o.Spec.MaxReplicas), int64(o.Status.CurrentReplicas), since(o.CreationTimestamp, now)}
	}))
}

func hpaMetrics(specs []autoscalingv2.MetricSpec, statuses []autoscalingv2.MetricStatus) string {
	if len(specs) == 0 {
		return "<none>"
	}
	var list []string
	for i, spec := range specs {
		var st *autoscalingv2.MetricStatus
		if i < len(statuses) {
			st = &statuses[i]
		}
		current := "<unknown>"
		switch spec.Type {
		case autoscalingv2.ExternalMetricSourceType:
			var cur *autoscalingv2.MetricValueStatus
			if st != nil && st.External != nil {
				cur = &st.External.Current
			}
			list = append(list, valueMetric(spec.External.Target, cur))
		case autoscalingv2.PodsMetricSourceType:
			if st != nil && st.Pods != nil {
				current = st.Pods.Current.AverageValue.String()
			}
			list = append(list, fmt.Sprintf("%s/%s", current, spec.Pods.Target.AverageValue.String()))
		case autoscalingv2.ObjectMetricSourceType:
			var cur *autoscalingv2.MetricValueStatus
			if st != nil && st.Object != nil {
				cur = &st.Object.Current
			}
			list = append(list, valueMetric(spec.Object.Target, cur))
		case autoscalingv2.ResourceMetricSourceType:
			list = append(list, resourceMetric(spec.Resource.Name, spec.Resource.Target, resourceCurrent(st, false)))
		case autoscalingv2.ContainerResourceMetricSourceType:
			list = append(list, resourceMetric(spec.ContainerResource.Name, spec.ContainerResource.Target, resourceCurrent(st, true)))
		default:
			list = append(list, "<unknown type>")
		}
	}
	const max = 2
	if len(list) > max {
		return fmt.Sprintf("%s + %d more...", strings.Join(list[:max], ", "), len(list)-max)
	}
	return strings.Join(list, ", ")
}

// valueMetric is an External or Object metric's "current/target" (with
// " (avg)" for an average value target).
func valueMetric(target autoscalingv2.MetricTarget, cur *autoscalingv2.MetricValueStatus) string {
	current := "<unknown>"
	if target.AverageValue != nil {
		if cur != nil && cur.AverageValue != nil {
			current = cur.AverageValue.String()
		}
		return fmt.Sprintf("%s/%s (avg)", current, target.AverageValue.String())
	}
	if cur != nil {
		current = cur.Value.String()
	}
	return fmt.Sprintf("%s/%s", current, target.Value.String())
}

func resourceCurrent(st *autoscalingv2.MetricStatus, container bool) *autoscalingv2.MetricValueStatus {
	switch {
	case st == nil:
		return nil
	case container && st.ContainerResource != nil:
		return &st.ContainerResource.Current
	case !container && st.Resource != nil:
		return &st.Resource.Current
	}
	return nil
}

func resourceMetric(name corev1.ResourceName, target autoscalingv2.MetricTarget, cur *autoscalingv2.MetricValueStatus) string {
	current := "<unknown>"
	if target.AverageValue != nil {
		if cur != nil {
			current = cur.AverageValue.String()
		}
		return fmt.Sprintf("%s: %s/%s", name, current, target.AverageValue.String())
	}
	if cur != nil && cur.AverageUtilization != nil {
		current = fmt.Sprintf("%d%%", *cur.AverageUtilization)
	}
	t := "<auto>"
	if target.AverageUtilization != nil {
		t = fmt.Sprintf("%d%%", *target.AverageUtilization)
	}
	return fmt.Sprintf("%s: %s/%s", name, current, t)
}

func addOtherPrinters() {
	addPrinter("policy", "PodDisruptionBudget", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Min Available", "string", "The minimum number of pods that must be available."),
		col("Max Unavailable", "string", "The maximum number of pods that may be unavailable."),
		col("Allowed Disruptions", "integer", "Calculated number of pods that may be disrupted at this time."), ageColumn,
	}, func(o *policyv1.PodDisruptionBudget, now time.Time, row *metav1.TableRow) {
		minA, maxU := "N/A", "N/A"
		if o.Spec.MinAvailable != nil {
			minA = o.Spec.MinAvailable.String()
		}
		if o.Spec.MaxUnavailable != nil {
			maxU = o.Spec.MaxUnavailable.String()
		}
		row.Cells = []any{o.Name, minA, maxU, int64(o.Status.DisruptionsAllowed), since(o.CreationTimestamp, now)}
	}))

	addPrinter("networking.k8s.io", "Ingress", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Class", "string", "The name of the IngressClass resource that should be used for additional configuration"),
		col("Hosts", "string", "Hosts that incoming requests are matched against before the ingress rule"),
		col("Address", "string", "Address is a list containing ingress points for the load-balancer"),
		col("Ports", "string", "Ports of TLS configurations that open"), ageColumn,
	}, func(o *networkingv1.Ingress, now time.Time, row *metav1.TableRow) {
		const max = 3
		var hosts []string
		more := false
		for _, r := range o.Spec.Rules {
			if len(hosts) == max {
				more = true
			}
			if !more && r.Host != "" {
				hosts = append(hosts, r.Host)
			}
		}
		hostStr := strings.Join(hosts, ",")
		switch {
		case len(hosts) == 0:
			hostStr = "*"
		case more:
			hostStr = fmt.Sprintf("%s + %d more...", hostStr, len(o.Spec.Rules)-max)
		}
		lbIngress := o.Status.LoadBalancer.Ingress
		addrs := loadBalancerAddresses(len(lbIngress), func(i int) (string, string) { return lbIngress[i].IP, lbIngress[i].Hostname })
		ports := "80"
		if len(o.Spec.TLS) != 0 {
			ports = "80, 443"
		}
		row.Cells = []any{o.Name, deref(o.Spec.IngressClassName, "<none>"), hostStr, strings.Join(addrs, ","), ports, since(o.CreationTimestamp, now)}
	}))

	addPrinter("networking.k8s.io", "IngressClass", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Controller", "string", "Controller that is responsible for handling this class"),
		col("Parameters", "string", "A reference to a resource with additional parameters"), ageColumn,
	}, func(o *networkingv1.IngressClass, now time.Time, row *metav1.TableRow) {
		name := o.Name
		if o.Annotations[networkingv1.AnnotationIsDefaultIngressClass] == "true" {
			name += " (default)"
		}
		params := "<none>"
		if p := o.Spec.Parameters; p != nil {
			params = p.Kind
			if p.APIGroup != nil {
				params += "." + *p.APIGroup
			}
			params += "/" + p.Name
		}
		row.Cells = []any{name, o.Spec.Controller, params, since(o.CreationTimestamp, now)}
	}))

	addPrinter("networking.k8s.io", "NetworkPolicy", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Pod-Selector", "string", networkingv1.NetworkPolicySpec{}.SwaggerDoc()["podSelector"]), ageColumn,
	}, func(o *networkingv1.NetworkPolicy, now time.Time, row *metav1.TableRow) {
		row.Cells = []any{o.Name, metav1.FormatLabelSelector(&o.Spec.PodSelector), since(o.CreationTimestamp, now)}
	}))

	addPrinter("networking.k8s.io", "ServiceCIDR", typed([]metav1.TableColumnDefinition{
		nameColumn, col("CIDRs", "string", networkingv1.ServiceCIDRSpec{}.SwaggerDoc()["cidrs"]), ageColumn,
	}, func(o *networkingv1.ServiceCIDR, now time.Time, row *metav1.TableRow) {
		row.Cells = []any{o.Name, strings.Join(o.Spec.CIDRs, ","), since(o.CreationTimestamp, now)}
	}))

	// kube-apiserver declares two columns and fills three cells.
	addPrinter("networking.k8s.io", "IPAddress", typed([]metav1.TableColumnDefinition{
		nameColumn, col("ParentRef", "string", networkingv1.IPAddressSpec{}.SwaggerDoc()["parentRef"]),
	}, func(o *networkingv1.IPAddress, now time.Time, row *metav1.TableRow) {
		parent := "<none>"
		if p := o.Spec.ParentRef; p != nil {
			parent = strings.ToLower(schema.GroupResource{Group: p.Group, Resource: p.Resource}.String())
			if p.Namespace != "" {
				parent += "/" + p.Namespace
			}
			parent += "/" + p.Name
		}
		row.Cells = []any{o.Name, parent, since(o.CreationTimestamp, now)}
	}))

	// kube-apiserver describes these columns with the v1beta1 types' docs.
	bindingColumns := func(what, roleRefDoc string) []metav1.TableColumnDefinition {
		return []metav1.TableColumnDefinition{
			nameColumn, col("Role", "string", roleRefDoc), ageColumn,
			wide("Users", "string", "Users in the "+what), wide("Groups", "string", "Groups in the "+what),
			wide("ServiceAccounts", "string", "ServiceAccounts in the "+what),
		}
	}
	bindingCells := func(name string, ref rbacv1.RoleRef, subjects []rbacv1.Subject, created metav1.Time, now time.Time) []any {
		users, groups, sas := []string{}, []string{}, []string{}
		for _, s := range subjects {
			switch s.Kind {
			case rbacv1.ServiceAccountKind:
				sas = append(sas, s.Namespace+"/"+s.Name)
			case rbacv1.UserKind:
				users = append(users, s.Name)
			case rbacv1.GroupKind:
				groups = append(groups, s.Name)
			}
		}
		return []any{name, ref.Kind + "/" + ref.Name, since(created, now),
			strings.Join(users, ", "), strings.Join(groups, ", "), strings.Join(sas, ", ")}
	}
	addPrinter("rbac.authorization.k8s.io", "RoleBinding", typed(bindingColumns("roleBinding", rbacv1beta1.RoleBinding{}.SwaggerDoc()["roleRef"]),
		func(o *rbacv1.RoleBinding, now time.Time, row *metav1.TableRow) {
			row.Cells = bindingCells(o.Name, o.RoleRef, o.Subjects, o.CreationTimestamp, now)
		}))
	addPrinter("rbac.authorization.k8s.io", "ClusterRoleBinding", typed(bindingColumns("clusterRoleBinding", rbacv1beta1.ClusterRoleBinding{}.SwaggerDoc()["roleRef"]),
		func(o *rbacv1.ClusterRoleBinding, now time.Time, row *metav1.TableRow) {
			row.Cells = bindingCells(o.Name, o.RoleRef, o.Subjects, o.CreationTimestamp, now)
		}))

	csrSpec := certificatesv1beta1.CertificateSigningRequestSpec{}.SwaggerDoc()
	addPrinter("certificates.k8s.io", "CertificateSigningRequest", typed([]metav1.TableColumnDefinition{
		nameColumn, ageColumn, col("SignerName", "string", csrSpec["signerName"]), col("Requestor", "string", csrSpec["request"]),
		col("RequestedDuration", "string", csrSpec["expirationSeconds"]),
		col("Condition", "string", certificatesv1beta1.CertificateSigningRequestStatus{}.SwaggerDoc()["conditions"]),
	}, func(o *certificatesv1.CertificateSigningRequest, now time.Time, row *metav1.TableRow) {
		var approved, denied, failed bool
		for _, c := range o.Status.Conditions {
			switch c.Type {
			case certificatesv1.CertificateApproved:
				approved = true
			case certificatesv1.CertificateDenied:
				denied = true
			case certificatesv1.CertificateFailed:
				failed = true
			}
		}
		status := "Pending"
		if denied {
			status = "Denied"
		} else if approved {
			status = "Approved"
		}
		if failed {
			status += ",Failed"
		}
		if len(o.Status.Certificate) > 0 {
			status += ",Issued"
		}
		signer := o.Spec.SignerName
		if signer == "" {
			signer = "<none>"
		}
		requested := "<none>"
		if o.Spec.ExpirationSeconds != nil {
			requested = duration.HumanDuration(time.Duration(*o.Spec.ExpirationSeconds) * time.Second)
		}
		row.Cells = []any{o.Name, since(o.CreationTimestamp, now), signer, o.Spec.Username, requested, status}
	}))

	addPrinter("coordination.k8s.io", "Lease", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Holder", "string", coordinationv1.LeaseSpec{}.SwaggerDoc()["holderIdentity"]), ageColumn,
	}, func(o *coordinationv1.Lease, now time.Time, row *metav1.TableRow) {
		row.Cells = []any{o.Name, deref(o.Spec.HolderIdentity, ""), since(o.CreationTimestamp, now)}
	}))

	addPrinter("discovery.k8s.io", "EndpointSlice", typed([]metav1.TableColumnDefinition{
		nameColumn, col("AddressType", "string", discoveryv1.EndpointSlice{}.SwaggerDoc()["addressType"]),
		col("Ports", "string", discoveryv1.EndpointSlice{}.SwaggerDoc()["ports"]),
		col("Endpoints", "string", discoveryv1.EndpointSlice{}.SwaggerDoc()["endpoints"]), ageColumn,
	}, func(o *discoveryv1.EndpointSlice, now time.Time, row *metav1.TableRow) {
		const max = 3
		var ports []string
		for _, p := range o.Ports {
			if len(ports) < max {
				s := "*"
				if p.Port != nil {
					s = strconv.Itoa(int(*p.Port))
				} else if p.Name != nil {
					s = *p.Name
				}
				ports = append(ports, s)
			}
		}
		var addrs []string
		count := 0
		for _, e := range o.Endpoints {
			for _, a := range e.Addresses {
				if len(addrs) < max {
					addrs = append(addrs, a)
				}
				count++
			}
		}
		row.Cells = []any{o.Name, string(o.AddressType), listWithMore(ports, len(o.Ports) > max, len(o.Ports), max),
			listWithMore(addrs, count > max, count, max), since(o.CreationTimestamp, now)}
	}))

	pc := schedulingv1.PriorityClass{}.SwaggerDoc()
	addPrinter("scheduling.k8s.io", "PriorityClass", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Value", "integer", pc["value"]), col("Global-Default", "boolean", pc["globalDefault"]), ageColumn,
		col("PreemptionPolicy", "string", pc["preemptionPolicy"]),
	}, func(o *schedulingv1.PriorityClass, now time.Time, row *metav1.TableRow) {
		policy := ""
		if o.PreemptionPolicy != nil {
			policy = string(*o.PreemptionPolicy)
		}
		row.Cells = []any{o.Name, int64(o.Value), o.GlobalDefault, since(o.CreationTimestamp, now), policy}
	}))

	addPrinter("node.k8s.io", "RuntimeClass", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Handler", "string", objectMetaDoc["handler"]), ageColumn,
	}, func(o *nodev1.RuntimeClass, now time.Time, row *metav1.TableRow) {
		row.Cells = []any{o.Name, o.Handler, since(o.CreationTimestamp, now)}
	}))

	sc := storagev1.StorageClass{}.SwaggerDoc()
	addPrinter("storage.k8s.io", "StorageClass", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Provisioner", "string", sc["provisioner"]), col("ReclaimPolicy", "string", sc["reclaimPolicy"]),
		col("VolumeBindingMode", "string", sc["volumeBindingMode"]), col("AllowVolumeExpansion", "string", sc["allowVolumeExpansion"]),
		ageColumn,
	}, func(o *storagev1.StorageClass, now time.Time, row *metav1.TableRow) {
		row.Cells = []any{o.Name, o.Provisioner, string(deref(o.ReclaimPolicy, corev1.PersistentVolumeReclaimDelete)),
			string(deref(o.VolumeBindingMode, storagev1.VolumeBindingImmediate)), deref(o.AllowVolumeExpansion, false),
			since(o.CreationTimestamp, now)}
	}))

	addPrinter("storage.k8s.io", "VolumeAttributesClass", typed([]metav1.TableColumnDefinition{
		nameColumn, col("DriverName", "string", storagev1.VolumeAttributesClass{}.SwaggerDoc()["driverName"]), ageColumn,
	}, func(o *storagev1.VolumeAttributesClass, now time.Time, row *metav1.TableRow) {
		row.Cells = []any{o.Name, o.DriverName, since(o.CreationTimestamp, now)}
	}))

	csi := storagev1.CSIDriverSpec{}.SwaggerDoc()
	addPrinter("storage.k8s.io", "CSIDriver", typed([]metav1.TableColumnDefinition{
		nameColumn, col("AttachRequired", "boolean", csi["attachRequired"]), col("PodInfoOnMount", "boolean", csi["podInfoOnMount"]),
		col("StorageCapacity", "boolean", csi["storageCapacity"]), col("TokenRequests", "string", csi["tokenRequests"]),
		col("RequiresRepublish", "boolean", csi["requiresRepublish"]), col("Modes", "string", csi["volumeLifecycleModes"]), ageColumn,
	}, func(o *storagev1.CSIDriver, now time.Time, row *metav1.TableRow) {
		modes := make([]string, 0, len(o.Spec.VolumeLifecycleModes))
		for _, m := range o.Spec.VolumeLifecycleModes {
			modes = append(modes, string(m))
		}
		modeStr := strings.Join(modes, ",")
		if modeStr == "" {
			modeStr = "<none>"
		}
		tokens := "<unset>"
		if o.Spec.TokenRequests != nil {
			auds := []string{}
			for _, t := range o.Spec.TokenRequests {
				auds = append(auds, t.Audience)
			}
			tokens = strings.Join(auds, ",")
		}
		row.Cells = []any{o.Name, deref(o.Spec.AttachRequired, true), deref(o.Spec.PodInfoOnMount, false), deref(o.Spec.StorageCapacity, false),
			tokens, deref(o.Spec.RequiresRepublish, false), modeStr, since(o.CreationTimestamp, now)}
	}))

	addPrinter("storage.k8s.io", "CSINode", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Drivers", "integer", "Drivers indicates the number of CSI drivers registered on the node"), ageColumn,
	}, func(o *storagev1.CSINode, now time.Time, row *metav1.TableRow) {
		row.Cells = []any{o.Name, int64(len(o.Spec.Drivers)), since(o.CreationTimestamp, now)}
	}))

	va := storagev1.VolumeAttachmentSpec{}.SwaggerDoc()
	addPrinter("storage.k8s.io", "VolumeAttachment", typed([]metav1.TableColumnDefinition{
		nameColumn, {Name: "Attacher", Type: "string", Format: "name", Description: va["attacher"]},
		col("PV", "string", storagev1.VolumeAttachmentSource{}.SwaggerDoc()["persistentVolumeName"]), col("Node", "string", va["nodeName"]),
		col("Attached", "boolean", storagev1.VolumeAttachmentStatus{}.SwaggerDoc()["attached"]), ageColumn,
	}, func(o *storagev1.VolumeAttachment, now time.Time, row *metav1.TableRow) {
		row.Cells = []any{o.Name, o.Spec.Attacher, deref(o.Spec.Source.PersistentVolumeName, ""), o.Spec.NodeName, o.Status.Attached,
			since(o.CreationTimestamp, now)}
	}))

	addPrinter("resource.k8s.io", "DeviceClass", typed([]metav1.TableColumnDefinition{nameColumn, ageColumn},
		func(o *resourcev1.DeviceClass, now time.Time, row *metav1.TableRow) {
			row.Cells = []any{o.Name, since(o.CreationTimestamp, now)}
		}))
	addPrinter("resource.k8s.io", "ResourceClaimTemplate", typed([]metav1.TableColumnDefinition{nameColumn, ageColumn},
		func(o *resourcev1.ResourceClaimTemplate, now time.Time, row *metav1.TableRow) {
			row.Cells = []any{o.Name, since(o.CreationTimestamp, now)}
		}))

	fs := flowcontrolv1.FlowSchemaSpec{}.SwaggerDoc()
	flowSchemas := typed([]metav1.TableColumnDefinition{
		nameColumn, col("PriorityLevel", "string", flowcontrolv1.PriorityLevelConfigurationReference{}.SwaggerDoc()["name"]),
		col("MatchingPrecedence", "string", fs["matchingPrecedence"]), col("DistinguisherMethod", "string", fs["distinguisherMethod"]),
		ageColumn, col("MissingPL", "string", "references a broken or non-existent PriorityLevelConfiguration"),
	}, func(o *flowcontrolv1.FlowSchema, now time.Time, row *metav1.TableRow) {
		method := "<none>"
		if o.Spec.DistinguisherMethod != nil {
			method = string(o.Spec.DistinguisherMethod.Type)
		}
		bad := "?"
		for _, c := range o.Status.Conditions {
			if c.Type == flowcontrolv1.FlowSchemaConditionDangling {
				bad = string(c.Status)
				break
			}
		}
		row.Cells = []any{o.Name, o.Spec.PriorityLevelConfiguration.Name, int64(o.Spec.MatchingPrecedence), method, since(o.CreationTimestamp, now), bad}
	})
	// printFlowSchemaList: by matching precedence, then name.
	flowSchemas.order = func(items [][]byte) []int {
		type key struct {
			precedence int32
			name       string
		}
		keys := make([]key, len(items))
		idx := make([]int, len(items))
		for i, it := range items {
			var o flowcontrolv1.FlowSchema
			_ = json.Unmarshal(it, &o)
			keys[i], idx[i] = key{o.Spec.MatchingPrecedence, o.Name}, i
		}
		sort.SliceStable(idx, func(a, b int) bool {
			ka, kb := keys[idx[a]], keys[idx[b]]
			if ka.precedence != kb.precedence {
				return ka.precedence < kb.precedence
			}
			return ka.name < kb.name
		})
		return idx
	}
	addPrinter("flowcontrol.apiserver.k8s.io", "FlowSchema", flowSchemas)

	qc := flowcontrolv1.QueuingConfiguration{}.SwaggerDoc()
	addPrinter("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Type", "string", flowcontrolv1.PriorityLevelConfigurationSpec{}.SwaggerDoc()["type"]),
		col("NominalConcurrencyShares", "string", flowcontrolv1.LimitedPriorityLevelConfiguration{}.SwaggerDoc()["nominalConcurrencyShares"]),
		col("Queues", "string", qc["queues"]), col("HandSize", "string", qc["handSize"]),
		col("QueueLengthLimit", "string", qc["queueLengthLimit"]), ageColumn,
	}, func(o *flowcontrolv1.PriorityLevelConfiguration, now time.Time, row *metav1.TableRow) {
		var ncs, queues, hand, limit any = "<none>", "<none>", "<none>", "<none>"
		if l := o.Spec.Limited; l != nil {
			ncs = deref(l.NominalConcurrencyShares, 0)
			if q := l.LimitResponse.Queuing; q != nil {
				queues, hand, limit = q.Queues, q.HandSize, q.QueueLengthLimit
			}
		}
		row.Cells = []any{o.Name, string(o.Spec.Type), ncs, queues, hand, limit, since(o.CreationTimestamp, now)}
	}))

	webhooks := []metav1.TableColumnDefinition{
		nameColumn, col("Webhooks", "integer", "Webhooks indicates the number of webhooks registered in this configuration"), ageColumn,
	}
	addPrinter("admissionregistration.k8s.io", "ValidatingWebhookConfiguration", typed(webhooks,
		func(o *admissionv1.ValidatingWebhookConfiguration, now time.Time, row *metav1.TableRow) {
			row.Cells = []any{o.Name, int64(len(o.Webhooks)), since(o.CreationTimestamp, now)}
		}))
	addPrinter("admissionregistration.k8s.io", "MutatingWebhookConfiguration", typed(webhooks,
		func(o *admissionv1.MutatingWebhookConfiguration, now time.Time, row *metav1.TableRow) {
			row.Cells = []any{o.Name, int64(len(o.Webhooks)), since(o.CreationTimestamp, now)}
		}))
	paramKind := func(p *admissionv1.ParamKind) string {
		if p == nil {
			return "<unset>"
		}
		return p.APIVersion + "/" + p.Kind
	}
	paramRef := func(p *admissionv1.ParamRef) string {
		switch {
		case p == nil:
			return "<unset>"
		case p.Name != "" && p.Namespace != "":
			return p.Namespace + "/" + p.Name
		case p.Name != "":
			return "*/" + p.Name
		case p.Selector != nil:
			return p.Selector.String()
		}
		return "<unset>"
	}
	paramKindCol := col("ParamKind", "string", "ParamKind specifies the kind of resources used to parameterize this policy")
	bindingCols := []metav1.TableColumnDefinition{
		nameColumn, col("PolicyName", "string", "PolicyName indicates the policy definition which the policy binding binded to"),
		col("ParamRef", "string", "ParamRef indicates the param resource which sets the configuration param"), ageColumn,
	}
	addPrinter("admissionregistration.k8s.io", "ValidatingAdmissionPolicy", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Validations", "integer", "Validations indicates the number of validation rules defined in this configuration"),
		paramKindCol, ageColumn,
	}, func(o *admissionv1.ValidatingAdmissionPolicy, now time.Time, row *metav1.TableRow) {
		row.Cells = []any{o.Name, int64(len(o.Spec.Validations)), paramKind(o.Spec.ParamKind), since(o.CreationTimestamp, now)}
	}))
	addPrinter("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding", typed(bindingCols,
		func(o *admissionv1.ValidatingAdmissionPolicyBinding, now time.Time, row *metav1.TableRow) {
			row.Cells = []any{o.Name, o.Spec.PolicyName, paramRef(o.Spec.ParamRef), since(o.CreationTimestamp, now)}
		}))

	addPrinter("apiregistration.k8s.io", "APIService", typed([]metav1.TableColumnDefinition{
		nameColumn, col("Service", "string", "The reference to the service that hosts this API endpoint."),
		col("Available", "string", "Whether this service is available."), ageColumn,
	}, func(o *apiService, now time.Time, row *metav1.TableRow) {
		service := "Local"
		if s := o.Spec.Service; s != nil {
			service = s.Namespace + "/" + s.Name
		}
		status := "Unknown"
		for _, c := range o.Status.Conditions {
			if c.Type != "Available" {
				continue
			}
			switch {
			case c.Status == "True":
				status = c.Status
			case c.Reason != "":
				status = fmt.Sprintf("%s (%s)", c.Status, c.Reason)
			default:
				status = c.Status
			}
			break
		}
		row.Cells = []any{o.Name, service, status, since(o.CreationTimestamp, now)}
	}))
}

// apiService is the part of an apiregistration.k8s.io APIService its table
// row shows (kube-aggregator's types are not a dependency of this module).
type apiService struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Service *struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"service"`
	} `json:"spec"`
	Status struct {
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
			Reason string `json:"reason"`
		} `json:"conditions"`
	} `json:"status"`
}
