package storage

import (
	"encoding/json"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsinstall "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/install"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Conversions from a storage version to a served one that need no
// internal type of k8s.io/kubernetes: the two versions carry the same fields
// under other names, so the mapping kube-apiserver's conversion through its
// internal version makes is written out here (and proven against
// kube-apiserver by integration/kubeapi); or, for CustomResourceDefinitions,
// the internal type is apiextensions-apiserver's and its own conversion runs.

// EventsV1FromCore is a core v1 Event (what kube-apiserver stores for both
// APIs) as events.k8s.io/v1 serves it: pkg/apis/events/v1/conversion.go maps
// involvedObject to regarding, message to note, source, firstTimestamp,
// lastTimestamp and count to their deprecated* fields, and copies the rest
// (reportingComponent is reportingController in both).
func EventsV1FromCore(e *corev1.Event) *eventsv1.Event {
	out := &eventsv1.Event{
		ObjectMeta: e.ObjectMeta, EventTime: e.EventTime,
		ReportingController: e.ReportingController, ReportingInstance: e.ReportingInstance,
		Action: e.Action, Reason: e.Reason, Regarding: e.InvolvedObject, Related: e.Related, Note: e.Message, Type: e.Type,
		DeprecatedSource:         e.Source,
		DeprecatedFirstTimestamp: e.FirstTimestamp, DeprecatedLastTimestamp: e.LastTimestamp, DeprecatedCount: e.Count,
	}
	if e.Series != nil {
		out.Series = &eventsv1.EventSeries{Count: e.Series.Count, LastObservedTime: e.Series.LastObservedTime}
	}
	out.SetGroupVersionKind(eventsv1.SchemeGroupVersion.WithKind("Event"))
	return out
}

// CoreEventFromEventsV1 is EventsV1FromCore's inverse.
func CoreEventFromEventsV1(e *eventsv1.Event) *corev1.Event {
	out := &corev1.Event{
		ObjectMeta: e.ObjectMeta, InvolvedObject: e.Regarding, Reason: e.Reason, Message: e.Note,
		Source:         e.DeprecatedSource,
		FirstTimestamp: e.DeprecatedFirstTimestamp, LastTimestamp: e.DeprecatedLastTimestamp, Count: e.DeprecatedCount,
		Type: e.Type, EventTime: e.EventTime, Related: e.Related, Action: e.Action,
		ReportingController: e.ReportingController, ReportingInstance: e.ReportingInstance,
	}
	if e.Series != nil {
		out.Series = &corev1.EventSeries{Count: e.Series.Count, LastObservedTime: e.Series.LastObservedTime}
	}
	out.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Event"))
	return out
}

// convertEventsV1 is the events.k8s.io/v1 Resource's Convert.
func convertEventsV1(obj runtime.Object) (runtime.Object, error) {
	e, ok := obj.(*corev1.Event)
	if !ok {
		return nil, fmt.Errorf("events.k8s.io/v1 from %T", obj)
	}
	return EventsV1FromCore(e), nil
}

// convertSameFields converts between versions whose Go types have the same
// fields by reading the stored object's JSON as the served type (a stored
// field the served type lacks is dropped, as kube-apiserver's generated
// conversion drops it).
func convertSameFields(served func() runtime.Object) func(runtime.Object) (runtime.Object, error) {
	return func(in runtime.Object) (runtime.Object, error) {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		out := served()
		if err := json.Unmarshal(b, out); err != nil {
			return nil, err
		}
		return out, nil
	}
}

// convertCRD is the apiextensions.k8s.io/v1 CustomResourceDefinitions'
// Convert: kube-apiserver stores CRDs as v1beta1 and reads them as its
// storage codec does, defaulting the v1beta1 object, converting it to the
// internal type and from there to v1 with apiextensions-apiserver's own
// generated functions (its internal types, unlike the built-in kinds',
// live outside k8s.io/kubernetes). obj is not modified.
func convertCRD(obj runtime.Object) (runtime.Object, error) {
	s := apiextensionsScheme()
	in := obj.DeepCopyObject()
	s.Default(in)
	internal, err := s.ConvertToVersion(in, apiextensions.SchemeGroupVersion)
	if err != nil {
		return nil, fmt.Errorf("CustomResourceDefinition to its internal version: %w", err)
	}
	out, err := s.ConvertToVersion(internal, apiextensionsv1.SchemeGroupVersion)
	if err != nil {
		return nil, fmt.Errorf("CustomResourceDefinition to v1: %w", err)
	}
	return out, nil
}

// apiextensionsScheme holds apiextensions.k8s.io's internal and versioned
// types with their defaulting and conversion functions. Built once, never
// changed after: a runtime.Scheme is safe for concurrent reads.
var apiextensionsScheme = sync.OnceValue(func() *runtime.Scheme {
	s := runtime.NewScheme()
	apiextensionsinstall.Install(s)
	return s
})
