package manifests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"herald.dev/libs/kube"
	"herald.dev/libs/service"
)

// overlays are the renderings that must hold; each is deploy/k8s/overlays/<name>.
var overlays = []string{"dev", "prod", "cluster"}

// clusterOverlays read an existing cluster's etcd (the one kube-apiserver
// writes) instead of Herald's own: no herald-etcd, etcd over mutual TLS, the
// caches decrypting with kube-apiserver's EncryptionConfiguration.
var clusterOverlays = map[string]bool{"cluster": true}

// heraldServices are the Herald binaries (services/<name>/cmd/<name>).
var heraldServices = []string{"ingest", "cache", "fanout", "frontdoor"}

// addrFlags bind a listener; the port they name must be a declared
// containerPort.
var addrFlags = []string{"addr", "admin.addr", "grpc.addr", "http.addr"}

// peerFlags name other services; every host:port in them must be a port of a
// Service in the same rendering.
var peerFlags = []string{"etcd.endpoints", "nats.url", "cache.addr", "fanout.addrs"}

// newObject returns the typed object for an apiVersion and kind. A kind the
// manifests should not contain is an error, not a pass.
func newObject(apiVersion, kind string) (any, error) {
	switch apiVersion + "/" + kind {
	case "v1/Namespace":
		return &corev1.Namespace{}, nil
	case "v1/Service":
		return &corev1.Service{}, nil
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, nil
	case "apps/v1/StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "autoscaling/v2/HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, nil
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, nil
	case "rbac.authorization.k8s.io/v1/Role":
		return &rbacv1.Role{}, nil
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		return &rbacv1.RoleBinding{}, nil
	case "rbac.authorization.k8s.io/v1/ClusterRole":
		return &rbacv1.ClusterRole{}, nil
	case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}, nil
	}
	return nil, fmt.Errorf("unexpected kind %s %s", apiVersion, kind)
}

// rendering is one overlay decoded into typed objects.
type rendering struct {
	overlay string
	byKind  map[string]map[string]any // kind -> name -> object
}

func (r *rendering) all(kind string) map[string]any { return r.byKind[kind] }

// workload is a Deployment or StatefulSet reduced to what the checks need.
type workload struct {
	kind, name string
	replicas   int32
	service    string // StatefulSet's governing Service
	labels     map[string]string
	pod        corev1.PodSpec
}

func (r *rendering) workloads() []workload {
	var out []workload
	for name, o := range r.all("Deployment") {
		d := o.(*appsv1.Deployment)
		out = append(out, workload{kind: "Deployment", name: name, replicas: deref(d.Spec.Replicas), labels: d.Spec.Template.Labels, pod: d.Spec.Template.Spec})
	}
	for name, o := range r.all("StatefulSet") {
		s := o.(*appsv1.StatefulSet)
		out = append(out, workload{kind: "StatefulSet", name: name, replicas: deref(s.Spec.Replicas), service: s.Spec.ServiceName, labels: s.Spec.Template.Labels, pod: s.Spec.Template.Spec})
	}
	slices.SortFunc(out, func(a, b workload) int { return strings.Compare(a.name, b.name) })
	return out
}

func deref(p *int32) int32 {
	if p == nil {
		return 1
	}
	return *p
}

