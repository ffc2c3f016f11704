package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"

	"herald.dev/integration/stack"
)

// Clients of cluster mode beyond kubectl's built-in kinds (TestClusterMode's
// subtests): a CRD and its custom resources, a client-go controller, tokens
// bound to a pod, and frontdoor's refusal of local identities.

const widgetCRD = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: string}
`

const widget = `
apiVersion: example.com/v1
kind: Widget
metadata: {name: w1, namespace: demo}
spec: {size: large}
`

// gadgetCRD's storage version is deprecated: requests for it carry
// apiextensions-apiserver's Warning, naming the version to use instead.
const gadgetCRD = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    deprecated: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
  - name: v1
    served: true
    storage: false
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
`

// testDeprecatedCustomResource: Herald's reads of a custom resource whose
// version its CRD deprecates carry kube-apiserver's Warning.
func testDeprecatedCustomResource(t *testing.T, ctx context.Context, c *clusterEnv) {
	admin := c.heraldCfg["admin"]
	crd := filepath.Join(c.dir, "gadget-crd.yaml")
	os.WriteFile(crd, []byte(gadgetCRD), 0o600)
	c.kubectlAs(t, ctx, admin, "apply", "-f", crd)
	c.kubectlAs(t, ctx, admin, "wait", "--for=condition=Established", "--timeout=60s", "crd/gadgets.example.com")
	const list = "/apis/example.com/v1alpha1/namespaces/demo/gadgets"
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The CRD is Established a moment before kube-apiserver serves it.
	eventually(t, wctx, "create a gadget", func() string {
		if code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodPost, list, `{"apiVersion":"example.com/v1alpha1","kind":"Gadget","metadata":{"name":"g1"}}`); code != http.StatusCreated {
			return fmt.Sprintf("%d %s", code, clip(body))
		}
		return ""
	})
	// Requests of gadgets, and requests kube-apiserver answered.
	counts := func() (float64, float64) {
		fd := c.Proc("frontdoor-0")
		return metricLabeled(t, fd, "apiserver_request_total", `resource="gadgets.example.com"`), metric(t, fd, "herald_frontdoor_forwarded_requests_total")
	}
	for _, path := range []string{list, list + "/g1"} {
		// Herald serves the resource once it has learned the CRD; until
		// then, kube-apiserver answers.
		var (
			code int
			body string
			h    http.Header
		)
		eventually(t, wctx, "GET "+path+" served by Herald", func() string {
			gadgets, forwarded := counts()
			code, body, h = c.callHeader(ctx, c.FrontdoorURL, c.Token, http.MethodGet, path, "", nil)
			if g, f := counts(); g != gadgets+1 || f != forwarded {
				return "answered by kube-apiserver"
			}
			return ""
		})
		kcode, kbody, k := c.callHeader(ctx, c.kubeURL, c.Token, http.MethodGet, path, "", nil)
		if code != http.StatusOK || kcode != http.StatusOK || len(k.Values("Warning")) == 0 ||
			!slices.Equal(h.Values("Warning"), k.Values("Warning")) {
			t.Errorf("GET %s: Herald %d Warning %q, kube-apiserver %d Warning %q\n%s\n%s", path, code, h.Values("Warning"),
				kcode, k.Values("Warning"), clip(body), clip(kbody))
		}
	}
	c.kubectlAs(t, ctx, admin, "delete", "-f", crd)
}

