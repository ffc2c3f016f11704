// Command herald-dev runs the whole Herald stack locally (`make run`):
// embedded etcd on 127.0.0.1:2379, embedded NATS JetStream on
// 127.0.0.1:4222, and every service as its own process, frontdoor on
// https://127.0.0.1:6443. State lives in --dir and survives a restart.
//
// Cluster mode: with HERALD_ETCD=<endpoints> no etcd is started and Herald
// reads an existing cluster's etcd (client TLS from HERALD_ETCD_CA,
// HERALD_ETCD_CERT and HERALD_ETCD_KEY), decrypting with the cluster's
// EncryptionConfiguration from HERALD_ENCRYPTION_CONFIG.
//
// HERALD_UPSTREAM=<kubeconfig> puts frontdoor in front of that cluster's
// kube-apiserver (cluster mode): everything it does not serve from the
// cache goes there as the caller, and callers are authenticated and
// authorized by the cluster. The kubeconfig's credentials are Herald's own
// (they need the ClusterRole of deploy/k8s/overlays/cluster). Frontdoor then
// knows no token of its own: <dir>/kubeconfig uses the current user of
// HERALD_UPSTREAM_USER=<kubeconfig> (default: HERALD_UPSTREAM's), a user of
// the cluster, with Herald's address; HERALD_UPSTREAM_CLIENT_CA=<file> (the
// cluster's client CA) lets client certificates authenticate too.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"herald.dev/integration/stack"
)

func main() {
	dir := flag.String("dir", ".herald", "State directory.")
	bin := flag.String("bin-dir", "", "Directory with the service binaries (default: <dir>/bin, built if missing).")
	fanouts := flag.Int("fanouts", 1, "Fanout replicas.")
	flag.Parse()
	if err := run(*dir, *bin, *fanouts); err != nil {
		fmt.Fprintln(os.Stderr, "herald-dev:", err)
		os.Exit(1)
	}
}

// clusterFromEnv reads cluster mode's settings; files become absolute paths
// (the services run in other directories).
func clusterFromEnv() (stack.ClusterEtcd, error) {
	c := stack.ClusterEtcd{Endpoints: os.Getenv("HERALD_ETCD")}
	for _, f := range []struct {
		env  string
		dest *string
	}{
		{"HERALD_ETCD_CA", &c.CAFile}, {"HERALD_ETCD_CERT", &c.CertFile}, {"HERALD_ETCD_KEY", &c.KeyFile},
		{"HERALD_ENCRYPTION_CONFIG", &c.EncryptionConfig},
	} {
		v := os.Getenv(f.env)
		if v == "" {
			continue
		}
		if c.Endpoints == "" && f.env != "HERALD_ENCRYPTION_CONFIG" {
			return c, fmt.Errorf("%s needs HERALD_ETCD", f.env)
		}
		abs, err := filepath.Abs(v)
		if err != nil {
			return c, fmt.Errorf("%s: %w", f.env, err)
		}
		if _, err := os.Stat(abs); err != nil {
			return c, fmt.Errorf("%s: %w", f.env, err)
		}
		*f.dest = abs
	}
	return c, nil
}

// upstreamFromEnv reads cluster mode's kube-apiserver settings (absolute
// paths, checked to exist).
func upstreamFromEnv() (stack.Upstream, error) {
	var u stack.Upstream
	for _, f := range []struct {
		env  string
		dest *string
	}{
		{"HERALD_UPSTREAM", &u.Kubeconfig}, {"HERALD_UPSTREAM_USER", &u.UserKubeconfig}, {"HERALD_UPSTREAM_CLIENT_CA", &u.ClientCAFile},
	} {
		v := os.Getenv(f.env)
		if v == "" {
			continue
		}
		if f.env != "HERALD_UPSTREAM" && os.Getenv("HERALD_UPSTREAM") == "" {
			return u, fmt.Errorf("%s needs HERALD_UPSTREAM", f.env)
		}
		abs, err := filepath.Abs(v)
		if err != nil {
			return u, fmt.Errorf("%s: %w", f.env, err)
		}
		if _, err := os.Stat(abs); err != nil {
			return u, fmt.Errorf("%s: %w", f.env, err)
		}
		*f.dest = abs
	}
	return u, nil
}

// usesClientCertificate reports whether the current user of a kubeconfig
// authenticates with a client certificate.
func usesClientCertificate(kubeconfig string) bool {
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		return false // stack.Start reports it
	}
	ctx, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok {
		return false
	}
	u, ok := cfg.AuthInfos[ctx.AuthInfo]
	return ok && (u.ClientCertificate != "" || len(u.ClientCertificateData) > 0)
}

func run(dir, bin string, fanouts int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cluster, err := clusterFromEnv()
	if err != nil {
		return err
	}
	dir, _ = filepath.Abs(dir)
	if bin == "" {
		bin = filepath.Join(dir, "bin")
		if _, err := os.Stat(filepath.Join(bin, "frontdoor")); err != nil {
			fmt.Println("building services into", bin)
			if err := stack.Build(bin); err != nil {
				return err
			}
		}
	}
	upstream, err := upstreamFromEnv()
	if err != nil {
		return err
	}
	if upstream.Kubeconfig != "" {
		fmt.Println("cluster mode: frontdoor forwards to the kube-apiserver of", upstream.Kubeconfig)
		if upstream.UserKubeconfig == "" {
			fmt.Printf("cluster mode: %s gets HERALD_UPSTREAM's user, Herald's own identity (it may impersonate anyone; with the least privilege of deploy/k8s/overlays/cluster it reads nothing itself): set HERALD_UPSTREAM_USER=<your kubeconfig> to go through Herald as yourself\n",
				filepath.Join(dir, "kubeconfig"))
		} else {
			fmt.Printf("cluster mode: %s gets the current user of %s\n", filepath.Join(dir, "kubeconfig"), upstream.UserKubeconfig)
			if upstream.ClientCAFile == "" && usesClientCertificate(upstream.UserKubeconfig) {
				fmt.Printf("cluster mode: that user authenticates with a client certificate: set HERALD_UPSTREAM_CLIENT_CA=<the cluster's client CA>, or Herald refuses it (401)\n")
			}
		}
	}
	start := time.Now()
	s, err := stack.Start(ctx, stack.Options{
		Dir:           dir,
		BinDir:        bin,
		Cluster:       cluster,
		EtcdAddr:      "127.0.0.1:2379",
		NATSAddr:      "127.0.0.1:4222",
		FrontdoorAddr: "127.0.0.1:6443",
		InternalPorts: []int{9000, 7100, 9100, 7200, 9200, 9300},
		Fanouts:       fanouts,
		Upstream:      upstream,
	})
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(mustWd(), s.Kubeconfig)
	if err != nil {
		rel = s.Kubeconfig
	}
	mode := "etcd"
	if cluster.Endpoints != "" {
		mode = "the cluster's etcd"
	}
	fmt.Printf("herald is ready in %s: %s %s, NATS %s, API %s — try: kubectl --kubeconfig %s get pods -A  (logs in %s, Ctrl-C stops)\n",
		time.Since(start).Round(100*time.Millisecond), mode, s.EtcdEndpoint, s.NATSURL, s.FrontdoorURL, rel, filepath.Join(dir, "logs"))
	<-ctx.Done()
	fmt.Println("stopping herald...")
	s.Stop()
	fmt.Println("stopped")
	return nil
}

func mustWd() string {
	wd, _ := os.Getwd()
	return wd
}