func TestOverlaysDecodeStrictly(t *testing.T) {
	for _, o := range overlays {
		t.Run(o, func(t *testing.T) {
			r := render(t, o)
			want := map[string][]string{
				"StatefulSet":             {"herald-cache-a", "herald-cache-b", "herald-etcd", "herald-nats"},
				"Deployment":              {"herald-fanout", "herald-frontdoor", "herald-ingest", "herald-otel-collector"},
				"HorizontalPodAutoscaler": {"herald-fanout"},
				"PodDisruptionBudget":     {"herald-cache-a", "herald-cache-b", "herald-etcd", "herald-fanout", "herald-frontdoor", "herald-ingest", "herald-nats"},
			}
			if clusterOverlays[o] {
				// The cluster's etcd replaces Herald's own: nothing of it
				// may remain.
				for _, kind := range []string{"StatefulSet", "PodDisruptionBudget", "Service", "NetworkPolicy", "ServiceAccount"} {
					if r.all(kind)["herald-etcd"] != nil {
						t.Errorf("%s herald-etcd in an overlay that reads the cluster's etcd", kind)
					}
					want[kind] = slices.DeleteFunc(want[kind], func(n string) bool { return n == "herald-etcd" })
				}
			}
			for kind, names := range want {
				for _, n := range names {
					if r.all(kind)[n] == nil {
						t.Errorf("%s %s is missing", kind, n)
					}
				}
			}
			for _, kind := range []string{"NetworkPolicy", "Role", "RoleBinding", "ServiceAccount", "Namespace", "ConfigMap"} {
				if len(r.all(kind)) == 0 {
					t.Errorf("no %s", kind)
				}
			}
			if r.all("NetworkPolicy")["herald-default-deny"] == nil {
				t.Error("no default-deny NetworkPolicy")
			}
		})
	}
}

func TestWorkloadsAreHardened(t *testing.T) {
	images := makeImages(t)
	for _, o := range overlays {
		t.Run(o, func(t *testing.T) {
			r := render(t, o)
			for _, w := range r.workloads() {
				checkPod(t, r, w, images)
			}
		})
	}
}

// checkPod checks one workload's pod template: non-root, read-only,
// resources, probes, images, service account, volumes.
func checkPod(t *testing.T, r *rendering, w workload, images map[string]bool) {
	t.Helper()
	where := w.kind + " " + w.name
	ps := w.pod
	if sc := ps.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("%s: pod must run as a non-root user", where)
	}
	if r.all("ServiceAccount")[ps.ServiceAccountName] == nil {
		t.Errorf("%s: service account %q is not in the rendering", where, ps.ServiceAccountName)
	}
	volumes := map[string]bool{}
	for _, v := range ps.Volumes {
		volumes[v.Name] = true
		if v.Secret == nil && v.ConfigMap == nil {
			t.Errorf("%s: volume %s is neither a Secret nor a ConfigMap", where, v.Name)
		}
		if v.ConfigMap != nil && r.all("ConfigMap")[v.ConfigMap.Name] == nil {
			t.Errorf("%s: ConfigMap %s is not in the rendering", where, v.ConfigMap.Name)
		}
	}
	if w.kind == "StatefulSet" {
		for _, pvc := range r.all("StatefulSet")[w.name].(*appsv1.StatefulSet).Spec.VolumeClaimTemplates {
			volumes[pvc.Name] = true
		}
	}
	for _, c := range ps.Containers {
		where := where + " container " + c.Name
		sc := c.SecurityContext
		switch {
		case sc == nil:
			t.Errorf("%s: no securityContext", where)
		case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
			t.Errorf("%s: root filesystem must be read-only", where)
		case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			t.Errorf("%s: privilege escalation must be off", where)
		case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL"):
			t.Errorf("%s: must drop ALL capabilities", where)
		}
		for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, lim := c.Resources.Requests[res], c.Resources.Limits[res]
			if req.IsZero() || lim.IsZero() {
				t.Errorf("%s: %s request and limit are required", where, res)
			} else if req.Cmp(lim) > 0 {
				t.Errorf("%s: %s request %s exceeds limit %s", where, res, req.String(), lim.String())
			}
		}
		if c.LivenessProbe == nil || c.ReadinessProbe == nil {
			t.Errorf("%s: liveness and readiness probes are required", where)
		}
		for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
			if p != nil && (p.HTTPGet == nil || containerPort(c, p.HTTPGet.Port.String()) == 0) {
				t.Errorf("%s: probe %+v is not an HTTP GET on a declared port", where, p.ProbeHandler)
			}
		}
		for _, m := range c.VolumeMounts {
			if !volumes[m.Name] {
				t.Errorf("%s: mounts unknown volume %s", where, m.Name)
			}
		}
		name, ok := heraldImage(c.Image, images)
		switch {
		case ok:
		case strings.HasPrefix(c.Image, "otel/opentelemetry-collector-contrib:") && !strings.HasSuffix(c.Image, ":latest"):
		default:
			t.Errorf("%s: image %q is neither one `make images` builds nor the pinned OTel collector", where, c.Image)
		}
		if slices.Contains(heraldServices, name) {
			checkHeraldContainer(t, r, where, name, c)
		}
	}
}

