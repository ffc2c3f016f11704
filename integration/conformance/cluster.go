package conformance

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"herald.dev/integration/stack"
)

// Controllers are the kube-controller-manager controllers the cluster runs:
// the e2e framework waits in every test namespace for the "default"
// ServiceAccount (serviceaccount) and the kube-root-ca.crt ConfigMap
// (root-ca-certificate-publisher); namespace deletion, the garbage
// collector and quota are what the Namespaces, Garbage collector and
// ResourceQuota tests test; service-account tokens are what
// kube-controller-manager's token controller maintains; the wide suite's
// ValidatingAdmissionPolicy tests wait, without a timeout of their own, for
// the status controller to type-check their policies, and their quota tests
// for a deleted PersistentVolumeClaim to go, which takes the protection
// controller's removal of its finalizer, or for a claim to bind to the
// PersistentVolume they made for it (the binder). The replication,
// replicaset and deployment controllers make the dependents of the garbage
// collector's tests: their pods stay Pending (no scheduler, no kubelet),
// which is all those tests need.
var Controllers = []string{
	"namespace-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
	"root-ca-certificate-publisher-controller",
	"garbage-collector-controller",
	"resourcequota-controller",
	"validatingadmissionpolicy-status-controller",
	"persistentvolumeclaim-protection-controller",
	"persistentvolume-binder-controller",
	"replicationcontroller-controller",
	"replicaset-controller",
	"deployment-controller",
}

// quotaSyncPeriod is kube-controller-manager's --resource-quota-sync-period
// (5 minutes by default): the ResourceQuota status test waits for a full
// resync to reset a status it patched (issues.k8s.io/121911), 195 s of the
// baseline's 11 minutes at the default.
const quotaSyncPeriod = 30 * time.Second

// NodeName is the cluster's one Node: an object marked Ready, without
// taints, that no kubelet serves.
const NodeName = "conformance-node-0"

// ClusterOptions say what the cluster runs.
type ClusterOptions struct {
	// Dir holds every component's state, configuration and log.
	Dir string
	// KubeAPIServer and KubeControllerManager are the binaries;
	// HeraldBinDir holds Herald's services (stack.Build).
	KubeAPIServer, KubeControllerManager, HeraldBinDir string
	// Kubectl applies Herald's ClusterRole (deploy/k8s/overlays/cluster).
	Kubectl string
	// CompactionInterval is kube-apiserver's --etcd-compaction-interval.
	CompactionInterval time.Duration
}

// Cluster is the running cluster with Herald in front of it.
type Cluster struct {
	// Kubeconfig reaches kube-apiserver directly and HeraldKubeconfig
	// reaches Herald's frontdoor, both as the cluster's admin (a static
	// token of group system:masters).
	Kubeconfig, HeraldKubeconfig string
	KubeAPIServerURL, HeraldURL  string

	etcd   *embed.Etcd
	kas    *stack.KubeAPIServer
	kcm    *process
	herald *stack.Stack
}

// Identities in kube-apiserver's token file.
const (
	adminUser  = "conformance-admin" // group system:masters
	heraldUser = "herald"            // Herald's own, bound to deploy/k8s/overlays/cluster's ClusterRole
)

