package fanout

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"herald.dev/libs/cacheclient"
	"herald.dev/libs/kube"
	"herald.dev/libs/kube/request"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/rv"
)

// Every request a watcher's start makes of the cache carries the watcher's
// namespace and selectors, and asks for updates that left labels and
// selectable fields alone without their previous state: transition decides
// those by the object alone, and an initial state or replay is where a
// restarting fleet's watches put most of the hop's bytes.
func TestStartRequests(t *testing.T) {
	reg, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	pods, _ := reg.ByID("pods")
	sel, err := request.ParseSelector(pods, "ns1", "app=web", "spec.nodeName=node-1")
	if err != nil {
		t.Fatal(err)
	}
	info := request.Info{Resource: pods, Namespace: "ns1", Verb: request.VerbWatch}

	st := stateRequest(info, sel, rv.WatchPlan{Mode: rv.WatchFromState, Rev: 7, Consistent: true})
	if !st.InitialEvents || st.MinRevision != 7 || !st.Consistent || st.AfterRevision != 0 {
		t.Errorf("initial state request %+v: want initial events from revision 7, consistent", st)
	}
	re := replayRequest(info, sel, 42, false)
	if re.AfterRevision != 42 || re.InitialEvents {
		t.Errorf("replay request %+v: want the events after 42 and no initial state", re)
	}
	for _, tc := range []struct {
		name string
		req  *heraldv1.WatchRequest
	}{{"initial state", st}, {"replay", re}} {
		if tc.req.Resource != "pods" || tc.req.Namespace != "ns1" || tc.req.LabelSelector != "app=web" || tc.req.FieldSelector != "spec.nodeName=node-1" {
			t.Errorf("%s request %+v: want pods in ns1 with the watcher's selectors", tc.name, tc.req)
		}
		if !tc.req.OmitUnchangedPrev {
			t.Errorf("%s request %+v: want omit_unchanged_prev", tc.name, tc.req)
		}
		// The selectors as parsed, for the cache to use without parsing.
		if !proto.Equal(tc.req.Selector, cacheclient.Selector(sel)) || len(tc.req.Selector.GetLabels()) != 1 || len(tc.req.Selector.GetFields()) != 1 {
			t.Errorf("%s request's selector %v, want %v", tc.name, tc.req.Selector, cacheclient.Selector(sel))
		}
	}
	// The cache's protobuf of the objects only for a watcher that writes it.
	if st.WithProtobuf || re.WithProtobuf || !replayRequest(info, sel, 42, true).WithProtobuf {
		t.Error("with_protobuf asked for a watcher that does not write protobuf, or not for one that does")
	}
}