// heraldImage returns the image's name (the last path element) when it is
// one `make images` builds: [registry/]<repo>/<name>:<tag>.
func heraldImage(image string, images map[string]bool) (string, bool) {
	ref, tag, ok := strings.Cut(image, ":")
	if !ok || tag == "" || tag == "latest" {
		return "", false
	}
	parts := strings.Split(ref, "/")
	if len(parts) < 2 {
		return "", false
	}
	repoName := parts[len(parts)-2] + "/" + parts[len(parts)-1]
	return parts[len(parts)-1], images[repoName]
}

// checkHeraldContainer checks a Herald service container against its
// binary: flags exist, listeners match ports, probes use the admin port,
// files lie on mounted volumes, peers are Services.
func checkHeraldContainer(t *testing.T, r *rendering, where, svc string, c corev1.Container) {
	t.Helper()
	known := binaryFlags(t)[svc]
	args := map[string]string{}
	for _, a := range c.Args {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !ok {
			t.Errorf("%s: argument %q is not --flag=value", where, a)
			continue
		}
		if !known[name] {
			t.Errorf("%s: the %s binary has no flag --%s", where, svc, name)
		}
		args[name] = value
	}
	godebug := ""
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "HERALD_") && !knownEnv(known, e.Name) {
			t.Errorf("%s: env %s names no flag of %s", where, e.Name, svc)
		}
		if e.Name == "GODEBUG" {
			godebug = e.Value
		}
	}
	// Started as integration/stack starts it (docs/operations.md, "The
	// runtime's sysmon").
	if godebug != service.SysmonAwake {
		t.Errorf("%s: GODEBUG %q, want %q (libs/service's SysmonAwake)", where, godebug, service.SysmonAwake)
	}
	for _, f := range addrFlags {
		v, ok := args[f]
		if !known[f] {
			continue
		}
		if !ok {
			t.Errorf("%s: --%s must be set (its default binds loopback only)", where, f)
			continue
		}
		_, port, err := net.SplitHostPort(v)
		if err != nil || containerPort(c, port) == 0 {
			t.Errorf("%s: --%s=%s binds a port the container does not declare", where, f, v)
		}
	}
	admin := containerPort(c, "admin")
	if _, p, _ := net.SplitHostPort(args["admin.addr"]); strconv.Itoa(int(admin)) != p {
		t.Errorf("%s: port \"admin\" is %d, --admin.addr is %q", where, admin, args["admin.addr"])
	}
	for name, want := range map[string]*corev1.Probe{"/livez": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if want == nil || want.HTTPGet == nil || want.HTTPGet.Path != name || containerPort(c, want.HTTPGet.Port.String()) != admin {
			t.Errorf("%s: probe must GET %s on the admin port", where, name)
		}
	}
	for f, v := range args {
		if !(strings.HasSuffix(f, "-file") || f == "encryption-config") || v == "" {
			continue
		}
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return strings.HasPrefix(v, m.MountPath+"/") }) {
			t.Errorf("%s: --%s=%s is not on a mounted volume", where, f, v)
		}
	}
	if v, ok := args["cache.shards"]; ok {
		m, err := kube.ParseShardMap(v, defaultRegistry(t))
		if err != nil {
			t.Errorf("%s: --cache.shards: %v", where, err)
		} else {
			for _, target := range m.Targets() {
				if _, err := r.shardService(target); err != nil {
					t.Errorf("%s: --cache.shards: %v", where, err)
				}
			}
		}
	}
	if clusterOverlays[r.overlay] {
		checkClusterEtcd(t, where, svc, args)
	}
	for _, f := range peerFlags {
		if v, ok := args[f]; ok {
			if f == "etcd.endpoints" && clusterOverlays[r.overlay] {
				continue // the cluster's etcd, outside the rendering (checkClusterEtcd)
			}
			for _, hp := range peerAddrs(v) {
				if err := r.servesPort(hp); err != nil {
					t.Errorf("%s: --%s: %v", where, f, err)
				}
			}
		}
	}
}