// StartCluster starts etcd, kube-apiserver, kube-controller-manager, the
// Node, and Herald in cluster mode, in that order, and returns once each
// is ready. On error everything started is stopped.
func StartCluster(ctx context.Context, o ClusterOptions) (_ *Cluster, err error) {
	c := &Cluster{}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	heraldDir := filepath.Join(o.Dir, "herald")
	// One CA for the whole cluster: Herald's stack reuses the PKI it finds
	// in its directory; kube-apiserver serves with the same certificate
	// (valid for 127.0.0.1) and signs service-account tokens with its key.
	pki, err := stack.EnsurePKI(filepath.Join(heraldDir, "pki"))
	if err != nil {
		return nil, err
	}
	// etcd: data in Dir/etcd, log in Dir/etcd.log.
	var etcdURL string
	if c.etcd, etcdURL, err = stack.StartEtcd(o.Dir, "", nil); err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	enc := filepath.Join(o.Dir, "encryption.yaml")
	if err := writeEncryptionConfig(enc); err != nil {
		return nil, err
	}
	adminToken, heraldToken := randomToken(), randomToken()
	tokens := filepath.Join(o.Dir, "tokens.csv")
	if err := os.WriteFile(tokens, fmt.Appendf(nil, "%s,%s,%s-uid,\"system:masters\"\n%s,%s,%s-uid\n",
		adminToken, adminUser, adminUser, heraldToken, heraldUser, heraldUser), 0o600); err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pki.CAPEM)
	c.kas, err = stack.StartKubeAPIServer(ctx, stack.KubeAPIServerOptions{
		Bin: o.KubeAPIServer, Dir: filepath.Join(o.Dir, "kube-apiserver"), Etcd: etcdURL,
		CertFile: pki.CertFile, KeyFile: pki.KeyFile, TokenFile: tokens, AdminToken: adminToken,
		EncryptionConfig: enc, Authorization: "Node,RBAC",
		Client: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 5 * time.Second},
		Args: []string{"--client-ca-file=" + pki.CAFile, fmt.Sprintf("--etcd-compaction-interval=%s", o.CompactionInterval),
			// As every production cluster with the Node authorizer has it
			// (kubeadm's default): the wide suite's NodeAuthorizer tests
			// check that a node cannot create or delete another.
			"--enable-admission-plugins=NodeRestriction"},
	})
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver: %w", err)
	}
	c.KubeAPIServerURL = c.kas.URL
	c.Kubeconfig = filepath.Join(o.Dir, "kube-apiserver.kubeconfig")
	heraldUpstream := filepath.Join(o.Dir, "herald-upstream.kubeconfig")
	if err := errors.Join(
		writeKubeconfig(c.Kubeconfig, c.kas.URL, pki.CAFile, adminUser, adminToken),
		writeKubeconfig(heraldUpstream, c.kas.URL, pki.CAFile, heraldUser, heraldToken),
	); err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if err := grantHerald(ctx, o.Kubectl, c.Kubeconfig, client); err != nil {
		return nil, fmt.Errorf("herald's access to the cluster: %w", err)
	}
	c.kcm, err = startProcess(filepath.Join(o.Dir, "kube-controller-manager.log"), o.KubeControllerManager,
		"--kubeconfig="+c.Kubeconfig,
		"--controllers="+strings.Join(Controllers, ","),
		"--leader-elect=false",
		"--secure-port=0", // serves nothing: no fixed port shared with other runs on the machine
		"--use-service-account-credentials=false",
		"--service-account-private-key-file="+pki.KeyFile,
		"--root-ca-file="+pki.CAFile,
		"--resource-quota-sync-period="+quotaSyncPeriod.String(),
		"--v=1",
	)
	if err != nil {
		return nil, fmt.Errorf("kube-controller-manager: %w", err)
	}
	if err := createReadyNode(ctx, client); err != nil {
		return nil, fmt.Errorf("node %s: %w", NodeName, err)
	}
	if err := waitControllers(ctx, client, c.kcm); err != nil {
		return nil, err
	}
	c.herald, err = stack.Start(ctx, stack.Options{
		Dir: heraldDir, BinDir: o.HeraldBinDir,
		Cluster: stack.ClusterEtcd{Endpoints: etcdURL, EncryptionConfig: enc},
		Upstream: stack.Upstream{
			Kubeconfig:     heraldUpstream,
			UserKubeconfig: c.Kubeconfig,
			ClientCAFile:   pki.CAFile,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("herald: %w (logs in %s)", err, filepath.Join(heraldDir, "logs"))
	}
	c.HeraldURL, c.HeraldKubeconfig = c.herald.FrontdoorURL, c.herald.Kubeconfig
	return c, nil
}

// Stop stops Herald, kube-controller-manager, kube-apiserver and etcd.
func (c *Cluster) Stop() {
	if c.herald != nil {
		c.herald.Stop()
	}
	if c.kcm != nil {
		c.kcm.stop()
	}
	if c.kas != nil {
		c.kas.Stop()
	}
	if c.etcd != nil {
		c.etcd.Close()
	}
}

// grantHerald applies Herald's ClusterRole from deploy/k8s/overlays/cluster,
// as an operator does, and binds it to Herald's user.
func grantHerald(ctx context.Context, kubectl, kubeconfig string, client kubernetes.Interface) error {
	root, err := stack.RepoRoot()
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", kubeconfig, "apply", "-f",
		filepath.Join(root, "deploy/k8s/overlays/cluster/upstream-rbac.yaml")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl apply: %w\n%s", err, out)
	}
	_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "herald-conformance-upstream"}, // the file binds a ServiceAccount
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "herald-upstream"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: heraldUser}},
	}, metav1.CreateOptions{})
	return err
}

