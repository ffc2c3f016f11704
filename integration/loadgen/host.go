package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	_ "net/http/pprof" // the host's CPU profile
	"os"
	"path/filepath"
	"time"

	"herald.dev/integration/stack"
)

// HostInfo is what a host process reports once it is ready: one JSON line
// on its standard output.
type HostInfo struct {
	EtcdEndpoint string `json:"etcd"`
	// Pid of the host process itself: embedded etcd, NATS for Herald, or
	// both when Herald's host embeds its own etcd.
	Pid int `json:"pid"`
	// Admin serves /debug/pprof for the host process (with both embedded,
	// its CPU profile splits etcd from NATS).
	Admin string `json:"admin"`
	// Herald only. FrontdoorURL is frontdoor-0's; FrontdoorURLs are every
	// frontdoor replica's, in order.
	FrontdoorURL  string            `json:"frontdoor,omitempty"`
	FrontdoorURLs []string          `json:"frontdoors,omitempty"`
	CAFile        string            `json:"caFile,omitempty"`
	Procs         map[string]int    `json:"procs,omitempty"`  // service name -> pid
	Admins        map[string]string `json:"admins,omitempty"` // service name -> admin address
}

// HostOptions say how a host's Herald services run (mode "herald"); the
// host process itself, with its embedded etcd and NATS, runs in the
// environment it was started with.
type HostOptions struct {
	// RBACDir: the frontdoors authorize with the RBAC manifests in it
	// (--authorization.rbac-dir); empty: only system:masters is allowed.
	RBACDir string
	// SysmonAwake: the services run with service.SysmonAwake, as make run
	// and the manifests start them; otherwise with the runtime's default
	// (stack.SysmonEnv).
	SysmonAwake bool
}

// Host runs in its own process so that the CPU of what it embeds is that
// process's CPU and nothing else's: mode "herald" starts the whole stack
// (stack.Start: embedded NATS and every service a process) on the etcd at
// etcdEndpoint, as Herald reads a cluster's (empty: an etcd embedded in the
// same process, as make run does); mode "etcd" only an embedded etcd
// configured as the stack's, for kube-apiserver and for Herald. tokenFile,
// if set, is installed as the stack's token file (its first line must be
// the admin). replicas (0 or 1: one) is how many fanout and how many
// frontdoor processes Herald runs; o says how they run. It prints a
// HostInfo line and runs until stdin closes or ctx ends.
func Host(ctx context.Context, mode, dir, binDir, tokenFile, etcdEndpoint string, replicas int, o HostOptions, stdin io.Reader, stdout io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	info := HostInfo{Pid: os.Getpid()}
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer admin.Close()
	go (&http.Server{Handler: http.DefaultServeMux, ReadHeaderTimeout: 10 * time.Second}).Serve(admin) // net/http/pprof's handlers
	info.Admin = admin.Addr().String()
	switch mode {
	case "herald":
		if tokenFile != "" {
			b, err := os.ReadFile(tokenFile)
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), b, 0o600); err != nil {
				return err
			}
		}
		so := stack.Options{Dir: dir, BinDir: binDir, Fanouts: replicas, Frontdoors: replicas,
			Cluster: stack.ClusterEtcd{Endpoints: etcdEndpoint}, NoSysmonAwake: !o.SysmonAwake}
		if o.RBACDir != "" {
			so.Flags = map[string][]string{"frontdoor": {"--authorization.rbac-dir=" + o.RBACDir}}
		}
		s, err := stack.Start(ctx, so)
		if err != nil {
			return err
		}
		defer s.Stop()
		info.EtcdEndpoint, info.FrontdoorURL, info.FrontdoorURLs, info.CAFile = s.EtcdEndpoint, s.FrontdoorURL, s.FrontdoorURLs, s.PKI.CAFile
		info.Procs, info.Admins = map[string]int{}, map[string]string{}
		for _, p := range s.Procs() {
			info.Procs[p.Name], info.Admins[p.Name] = p.Pid(), p.Admin
		}
	case "etcd":
		e, endpoint, err := stack.StartEtcd(dir, "", nil) // configured as the stack's
		if err != nil {
			return err
		}
		defer e.Close()
		info.EtcdEndpoint = endpoint
	default:
		return fmt.Errorf("unknown host mode %q", mode)
	}
	b, _ := json.Marshal(info)
	fmt.Fprintf(stdout, "%s\n", b)
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, stdin); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}