// checkClusterEtcd checks a service reading the cluster's etcd: https
// endpoints, a client certificate and etcd's CA (kube-apiserver's
// --etcd-certfile, --etcd-keyfile, --etcd-cafile), and for the caches the
// EncryptionConfiguration. That the files lie on mounted Secret volumes is
// checked with every other file flag.
func checkClusterEtcd(t *testing.T, where, svc string, args map[string]string) {
	t.Helper()
	v, ok := args["etcd.endpoints"]
	if !ok {
		return // the service does not read etcd
	}
	for _, e := range strings.Split(v, ",") {
		u, err := url.Parse(strings.TrimSpace(e))
		if err != nil || u.Scheme != "https" || u.Port() == "" {
			t.Errorf("%s: --etcd.endpoints %q: the cluster's etcd is reached as https://host:port", where, e)
		}
	}
	want := []string{"etcd.tls.ca-file", "etcd.tls.cert-file", "etcd.tls.key-file"}
	if svc == "cache" {
		want = append(want, "encryption-config")
	}
	for _, f := range want {
		if args[f] == "" {
			t.Errorf("%s: --%s must be set to read the cluster's etcd", where, f)
		}
	}
}

// knownEnv reports whether env is HERALD_<FLAG> of a known flag.
func knownEnv(known map[string]bool, env string) bool {
	for f := range known {
		if "HERALD_"+strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(f)) == env {
			return true
		}
	}
	return false
}

// peerAddrs splits a flag value into host:port pairs: comma-separated URLs,
// dns:///host:port targets or bare host:port.
func peerAddrs(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if rest, ok := strings.CutPrefix(s, "dns:///"); ok {
			out = append(out, rest)
			continue
		}
		if u, err := url.Parse(s); err == nil && u.Host != "" {
			out = append(out, u.Host)
			continue
		}
		out = append(out, s)
	}
	return out
}

// servesPort checks that host:port is a port of a Service of the rendering:
// "<service>:<port>" or "<statefulset>-<ordinal>.<headless service>:<port>".
func (r *rendering) servesPort(hostPort string) error {
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return fmt.Errorf("%q is not host:port", hostPort)
	}
	svcName := host
	if pod, svc, ok := strings.Cut(host, "."); ok {
		svcName = svc
		var found bool
		for _, w := range r.workloads() {
			if w.kind != "StatefulSet" || w.service != svc {
				continue
			}
			ord, ok := strings.CutPrefix(pod, w.name+"-")
			n, err := strconv.Atoi(ord)
			if ok && err == nil && n >= 0 && n < int(w.replicas) {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("%s is no pod of a StatefulSet governed by Service %s", pod, svc)
		}
	}
	o := r.all("Service")[svcName]
	if o == nil {
		return fmt.Errorf("no Service %s for %s", svcName, hostPort)
	}
	for _, p := range o.(*corev1.Service).Spec.Ports {
		if strconv.Itoa(int(p.Port)) == port {
			return nil
		}
	}
	return fmt.Errorf("Service %s has no port %s", svcName, port)
}

// containerPort resolves a port name or number to a declared containerPort
// (0 if the container declares none such).
func containerPort(c corev1.Container, nameOrNumber string) int32 {
	for _, p := range c.Ports {
		if p.Name == nameOrNumber || strconv.Itoa(int(p.ContainerPort)) == nameOrNumber {
			return p.ContainerPort
		}
	}
	return 0
}

