package stack

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// KubeAPIServerEnv names a prebuilt kube-apiserver binary to use instead of
// building one (e.g. the one `make bench` leaves in .herald/bin).
const KubeAPIServerEnv = "HERALD_KUBE_APISERVER"

// kubeAPIServerModule is the module, relative to the repository root, that
// builds an unmodified kube-apiserver v1.37.2 (outside go.work).
const kubeAPIServerModule = "integration/bench/kubeapiserver"

// KubeAPIServerBinary returns the path of a kube-apiserver built from
// integration/bench/kubeapiserver, stamped with KubeVersion, building it once
// per version of that module (keyed by the hash of its go.mod, go.sum and
// main.go, the build flags and the Go version) into the user's cache
// directory (see moduleBuild). The first build compiles k8s.io/kubernetes
// and takes minutes; progress lines go to log. KubeAPIServerEnv overrides
// all of this with a prebuilt binary.
func KubeAPIServerBinary(log io.Writer) (string, error) {
	if bin := os.Getenv(KubeAPIServerEnv); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			return "", fmt.Errorf("%s: %w", KubeAPIServerEnv, err)
		}
		return bin, nil
	}
	dir, err := moduleBuild{
		name: "kube-apiserver", module: kubeAPIServerModule, files: []string{"go.mod", "go.sum", "main.go"},
		steps: []buildStep{{bin: "kube-apiserver", args: []string{"build", "-ldflags", kubeVersionLDFlags(), "-o", "{out}", "."}}},
	}.build(log)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "kube-apiserver"), nil
}

// KubeAPIServerOptions say how to run kube-apiserver.
type KubeAPIServerOptions struct {
	// Bin is the kube-apiserver binary (see KubeAPIServerBinary).
	Bin string
	// Dir holds its log (kube-apiserver.log) and generated certificates.
	Dir string
	// Etcd is the etcd client URL it stores into, under /registry.
	Etcd string
	// CertFile and KeyFile: its serving certificate (valid for 127.0.0.1),
	// the key also signing and verifying service-account tokens.
	CertFile, KeyFile string
	// TokenFile: static bearer tokens (kube-apiserver's --token-auth-file
	// format, as the stack writes it); AdminToken is one of them, used to
	// wait for /readyz.
	TokenFile, AdminToken string
	// StorageMediaType: empty for kube-apiserver's default (protobuf).
	StorageMediaType string
	// EncryptionConfig: an EncryptionConfiguration file, or empty.
	EncryptionConfig string
	// Authorization: --authorization-mode, default AlwaysAllow.
	Authorization string
	// Client talks to it (must trust CertFile's CA).
	Client *http.Client
	// Start, if set, runs start, which starts the process (the load
	// benchmark starts it on the servers' CPUs, CPUPlan.StartServer).
	Start func(start func() error) error
	// Args are more flags, after the ones StartKubeAPIServer sets.
	Args []string
	// NoSysmonAwake runs it with the Go runtime's default sysmon instead
	// of the setting Herald's processes get (SysmonEnv).
	NoSysmonAwake bool
}

// KubeAPIServer is a running kube-apiserver process.
type KubeAPIServer struct {
	URL    string
	cmd    *exec.Cmd
	out    *os.File
	exited chan struct{}
}

// StartKubeAPIServer starts an unmodified kube-apiserver on 127.0.0.1 and
// returns once its /readyz answers 200. Anonymous requests are refused.
// Nothing reconciles the "kubernetes" Service's endpoints (no reachable
// address to publish) and no controllers run: objects are stored exactly as
// their creators wrote them.
func StartKubeAPIServer(ctx context.Context, o KubeAPIServerOptions) (*KubeAPIServer, error) {
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	if o.Authorization == "" {
		o.Authorization = "AlwaysAllow"
	}
	addr := freeAddr()
	_, port, _ := net.SplitHostPort(addr)
	out, err := os.Create(filepath.Join(o.Dir, "kube-apiserver.log"))
	if err != nil {
		return nil, err
	}
	args := []string{
		"--etcd-servers=" + o.Etcd,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + port,
		"--tls-cert-file=" + o.CertFile, "--tls-private-key-file=" + o.KeyFile, "--cert-dir=" + filepath.Join(o.Dir, "certs"),
		"--token-auth-file=" + o.TokenFile, "--anonymous-auth=false",
		"--authorization-mode=" + o.Authorization,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + o.KeyFile, "--service-account-signing-key-file=" + o.KeyFile,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--endpoint-reconciler-type=none",
		"--v=0",
	}
	if o.StorageMediaType != "" {
		args = append(args, "--storage-media-type="+o.StorageMediaType)
	}
	if o.EncryptionConfig != "" {
		args = append(args, "--encryption-provider-config="+o.EncryptionConfig)
	}
	args = append(args, o.Args...)
	cmd := exec.Command(o.Bin, args...)
	// The runtime setting Herald's own processes get (Proc.Start), so that
	// a side by side gives both the same: kube-apiserver is a Go process
	// woken for every event too.
	cmd.Env = SysmonEnv(os.Environ(), !o.NoSysmonAwake)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := cmd.Start
	if o.Start != nil {
		start = func() error { return o.Start(cmd.Start) }
	}
	if err := start(); err != nil {
		out.Close()
		return nil, err
	}
	exited := make(chan struct{})
	k := &KubeAPIServer{URL: "https://" + addr, cmd: cmd, out: out, exited: exited}
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if k.ready(ctx, o.Client, o.AdminToken) {
			return k, nil
		}
		select {
		case <-exited:
			out.Close()
			return nil, fmt.Errorf("kube-apiserver exited before becoming ready (see %s)", out.Name())
		case <-ctx.Done():
			k.Stop()
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			k.Stop()
			return nil, fmt.Errorf("kube-apiserver not ready after 3m (see %s)", out.Name())
		}
	}
}

func (k *KubeAPIServer) ready(ctx context.Context, c *http.Client, token string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.URL+"/readyz", nil)
	if err != nil {
		return false
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Log is the path of its log file.
func (k *KubeAPIServer) Log() string { return k.out.Name() }

// Pid of the kube-apiserver process.
func (k *KubeAPIServer) Pid() int { return k.cmd.Process.Pid }

// Stop sends SIGTERM and kills it after 20 s.
func (k *KubeAPIServer) Stop() {
	k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.exited:
	case <-time.After(20 * time.Second):
		k.cmd.Process.Kill()
		<-k.exited
	}
	k.out.Close()
}