// testCustomResources: kubectl applies a CRD through Herald, waits for it to
// be established (a watch of CRDs, which Herald serves), finds the new kind
// once discovery has it (discovery is the cluster's), then applies, gets,
// lists, watches, patches and deletes a custom resource, all through Herald
// (custom resources are not in Herald's registry: they pass through).
func testCustomResources(t *testing.T, ctx context.Context, c *clusterEnv) {
	admin := c.heraldCfg["admin"]
	crd, cr := filepath.Join(c.dir, "crd.yaml"), filepath.Join(c.dir, "widget.yaml")
	os.WriteFile(crd, []byte(widgetCRD), 0o600)
	os.WriteFile(cr, []byte(widget), 0o600)
	if out := c.kubectlAs(t, ctx, admin, "apply", "-f", crd); !strings.Contains(out, "widgets.example.com created") {
		t.Fatalf("apply CRD: %s", out)
	}
	// kube-apiserver stores CRDs as v1beta1: Herald does not convert them
	// and forwards their reads (it must not answer 404 from its cache).
	if code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodGet, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com", ""); code != 200 {
		t.Fatalf("GET the CRD just applied: %d %s", code, clip(body))
	}
	c.kubectlAs(t, ctx, admin, "wait", "--for=condition=Established", "--timeout=60s", "crd/widgets.example.com")
	// Established is set before the aggregated discovery document lists the
	// new kind: poll until kubectl (which refreshes its discovery cache on
	// an unknown kind) resolves it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := c.kubectlTry(ctx, admin, "-n", "demo", "get", "widgets")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubectl does not find widgets 30 s after the CRD is established: %s", out)
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
	if out := c.kubectlAs(t, ctx, admin, "apply", "-f", cr); !strings.Contains(out, "widget.example.com/w1 created") {
		t.Fatalf("apply widget: %s", out)
	}
	if out := c.kubectlAs(t, ctx, admin, "-n", "demo", "get", "wd", "w1", "-o", "jsonpath={.spec.size}"); out != "large" {
		t.Errorf("get widget: size %q, want large", out)
	}
	direct := c.kubectlAs(t, ctx, c.kubeCfg["admin"], "api-resources", "--api-group=example.com")
	if via := c.kubectlAs(t, ctx, admin, "api-resources", "--api-group=example.com"); via != direct || !strings.Contains(via, "Widget") {
		t.Errorf("api-resources --api-group=example.com: Herald\n%s\nkube-apiserver\n%s", via, direct)
	}

	code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodGet, "/apis/example.com/v1/namespaces/demo/widgets", "")
	var list objMeta
	if json.Unmarshal([]byte(body), &list); code != 200 || list.Kind != "WidgetList" || !strings.Contains(body, `"name":"w1"`) {
		t.Fatalf("list widgets: %d %s", code, clip(body))
	}
	// Ended with the subtest: an open pass-through watch would hold
	// kube-apiserver's graceful shutdown (upstream-down) for its full 20 s.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, evs := c.openWatch(t, wctx, "/apis/example.com/v1/namespaces/demo/widgets?watch=true&resourceVersion="+list.Metadata.ResourceVersion)
	c.kubectlAs(t, ctx, admin, "-n", "demo", "patch", "widget", "w1", "--type=merge", "-p", `{"spec":{"size":"small"}}`)
	c.kubectlAs(t, ctx, admin, "-n", "demo", "delete", "widget", "w1")
	var seen []string
	for len(seen) < 2 {
		select {
		case ev, ok := <-evs:
			if !ok {
				t.Fatalf("the widget watch ended after %v", seen)
			}
			var o struct {
				Spec struct{ Size string } `json:"spec"`
			}
			json.Unmarshal(ev.Object, &o)
			seen = append(seen, ev.Type+" "+o.Spec.Size)
		case <-ctx.Done():
			t.Fatalf("widget watch: saw %v, want the patch and the delete", seen)
		}
	}
	if want := "[MODIFIED small DELETED small]"; fmt.Sprint(seen) != want {
		t.Errorf("widget watch through Herald: %v, want %s", seen, want)
	}
	if code, _ := c.call(ctx, c.kubeURL, c.Token, http.MethodGet, "/apis/example.com/v1/namespaces/demo/widgets/w1", ""); code != 404 {
		t.Errorf("deleted widget: kube-apiserver answers %d", code)
	}
}

