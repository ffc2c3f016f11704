package fanout

import (
	"testing"

	"herald.dev/libs/kube"
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
	sel, err := kube.ParseSelector(pods, "ns1", "app=web", "spec.nodeName=node-1")
	if err != nil {
		t.Fatal(err)
	}
	info := kube.RequestInfo{Resource: pods, Namespace: "ns1", Verb: kube.VerbWatch}

	st := stateRequest(info, sel, rv.WatchPlan{Mode: rv.WatchFromState, Rev: 7, Consistent: true})
	if !st.InitialEvents || st.MinRevision != 7 || !st.Consistent || st.AfterRevision != 0 {
		t.Errorf("initial state request %+v: want initial events from revision 7, consistent", st)
	}
	re := replayRequest(info, sel, 42)
	if re.AfterRevision != 42 || re.InitialEvents {
		t.Errorf("replay request %+v: want the events after 42 and no initial state", re)
	}
	for name, req := range map[string]interface {
		GetResource() string
		GetNamespace() string
		GetLabelSelector() string
		GetFieldSelector() string
		GetOmitUnchangedPrev() bool
	}{"initial state": st, "replay": re} {
		if req.GetResource() != "pods" || req.GetNamespace() != "ns1" || req.GetLabelSelector() != "app=web" || req.GetFieldSelector() != "spec.nodeName=node-1" {
			t.Errorf("%s request %+v: want pods in ns1 with the watcher's selectors", name, req)
		}
		if !req.GetOmitUnchangedPrev() {
			t.Errorf("%s request %+v: want omit_unchanged_prev", name, req)
		}
	}
}