func TestServicesReachTheirPods(t *testing.T) {
	for _, o := range overlays {
		t.Run(o, func(t *testing.T) {
			r := render(t, o)
			for name, obj := range r.all("Service") {
				s := obj.(*corev1.Service)
				ws := r.selected(labels.SelectorFromSet(s.Spec.Selector))
				if len(ws) != 1 {
					t.Errorf("Service %s selects %d workloads, want 1", name, len(ws))
					continue
				}
				for _, p := range s.Spec.Ports {
					if !slices.ContainsFunc(ws[0].pod.Containers, func(c corev1.Container) bool { return containerPort(c, p.TargetPort.String()) != 0 }) {
						t.Errorf("Service %s port %s: targetPort %s is not a port of %s", name, p.Name, p.TargetPort.String(), ws[0].name)
					}
				}
			}
			for name, obj := range r.all("PodDisruptionBudget") {
				if ws := r.selected(mustSelector(t, obj.(*policyv1.PodDisruptionBudget).Spec.Selector)); len(ws) != 1 {
					t.Errorf("PodDisruptionBudget %s selects %d workloads, want 1", name, len(ws))
				}
			}
			for name, obj := range r.all("HorizontalPodAutoscaler") {
				ref := obj.(*autoscalingv2.HorizontalPodAutoscaler).Spec.ScaleTargetRef
				if r.all(ref.Kind)[ref.Name] == nil {
					t.Errorf("HorizontalPodAutoscaler %s scales %s %s, which is not in the rendering", name, ref.Kind, ref.Name)
				}
			}
			for name, obj := range r.all("NetworkPolicy") {
				np := obj.(*networkingv1.NetworkPolicy)
				ws := r.selected(mustSelector(t, &np.Spec.PodSelector))
				for _, rule := range np.Spec.Ingress {
					for _, p := range rule.Ports {
						if !slices.ContainsFunc(ws, func(w workload) bool {
							return slices.ContainsFunc(w.pod.Containers, func(c corev1.Container) bool { return containerPort(c, p.Port.String()) != 0 })
						}) {
							t.Errorf("NetworkPolicy %s opens port %s, which no selected pod declares", name, p.Port.String())
						}
					}
				}
			}
		})
	}
}

func mustSelector(t *testing.T, s *metav1.LabelSelector) labels.Selector {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

func (r *rendering) selected(sel labels.Selector) []workload {
	var out []workload
	for _, w := range r.workloads() {
		if sel.Matches(labels.Set(w.labels)) {
			out = append(out, w)
		}
	}
	return out
}

var (
	renderMu sync.Mutex
	rendered = map[string]*rendering{}
)

// render runs `kubectl kustomize` on an overlay and decodes every object
// strictly: unknown fields, duplicate keys and unexpected kinds fail.
func render(t *testing.T, overlay string) *rendering {
	t.Helper()
	renderMu.Lock()
	defer renderMu.Unlock()
	if r := rendered[overlay]; r != nil {
		return r
	}
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("kubectl (with kustomize) is required in CI")
		}
		t.Skip("kubectl not found: cannot render the overlays")
	}
	dir := filepath.Join(repoRoot(t), "deploy", "k8s", "overlays", overlay)
	var stderr bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr.String())
	}
	r, err := decode(overlay, out)
	if err != nil {
		t.Fatalf("overlay %s: %v", overlay, err)
	}
	rendered[overlay] = r
	return r
}