// testController runs an ordinary client-go controller against Herald: a
// shared informer on ConfigMaps, a rate-limited work queue, and updates
// with retry.RetryOnConflict. It copies each ConfigMap's label "source"
// into its annotation "copied" while another writer changes the labels and
// data of the same objects concurrently. Both sides meet conflicts (the
// writer's first round deliberately writes from copies read before the
// controller's updates, so at least one per object); in the end every object
// holds the writer's last values and the controller's copy of them:
// nothing lost.
func testController(t *testing.T, ctx context.Context, c *clusterEnv) {
	const ns, objects, rounds = "ctl", 20, 3
	client := func(kubeconfig string) *kubernetes.Clientset {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		cfg.QPS, cfg.Burst = 200, 400
		return kubernetes.NewForConfigOrDie(cfg)
	}
	cs, direct := client(c.heraldCfg["admin"]), client(c.kubeCfg["admin"])
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stale := make([]*corev1.ConfigMap, objects)
	for i := range objects {
		cm, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%02d", i), Labels: map[string]string{"source": "v0"}},
			Data:       map[string]string{"round": "0"},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		stale[i] = cm
	}

	// The controller, as any would be written.
	var ctlConflicts, ctlUpdates atomic.Int64
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	cms := factory.Core().V1().ConfigMaps()
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	enqueue := func(o any) {
		if key, err := cache.MetaNamespaceKeyFunc(o); err == nil {
			queue.Add(key)
		}
	}
	cms.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }})
	sync := func(key string) error {
		namespace, name, _ := cache.SplitMetaNamespaceKey(key)
		fromLister := true
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var cm *corev1.ConfigMap
			var err error
			if fromLister {
				cm, err = cms.Lister().ConfigMaps(namespace).Get(name)
				fromLister = false
			} else {
				cm, err = cs.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
			}
			if apierrors.IsNotFound(err) {
				return nil
			} else if err != nil {
				return err
			}
			if cm.Annotations["copied"] == cm.Labels["source"] {
				return nil
			}
			cm = cm.DeepCopy()
			if cm.Annotations == nil {
				cm.Annotations = map[string]string{}
			}
			cm.Annotations["copied"] = cm.Labels["source"]
			_, err = cs.CoreV1().ConfigMaps(namespace).Update(ctx, cm, metav1.UpdateOptions{})
			if apierrors.IsConflict(err) {
				ctlConflicts.Add(1)
			} else if err == nil {
				ctlUpdates.Add(1)
			}
			return err
		})
	}
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	defer queue.ShutDown()
	factory.Start(cctx.Done())
	if !cache.WaitForCacheSync(cctx.Done(), cms.Informer().HasSynced) {
		t.Fatal("the informer never synced through Herald")
	}
	for range 2 {
		go func() {
			for {
				key, quit := queue.Get()
				if quit {
					return
				}
				if err := sync(key); err != nil {
					queue.AddRateLimited(key)
				} else {
					queue.Forget(key)
				}
				queue.Done(key)
			}
		}()
	}

	converged := func(round int) (bool, string) {
		l, err := direct.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != objects {
			return false, fmt.Sprintf("list: %v (%d objects)", err, len(l.Items))
		}
		want := fmt.Sprintf("v%d", round)
		for _, cm := range l.Items {
			if cm.Labels["source"] != want || cm.Annotations["copied"] != want || cm.Data["round"] != fmt.Sprint(round) {
				return false, fmt.Sprintf("%s: source %q copied %q round %q, want %s", cm.Name, cm.Labels["source"], cm.Annotations["copied"], cm.Data["round"], want)
			}
		}
		return true, ""
	}
	waitConverged := func(round int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			ok, why := converged(round)
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d did not converge in 30 s: %s", round, why)
			}
			select {
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	waitConverged(0)

	// The other writer: every round changes every object's label and data,
	// concurrently with the controller's copies.
	var wConflicts atomic.Int64
	for round := 1; round <= rounds; round++ {
		for i := range objects {
			var first *corev1.ConfigMap
			if round == 1 {
				first = stale[i]
			}
			name := stale[i].Name
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				cm := first
				first = nil
				if cm == nil {
					var err error
					if cm, err = cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
						return err
					}
				}
				cm = cm.DeepCopy()
				cm.Labels["source"] = fmt.Sprintf("v%d", round)
				cm.Data["round"] = fmt.Sprint(round)
				_, err := cs.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
				if apierrors.IsConflict(err) {
					wConflicts.Add(1)
				}
				return err
			})
			if err != nil {
				t.Fatalf("writer, round %d, %s: %v", round, name, err)
			}
		}
	}
	waitConverged(rounds)
	t.Logf("controller: %d updates, %d conflicts retried; writer: %d conflicts retried", ctlUpdates.Load(), ctlConflicts.Load(), wConflicts.Load())
	if wConflicts.Load() < objects {
		t.Errorf("the writer met %d conflicts, want at least %d (its first round writes stale copies)", wConflicts.Load(), objects)
	}
}

