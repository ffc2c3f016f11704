package loadgen

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// KubeAPIServer is a kube-apiserver process started as the baseline.
type KubeAPIServer struct {
	URL    string
	cmd    *exec.Cmd
	out    *os.File
	exited chan struct{}
}

// StartKubeAPIServer starts bin (an unmodified kube-apiserver) against etcd
// with JSON storage, serving on 127.0.0.1 with certFile/keyFile (also its
// service-account key), static tokens from tokenFile and no authorization
// checks (the load client is an admin; Herald's frontdoor runs its users in
// system:masters too). Its log goes to dir/kube-apiserver.log. It returns
// once /readyz answers 200 with adminToken.
func StartKubeAPIServer(ctx context.Context, bin, dir, etcd, certFile, keyFile, tokenFile, adminToken string, c *http.Client) (*KubeAPIServer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	addr := freeAddr()
	_, port, _ := net.SplitHostPort(addr)
	out, err := os.Create(filepath.Join(dir, "kube-apiserver.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin,
		"--etcd-servers="+etcd,
		"--storage-media-type=application/json",
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+port,
		"--tls-cert-file="+certFile, "--tls-private-key-file="+keyFile, "--cert-dir="+filepath.Join(dir, "certs"),
		"--token-auth-file="+tokenFile, "--anonymous-auth=false",
		"--authorization-mode=AlwaysAllow",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+keyFile, "--service-account-signing-key-file="+keyFile,
		"--service-cluster-ip-range=10.96.0.0/16",
		// Nothing here reconciles the "kubernetes" Service's endpoints to a
		// reachable address; the bench needs only pods.
		"--endpoint-reconciler-type=none",
		"--v=0",
	)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, err
	}
	exited := make(chan struct{})
	k := &KubeAPIServer{URL: "https://" + addr, cmd: cmd, out: out, exited: exited}
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if _, err := Get(ctx, c, k.URL+"/readyz", adminToken); err == nil {
			return k, nil
		}
		select {
		case <-exited:
			out.Close()
			return nil, fmt.Errorf("kube-apiserver exited before becoming ready (see %s)", out.Name())
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			k.Stop()
			return nil, fmt.Errorf("kube-apiserver not ready after 3m (see %s)", out.Name())
		}
	}
}

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