func decode(overlay string, stream []byte) (*rendering, error) {
	r := &rendering{overlay: overlay, byKind: map[string]map[string]any{}}
	rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	for {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			return r, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, err
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(js, &tm); err != nil {
			return nil, err
		}
		obj, err := newObject(tm.APIVersion, tm.Kind)
		if err != nil {
			return nil, err
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(obj); err != nil {
			return nil, fmt.Errorf("%s: %w", tm.Kind, err)
		}
		name := obj.(metav1.Object).GetName()
		if r.byKind[tm.Kind] == nil {
			r.byKind[tm.Kind] = map[string]any{}
		}
		if r.byKind[tm.Kind][name] != nil {
			return nil, fmt.Errorf("%s %s appears twice", tm.Kind, name)
		}
		r.byKind[tm.Kind][name] = obj
	}
}

var (
	flagsOnce sync.Once
	flagsBy   map[string]map[string]bool
	flagsErr  error
)

// binaryFlags builds every Herald service and reads its flags from -h.
func binaryFlags(t *testing.T) map[string]map[string]bool {
	t.Helper()
	flagsOnce.Do(func() { flagsBy, flagsErr = readFlags(repoRoot(t)) })
	if flagsErr != nil {
		t.Fatal(flagsErr)
	}
	return flagsBy
}

var usageLine = regexp.MustCompile(`(?m)^  -([a-z0-9][a-z0-9.\-]*)`)

func readFlags(root string) (map[string]map[string]bool, error) {
	dir, err := os.MkdirTemp("", "herald-manifest-bin")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, s := range heraldServices {
		args = append(args, "./services/"+s+"/cmd/"+s)
	}
	build := exec.Command("go", args...)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %v\n%s", err, out)
	}
	out := map[string]map[string]bool{}
	for _, s := range heraldServices {
		var usage bytes.Buffer
		cmd := exec.Command(filepath.Join(dir, s), "-h")
		cmd.Stdout, cmd.Stderr = &usage, &usage
		cmd.Run() // -h exits non-zero; the usage is what matters
		out[s] = map[string]bool{}
		for _, m := range usageLine.FindAllStringSubmatch(usage.String(), -1) {
			out[s][m[1]] = true
		}
		if !out[s]["admin.addr"] {
			return nil, fmt.Errorf("%s -h lists no --admin.addr:\n%s", s, usage.String())
		}
	}
	return out, nil
}

// makeImages reads the image names `make images` builds from the Makefile
// (IMAGE_REPO and IMAGES, which may name $(SERVICES)).
func makeImages(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		for _, op := range []string{":=", "?="} {
			if k, v, ok := strings.Cut(line, op); ok && !strings.ContainsAny(strings.TrimSpace(k), " \t:") {
				vars[strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
		}
	}
	repo, list := vars["IMAGE_REPO"], strings.ReplaceAll(vars["IMAGES"], "$(SERVICES)", vars["SERVICES"])
	if repo == "" || list == "" {
		t.Fatal("Makefile: IMAGE_REPO or IMAGES not found")
	}
	out := map[string]bool{}
	for _, name := range strings.Fields(list) {
		out[repo+"/"+name] = true
	}
	for _, s := range heraldServices {
		if !out[repo+"/"+s] {
			t.Fatalf("make images does not build %s", s)
		}
	}
	return out
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.work not found above the working directory")
		}
		dir = parent
	}
}