// testBoundToken: a service-account token bound to a pod (TokenRequest with
// boundObjectRef, as a projected volume holds), to a node or to a secret, works through
// Herald while the object exists and is refused (401) promptly once it is
// deleted, though the cluster's TokenReview answer is cached for a TTL.
func testBoundToken(t *testing.T, ctx context.Context, c *clusterEnv) {
	for _, r := range []struct{ path, body string }{
		{"/api/v1/namespaces/demo/serviceaccounts", `{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"bound"}}`},
		{"/apis/rbac.authorization.k8s.io/v1/namespaces/demo/rolebindings", `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{"name":"bound-configmaps"},
			"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"configmaps"},"subjects":[{"kind":"ServiceAccount","name":"bound","namespace":"demo"}]}`},
	} {
		if code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodPost, r.path, r.body); code != http.StatusCreated {
			t.Fatalf("POST %s: %d %s", r.path, code, clip(body))
		}
	}
	// Not scheduled: deleted at once (no kubelet to wait for).
	podUID := createForUID(t, ctx, c, "/api/v1/namespaces/demo/pods",
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"holder"},"spec":{"serviceAccountName":"bound","automountServiceAccountToken":false,
		"containers":[{"name":"c","image":"registry.k8s.io/pause:3.10"}]}}`)
	tok := boundToken(t, ctx, c, "Pod", "holder", podUID)
	const read = "/api/v1/namespaces/demo/configmaps/settings"
	waitCode(t, ctx, c, tok, read, http.StatusOK, time.Now(), 15*time.Second)
	const whoami = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
	review := `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`
	if code, body := c.call(ctx, c.FrontdoorURL, tok, http.MethodPost, whoami, review); code != http.StatusCreated || !strings.Contains(body, `"authentication.kubernetes.io/pod-name":["holder"]`) {
		t.Errorf("whoami with the bound token: %d %s", code, clip(body))
	}
	deleteObject(t, ctx, c, "/api/v1/namespaces/demo/pods/holder")
	waitCode(t, ctx, c, tok, read, http.StatusUnauthorized, time.Now(), 2*time.Second) // well within the review cache's 10 s
	if code, body := c.call(ctx, c.FrontdoorURL, tok, http.MethodPost, whoami, review); code != http.StatusUnauthorized {
		t.Errorf("forwarded request with the token of a deleted pod: %d %s", code, clip(body))
	}

	// The same for a token bound to a Node, and for one bound to a Secret
	// (which only the token's claims name).
	for _, o := range []struct{ kind, collection, body string }{
		{"Node", "/api/v1/nodes", `{"apiVersion":"v1","kind":"Node","metadata":{"name":"token-holder"}}`},
		{"Secret", "/api/v1/namespaces/demo/secrets", `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"token-holder"},"data":{"k":"dg=="}}`},
	} {
		tok := boundToken(t, ctx, c, o.kind, "token-holder", createForUID(t, ctx, c, o.collection, o.body))
		waitCode(t, ctx, c, tok, read, http.StatusOK, time.Now(), 15*time.Second)
		deleteObject(t, ctx, c, o.collection+"/token-holder")
		waitCode(t, ctx, c, tok, read, http.StatusUnauthorized, time.Now(), 2*time.Second)
	}
}

// createForUID creates an object as the admin and returns its uid.
func createForUID(t *testing.T, ctx context.Context, c *clusterEnv, collection, body string) string {
	t.Helper()
	code, resp := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodPost, collection, body)
	var o struct {
		Metadata struct{ UID string } `json:"metadata"`
	}
	if json.Unmarshal([]byte(resp), &o); code != http.StatusCreated || o.Metadata.UID == "" {
		t.Fatalf("POST %s: %d %s", collection, code, clip(resp))
	}
	return o.Metadata.UID
}

// boundToken requests a token of ServiceAccount demo/bound bound to the
// object kind/name with uid (TokenRequest with boundObjectRef).
func boundToken(t *testing.T, ctx context.Context, c *clusterEnv, kind, name, uid string) string {
	t.Helper()
	code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodPost, "/api/v1/namespaces/demo/serviceaccounts/bound/token",
		fmt.Sprintf(`{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":3600,
		"boundObjectRef":{"apiVersion":"v1","kind":%q,"name":%q,"uid":%q}}}`, kind, name, uid))
	var tr struct {
		Status struct{ Token string } `json:"status"`
	}
	if json.Unmarshal([]byte(body), &tr); code != http.StatusCreated || tr.Status.Token == "" {
		t.Fatalf("TokenRequest bound to %s %s: %d %s", kind, name, code, clip(body))
	}
	return tr.Status.Token
}

func deleteObject(t *testing.T, ctx context.Context, c *clusterEnv, path string) {
	t.Helper()
	if code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodDelete, path, ""); code != http.StatusOK {
		t.Fatalf("DELETE %s: %d %s", path, code, clip(body))
	}
}

// testLocalIdentitiesRefused: frontdoor does not start in cluster mode with
// a static token file (its tokens would be impersonated upstream).
func testLocalIdentitiesRefused(t *testing.T, ctx context.Context, c *clusterEnv) {
	fd := c.Proc("frontdoor-0")
	args := append(append([]string{}, fd.Args...), "--token-auth-file="+c.TokenFile)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, filepath.Join(binDir, fd.Bin), args...).CombinedOutput()
	if err == nil || cctx.Err() != nil || !strings.Contains(string(out), "token-auth-file cannot be used with upstream.kubeconfig") {
		t.Errorf("frontdoor with upstream.kubeconfig and token-auth-file: %v\n%s", err, out)
	}
}

// testMakeRunClusterMode starts a second Herald as `make run` does in
// front of a cluster (herald-dev with HERALD_ETCD, HERALD_UPSTREAM and
// HERALD_UPSTREAM_USER: stack.Options.Cluster and .Upstream): frontdoor
// runs without the stack's token file, and the kubeconfig the stack writes
// is Herald's address with the user's own cluster credentials.
func testMakeRunClusterMode(t *testing.T, ctx context.Context, c *clusterEnv) {
	dev := startStack(t, stack.Options{
		Cluster:  stack.ClusterEtcd{Endpoints: c.EtcdEndpoint},
		Upstream: stack.Upstream{Kubeconfig: c.kubeCfg["herald"], UserKubeconfig: c.kubeCfg["alice"], ClientCAFile: c.PKI.CAFile},
		// Its own ingest leader election on the shared etcd.
		Flags: map[string][]string{"ingest": {"--election.prefix=/herald-dev/ingest/leader"}},
	})
	for _, a := range dev.Proc("frontdoor-0").Args {
		if strings.HasPrefix(a, "--token-auth-file") {
			t.Errorf("frontdoor in cluster mode got %s", a)
		}
	}
	if out := c.kubectlAs(t, ctx, dev.Kubeconfig, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"); out != "alice" {
		t.Errorf("whoami with the written kubeconfig: %q, want alice", out)
	}
	if out := c.kubectlAs(t, ctx, dev.Kubeconfig, "-n", "demo", "get", "configmap", "settings", "-o", "jsonpath={.data.color}"); out != "blue" {
		t.Errorf("alice reads settings through the second Herald: %q", out)
	}
	if out, err := c.kubectlTry(ctx, dev.Kubeconfig, "-n", "other", "get", "configmaps"); err == nil || !strings.Contains(out, "Forbidden") {
		t.Errorf("alice lists configmaps in other through the second Herald: %v %s", err, out)
	}
}