// createReadyNode creates the one Node, marks it Ready and untainted: the
// framework waits for schedulable nodes before any test, and no kubelet
// reports one.
// Nothing updates it afterwards (no node lifecycle controller runs), so it
// stays Ready.
func createReadyNode(ctx context.Context, client kubernetes.Interface) error {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16Gi"),
		corev1.ResourcePods: resource.MustParse("110"),
	}
	n, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: NodeName, Labels: map[string]string{corev1.LabelHostname: NodeName, corev1.LabelOSStable: "linux"}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	now := metav1.Now()
	n.Status = corev1.NodeStatus{
		Capacity: capacity, Allocatable: capacity,
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "no kubelet: marked Ready by the conformance harness", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: NodeName}},
	}
	if n, err = client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		return err
	}
	// kube-apiserver's TaintNodesByCondition admission gave the new node
	// the not-ready taint, which only the node lifecycle controller (not
	// run) removes: the framework's serial tests refuse a tainted node.
	n.Spec.Taints = nil
	_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	return err
}

// waitControllers waits until kube-controller-manager has done in the
// "default" namespace what the framework waits for in every test namespace:
// its ServiceAccount and the root CA ConfigMap exist.
func waitControllers(ctx context.Context, client kubernetes.Interface, kcm *process) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for {
		_, saErr := client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		_, cmErr := client.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		if saErr == nil && cmErr == nil {
			return nil
		}
		select {
		case <-kcm.exited:
			return fmt.Errorf("kube-controller-manager exited (see %s)", kcm.log.Name())
		case <-ctx.Done():
			return fmt.Errorf("kube-controller-manager made no default ServiceAccount and kube-root-ca.crt in namespace default (%v; %v; see %s)", saErr, cmErr, kcm.log.Name())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// process is a child process with its output in a log file; it dies with
// this process.
type process struct {
	cmd    *exec.Cmd
	log    *os.File
	exited chan struct{}
}

func startProcess(logPath, bin string, args ...string) (*process, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	p := &process{cmd: cmd, log: log, exited: make(chan struct{})}
	go func() { cmd.Wait(); close(p.exited) }()
	return p, nil
}

// stop sends SIGTERM and kills the process after 20 s.
func (p *process) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
	p.log.Close()
}

func writeKubeconfig(path, server, caFile, user, token string) error {
	return os.WriteFile(path, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: cluster
  cluster: {server: %q, certificate-authority: %q}
users:
- name: %s
  user: {token: %q}
contexts:
- name: cluster
  context: {cluster: cluster, user: %s}
current-context: cluster
`, server, caFile, user, token, user), 0o600)
}

// writeEncryptionConfig encrypts Secrets with aescbc (a fresh key per run),
// as kube-apiserver and Herald's caches both read it.
func writeEncryptionConfig(path string) error {
	key := make([]byte, 32)
	rand.Read(key)
	return os.WriteFile(path, fmt.Appendf(nil, `apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: [secrets]
  providers:
  - aescbc:
      keys:
      - name: key1
        secret: %s
  - identity: {}
`, base64.StdEncoding.EncodeToString(key)), 0o600)
}

func randomToken() string {
	b := make([]byte, 24)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