// TestCacheShards checks the cache layout against the shard map fanout and
// frontdoor read: both read the same map; each target is dns:///<headless
// Service>:<port> selecting one cache StatefulSet; and for every resource and
// namespace partition, the caches owning it (by their --shard.resources and
// --shard.partitions) are exactly the one shard the map routes it to. A
// partition no cache owns would be missing from LISTs and watches; one owned
// by a shard the map does not route it to would be served twice, since
// merged LISTs and watches do not filter a shard's answers by partition.
func TestCacheShards(t *testing.T) {
	images := makeImages(t)
	reg := defaultRegistry(t)
	for _, o := range overlays {
		t.Run(o, func(t *testing.T) {
			r := render(t, o)
			maps := map[string]string{} // workload -> --cache.shards
			owns := map[string]func(res *kube.Resource, p int) bool{}
			for _, w := range r.workloads() {
				for _, c := range w.pod.Containers {
					name, _ := heraldImage(c.Image, images)
					args := argMap(c)
					if args["resources-file"] != "" {
						t.Errorf("%s %s: --resources-file is set; this test checks the shard map against the built-in registry only", w.kind, w.name)
					}
					switch name {
					case "fanout", "frontdoor":
						if args["cache.addr"] != "" {
							t.Errorf("%s %s: --cache.addr is set; --cache.shards names the caches", w.kind, w.name)
						}
						maps[w.name] = args["cache.shards"]
					case "cache":
						if w.kind != "StatefulSet" {
							t.Errorf("%s %s: a cache shard must be a StatefulSet", w.kind, w.name)
						}
						owns[w.name] = cacheOwnership(t, w.name, args)
						if args["shard.target"] != "" {
							maps[w.name] = args["cache.shards"]
						}
					}
				}
			}
			if len(maps) < 2 || maps["herald-fanout"] == "" || maps["herald-frontdoor"] == "" || len(owns) < 2 {
				t.Fatalf("want fanout and frontdoor reading a shard map and at least 2 cache shards; got maps %v, caches %d", maps, len(owns))
			}
			var text string
			for w, m := range maps {
				if m == "" {
					t.Fatalf("%s has no --cache.shards", w)
				}
				if text != "" && m != text {
					t.Fatalf("fanout, frontdoor and the caches read different shard maps:\n%q\n%q", text, m)
				}
				text = m
			}
			m, err := kube.ParseShardMap(text, reg)
			if err != nil {
				t.Fatalf("--cache.shards: %v", err)
			}
			routed := map[string]bool{}
			for _, res := range reg.Resources() {
				parts := []int{kube.Partition("")} // where cluster-scoped objects live
				if res.Namespaced {
					parts = nil
					for p := range kube.Partitions {
						parts = append(parts, p)
					}
				}
				for _, sh := range m.All(res) {
					sts, err := r.shardService(sh.Target)
					if err != nil {
						t.Errorf("%s: %v", res.ID(), err)
						continue
					}
					routed[sts] = true
					for _, p := range parts {
						if sh.Partitions != nil && !slices.Contains(sh.Partitions, p) {
							continue
						}
						var owners []string
						for name, own := range owns {
							if own(res, p) {
								owners = append(owners, name)
							}
						}
						slices.Sort(owners)
						if !slices.Equal(owners, []string{sts}) {
							t.Errorf("%s partition %d: routed to %s (%s), owned by %v", res.ID(), p, sts, sh.Target, owners)
						}
					}
				}
			}
			for name := range owns {
				if !routed[name] {
					t.Errorf("cache StatefulSet %s serves nothing the shard map routes to it", name)
				}
			}
		})
	}
}

// shardService resolves a shard map target, dns:///<service>:<port>, to the
// cache StatefulSet behind it: the Service must exist with that port, be
// headless (every replica's address, for round robin) and select exactly one
// StatefulSet, governed by it.
func (r *rendering) shardService(target string) (string, error) {
	hostPort, ok := strings.CutPrefix(target, "dns:///")
	if !ok {
		return "", fmt.Errorf("shard target %q: want dns:///<headless Service>:<port>", target)
	}
	if err := r.servesPort(hostPort); err != nil {
		return "", fmt.Errorf("shard target %q: %v", target, err)
	}
	host, _, _ := net.SplitHostPort(hostPort)
	svc := r.all("Service")[host].(*corev1.Service)
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		return "", fmt.Errorf("shard target %q: Service %s is not headless", target, host)
	}
	ws := r.selected(labels.SelectorFromSet(svc.Spec.Selector))
	if len(ws) != 1 || ws[0].kind != "StatefulSet" || ws[0].service != host {
		return "", fmt.Errorf("shard target %q: Service %s must select exactly one StatefulSet it governs", target, host)
	}
	return ws[0].name, nil
}

