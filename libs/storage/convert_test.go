package storage

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// fieldShape describes a type's JSON fields (names, tags, types),
// recursively through k8s.io/api types; other types by name.
func fieldShape(t reflect.Type, seen map[reflect.Type]bool, skip ...string) string {
	switch t.Kind() {
	case reflect.Pointer:
		return "*" + fieldShape(t.Elem(), seen, skip...)
	case reflect.Slice:
		return "[]" + fieldShape(t.Elem(), seen, skip...)
	case reflect.Map:
		return "map[" + fieldShape(t.Key(), seen, skip...) + "]" + fieldShape(t.Elem(), seen, skip...)
	case reflect.Struct:
		if !strings.HasPrefix(t.PkgPath(), "k8s.io/api/") {
			return t.String()
		}
		if seen[t] {
			return "<recursive>"
		}
		seen[t] = true
		defer delete(seen, t)
		var b strings.Builder
		b.WriteString("{")
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Name == "TypeMeta" || slices.Contains(skip, t.Name()+"."+f.Name) {
				continue
			}
			fmt.Fprintf(&b, "%s %q %s;", f.Name, f.Tag.Get("json"), fieldShape(f.Type, seen, skip...))
		}
		return b.String() + "}"
	}
	return t.Kind().String()
}

// TestSameFieldsConversions proves the claim convertSameFields rests on:
// each such resource's served type has exactly its stored type's fields,
// but for the stored-only ones kube-apiserver's conversion drops (listed).
func TestSameFieldsConversions(t *testing.T) {
	c, err := NewCodec(nil)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range Builtins() {
		// events.k8s.io and apiextensions.k8s.io have conversions of
		// their own (EventsV1FromCore, convertCRD), tested on their own.
		if g := r.GroupVersionResource().Group; r.Convert == nil || g == "events.k8s.io" || g == "apiextensions.k8s.io" {
			continue
		}
		n++
		stored, err1 := c.scheme.New(r.StorageGVK())
		served, err2 := c.scheme.New(r.ServedGVK())
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: %v %v", r.GroupVersionResource(), err1, err2)
		}
		dropped := map[string][]string{
			"podcertificaterequests": {"PodCertificateRequestSpec.PKIXPublicKey", "PodCertificateRequestSpec.ProofOfPossession"},
		}[r.Resource]
		a := fieldShape(reflect.TypeOf(stored).Elem(), map[reflect.Type]bool{}, dropped...)
		b := fieldShape(reflect.TypeOf(served).Elem(), map[reflect.Type]bool{})
		if a != b {
			t.Errorf("%s: %s and %s differ in their fields", r.GroupVersionResource(), r.StorageGVK(), r.ServedGVK())
		}
		out, err := r.Convert(stored)
		if err != nil || reflect.TypeOf(out) != reflect.TypeOf(served) {
			t.Errorf("%s: converted to %T (%v)", r.GroupVersionResource(), out, err)
		}
	}
	if n == 0 {
		t.Fatal("no same-fields conversion in the table")
	}
}

// TestEventsV1FromCore: every field of a core Event lands in its
// events.k8s.io/v1 field and back.
func TestEventsV1FromCore(t *testing.T) {
	now := metav1.Now()
	core := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "e", Namespace: "n"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "p"},
		Reason:         "r", Message: "m", Source: corev1.EventSource{Component: "c", Host: "h"},
		FirstTimestamp: now, LastTimestamp: now, Count: 3, Type: "Normal",
		EventTime: metav1.NewMicroTime(now.Time), Series: &corev1.EventSeries{Count: 2, LastObservedTime: metav1.NewMicroTime(now.Time)},
		Action: "a", Related: &corev1.ObjectReference{Name: "rel"},
		ReportingController: "rc", ReportingInstance: "ri",
	}
	ev := EventsV1FromCore(core)
	if ev.Regarding.Name != "p" || ev.Note != "m" || ev.DeprecatedSource.Host != "h" || ev.DeprecatedCount != 3 ||
		ev.Series.Count != 2 || ev.ReportingController != "rc" || ev.GetObjectKind().GroupVersionKind() != eventsv1.SchemeGroupVersion.WithKind("Event") {
		t.Fatalf("%+v", ev)
	}
	back := CoreEventFromEventsV1(ev)
	back.TypeMeta = core.TypeMeta
	if !reflect.DeepEqual(back, core) {
		t.Errorf("round trip:\n%+v\n%+v", back, core)
	}
	var _ runtime.Object = ev
}
