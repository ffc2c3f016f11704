package cacheclient

import (
	"context"
	"log/slog"
	"time"

	"herald.dev/libs/kube"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// FollowCRDs keeps reg's custom resources those of the CustomResourceDefinitions
// the caches hold, for the hops that serve requests (frontdoor, fanout) but
// do not read the stream: it watches the CRDs through c from their current
// state (a consistent read, as an informer's list), sets every CRD's
// resources once that state is complete (kube.Registry.ReplaceCRDs), then
// each CRD as it changes. A broken watch is opened again from scratch after
// a pause (200 ms, doubling up to 5 s). onChange, when not nil, is called
// after every change of reg's custom resources. It returns when ctx ends;
// with no CRD resource in reg it returns at once.
//
// The caches learn custom resources from the same objects, at the CRD's
// revision; a hop learns them some time after. Until then it answers for a
// custom resource as for any resource it does not serve (in cluster mode,
// kube-apiserver answers).
//
// A CRD Herald cannot serve is left out; the cache holding the CRDs counts
// and logs it (herald_cache_undecodable_values_total{reason="invalid_crd"}),
// here it is only logged at debug level.
func FollowCRDs(ctx context.Context, c heraldv1.CacheClient, reg *kube.Registry, log *slog.Logger, onChange func()) {
	if _, ok := reg.ByID(kube.CRDResourceID); !ok {
		return
	}
	f := &crdFollower{reg: reg, log: log, onChange: onChange}
	backoff := 200 * time.Millisecond
	for ctx.Err() == nil {
		synced, err := f.follow(ctx, c)
		if ctx.Err() != nil {
			return
		}
		if synced {
			backoff = 200 * time.Millisecond
		}
		log.Warn("watching CustomResourceDefinitions failed; watching again", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

type crdFollower struct {
	reg      *kube.Registry
	log      *slog.Logger
	onChange func()
}

// crd is one CRD as last seen: its revision and what it serves.
type crd struct {
	rev       int64
	resources []kube.Resource
}

// follow runs one watch until it breaks; synced reports whether it got as
// far as the complete initial state.
func (f *crdFollower) follow(ctx context.Context, c heraldv1.CacheClient) (synced bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Watch(ctx, &heraldv1.WatchRequest{Resource: kube.CRDResourceID, InitialEvents: true, Consistent: true, Follow: true})
	if err != nil {
		return false, err
	}
	crds := map[string]crd{}
	for {
		resp, err := st.Recv()
		if err != nil {
			return synced, err
		}
		changed := map[string]bool{}
		for _, ev := range resp.Events {
			switch ev.Type {
			case heraldv1.EventType_ADDED, heraldv1.EventType_MODIFIED:
				name, rs, err := kube.CustomResources(ev.Object)
				if err != nil {
					f.log.Debug("CustomResourceDefinition not served", "crd", ev.Name, "revision", ev.Revision, "err", err)
				}
				if name == "" {
					name = ev.Name
				}
				crds[name] = crd{rev: ev.Revision, resources: rs}
				changed[name] = true
			case heraldv1.EventType_DELETED:
				delete(crds, ev.Name)
				changed[ev.Name] = true
			case heraldv1.EventType_BOOKMARK:
				if !synced {
					// The initial state is complete: set it whole, which
					// also drops CRDs deleted while no watch was open.
					synced = true
					all := make(map[string][]kube.Resource, len(crds))
					for name, d := range crds {
						if len(d.resources) > 0 {
							all[name] = d.resources
						}
					}
					ch, err := f.reg.ReplaceCRDs(all)
					if err != nil {
						f.log.Warn("CustomResourceDefinitions not served", "err", err)
					}
					f.notify(ch)
					clear(changed)
				}
			}
		}
		if !synced {
			continue
		}
		any := false
		for name := range changed {
			ch, err := f.reg.SetCRD(name, crds[name].resources)
			if err != nil {
				f.log.Warn("CustomResourceDefinition not served", "crd", name, "err", err)
			}
			any = any || ch
		}
		f.notify(any)
	}
}

func (f *crdFollower) notify(changed bool) {
	if changed && f.onChange != nil {
		f.onChange()
	}
}