// cacheOwnership is what a cache owns: what its --cache.shards routes to its
// --shard.target, or what its --shard.resources and --shard.partitions name
// (empty: every resource, every partition).
func cacheOwnership(t *testing.T, where string, args map[string]string) func(*kube.Resource, int) bool {
	t.Helper()
	reg := defaultRegistry(t)
	if target := args["shard.target"]; target != "" {
		if args["shard.resources"] != "" || args["shard.partitions"] != "" {
			t.Errorf("%s: --shard.target replaces --shard.resources and --shard.partitions", where)
		}
		m, err := kube.ParseShardMap(args["cache.shards"], reg)
		if err != nil {
			t.Errorf("%s: --cache.shards: %v", where, err)
			return func(*kube.Resource, int) bool { return false }
		}
		return func(res *kube.Resource, p int) bool {
			return slices.ContainsFunc(m.All(res), func(sh kube.Shard) bool {
				return sh.Target == target && (sh.Partitions == nil || slices.Contains(sh.Partitions, p))
			})
		}
	}
	resources := map[string]bool{}
	for _, id := range strings.Split(args["shard.resources"], ",") {
		if id = strings.TrimSpace(id); id != "" {
			if _, ok := reg.ByID(id); !ok {
				t.Errorf("%s: --shard.resources names unknown resource %q", where, id)
			}
			resources[id] = true
		}
	}
	var parts []bool
	if v := strings.TrimSpace(args["shard.partitions"]); v != "" {
		var err error
		if parts, err = kube.ParsePartitions(v); err != nil {
			t.Errorf("%s: --shard.partitions: %v", where, err)
		}
	}
	return func(res *kube.Resource, p int) bool {
		return (len(resources) == 0 || resources[res.ID()]) && (parts == nil || parts[p])
	}
}

// argMap is a container's --flag=value arguments by flag.
func argMap(c corev1.Container) map[string]string {
	out := map[string]string{}
	for _, a := range c.Args {
		if name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok {
			out[name] = value
		}
	}
	return out
}

// defaultRegistry is the built-in resource registry the services load (the
// manifests pass no --resources-file).
func defaultRegistry(t *testing.T) *kube.Registry {
	t.Helper()
	reg, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestFanoutServiceIsHeadless: frontdoor routes each watch to the least
// loaded fanout replica and retries another when one fails, which needs
// every replica's address: each name in --fanout.addrs must be a headless
// Service (one virtual IP would hide the replicas behind one address, so
// load and failures could not be told apart) selecting the fanout pods.
func TestFanoutServiceIsHeadless(t *testing.T) {
	images := makeImages(t)
	for _, o := range overlays {
		t.Run(o, func(t *testing.T) {
			r := render(t, o)
			seen := 0
			for _, w := range r.workloads() {
				for _, c := range w.pod.Containers {
					if name, _ := heraldImage(c.Image, images); name != "frontdoor" {
						continue
					}
					for _, a := range strings.Split(argMap(c)["fanout.addrs"], ",") {
						u, err := url.Parse(strings.TrimSpace(a))
						if err != nil || u.Port() == "" {
							t.Errorf("%s %s: --fanout.addrs %q: want scheme://<Service>:<port>", w.kind, w.name, a)
							continue
						}
						if net.ParseIP(u.Hostname()) != nil {
							continue // a fixed address needs no resolving
						}
						seen++
						if err := r.servesPort(u.Host); err != nil {
							t.Errorf("%s %s: --fanout.addrs %q: %v", w.kind, w.name, a, err)
							continue
						}
						svc, _ := r.all("Service")[u.Hostname()].(*corev1.Service)
						if svc == nil || svc.Spec.ClusterIP != corev1.ClusterIPNone {
							t.Errorf("%s %s: --fanout.addrs %q: Service %s is not headless (clusterIP: None)", w.kind, w.name, a, u.Hostname())
							continue
						}
						ws := r.selected(labels.SelectorFromSet(svc.Spec.Selector))
						if len(ws) != 1 || !runsImage(ws[0], images, "fanout") {
							t.Errorf("%s %s: Service %s must select exactly the fanout workload; selects %d", w.kind, w.name, u.Hostname(), len(ws))
						}
					}
				}
			}
			if seen == 0 {
				t.Fatal("no frontdoor names its fanout replicas by Service")
			}
		})
	}
}

// runsImage reports whether w runs the Herald image name.
func runsImage(w workload, images map[string]bool, name string) bool {
	for _, c := range w.pod.Containers {
		if n, _ := heraldImage(c.Image, images); n == name {
			return true
		}
	}
	return false
}
