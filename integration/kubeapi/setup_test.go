package kubeapi

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// setup writes every case's objects through kube-apiserver, then runs the
// watch phase (see setupObjects) and records where each case's watch
// comparisons start and end.
func (f *fixture) setup(ctx context.Context) error {
	f.cases = cases()
	for _, c := range f.cases {
		if c.make == nil {
			continue
		}
		for _, i := range setupObjects {
			if err := f.create(ctx, c, i); err != nil {
				return err
			}
		}
		switch c.gvr.Resource {
		case "namespaces":
			// No controller runs to make each namespace's default
			// ServiceAccount; pods need it.
			for _, ns := range []string{nsA, nsB} {
				sa := &unstructured.Unstructured{Object: obj{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": obj{"name": "default", "namespace": ns}}}
				if _, err := f.dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}).Namespace(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
					return fmt.Errorf("default service account in %s: %w", ns, err)
				}
			}
		case "customresourcedefinitions":
			for _, i := range setupObjects {
				if err := f.waitEstablished(ctx, c.name0(i)); err != nil {
					return err
				}
			}
		}
	}
	from, err := f.currentRV(ctx)
	if err != nil {
		return err
	}
	for _, c := range f.cases {
		if c.make == nil {
			continue
		}
		c.watchFrom = from
		if err := f.watchPhase(ctx, c); err != nil {
			return fmt.Errorf("%s: %w", c.gvr.Resource, err)
		}
	}
	return nil
}

func (f *fixture) client(c *resourceCase, ns string) dynamic.ResourceInterface {
	if ns == "" {
		return f.dyn.Resource(c.gvr)
	}
	return f.dyn.Resource(c.gvr).Namespace(ns)
}

// create writes object i of c through kube-apiserver, then its status.
func (f *fixture) create(ctx context.Context, c *resourceCase, i int) error {
	o := c.make(c.ns(i), i)
	md := obj{"name": c.name0(i), "labels": obj{"herald-e2e": "yes", "tier": tiers[i], "index": fmt.Sprint(i)}}
	if ns := c.ns(i); ns != "" {
		md["namespace"] = ns
	}
	o["apiVersion"], o["kind"], o["metadata"] = c.apiVersion(), c.kind, md
	if _, err := f.client(c, c.ns(i)).Create(ctx, &unstructured.Unstructured{Object: o}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating %s %s: %w", c.gvr.Resource, c.name0(i), err)
	}
	if c.status == nil || c.status(i) == nil {
		return nil
	}
	if _, err := f.patch(ctx, c, i, obj{"status": c.status(i)}, "status"); err != nil {
		return fmt.Errorf("status of %s %s: %w", c.gvr.Resource, c.name0(i), err)
	}
	return nil
}

// patch merge-patches object i and returns its new resourceVersion.
func (f *fixture) patch(ctx context.Context, c *resourceCase, i int, p obj, subresources ...string) (string, error) {
	b, _ := json.Marshal(p)
	u, err := f.client(c, c.ns(i)).Patch(ctx, c.name0(i), types.MergePatchType, b, metav1.PatchOptions{}, subresources...)
	if err != nil {
		return "", err
	}
	return u.GetResourceVersion(), nil
}

// watchPhase changes c's objects in every way a watch reports (see
// setupObjects) and records the marker's resourceVersion.
func (f *fixture) watchPhase(ctx context.Context, c *resourceCase) error {
	if _, err := f.patch(ctx, c, 0, obj{"metadata": obj{"labels": obj{"watched": "yes"}}}); err != nil {
		return err
	}
	if _, err := f.patch(ctx, c, 1, obj{"metadata": obj{"labels": obj{"tier": "gone"}}}); err != nil {
		return err
	}
	if err := f.client(c, c.ns(2)).Delete(ctx, c.name0(2), metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := f.create(ctx, c, 3); err != nil {
		return err
	}
	if c.gvr.Resource == "customresourcedefinitions" {
		if err := f.waitEstablished(ctx, c.name0(3)); err != nil {
			return err
		}
	}
	rv, err := f.patch(ctx, c, 0, obj{"metadata": obj{"annotations": obj{"e2e.herald.test/marker": "end"}}})
	c.marker = rv
	return err
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// waitEstablished waits until kube-apiserver serves the CRD's resource.
func (f *fixture) waitEstablished(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		u, err := f.dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		if u != nil {
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD %s not established: %w", name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// currentRV is etcd's current revision as kube-apiserver reports it (a
// consistent list's resourceVersion).
func (f *fixture) currentRV(ctx context.Context) (string, error) {
	l, err := f.dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return "", err
	}
	return l.GetResourceVersion(), nil
}
