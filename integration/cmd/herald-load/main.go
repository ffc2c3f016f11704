// Command herald-load is the whole-stack load benchmark of `make bench`: it
// runs the same watch workloads against Herald and, as the baseline,
// kube-apiserver, and writes docs/benchmarks.md. See package loadgen.
//
// Each system's etcd (and NATS) runs in a child process of this one
// (`herald-load host`), so that the load client's CPU and the servers' CPU
// are separate processes.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"herald.dev/integration/loadgen"
	"herald.dev/integration/stack"
	"herald.dev/integration/tracerecv"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "host" {
		fs := flag.NewFlagSet("host", flag.ExitOnError)
		mode := fs.String("mode", "herald", "herald or etcd")
		dir := fs.String("dir", "", "State directory.")
		bin := fs.String("bin-dir", "", "Herald service binaries.")
		tokens := fs.String("tokens", "", "Token file for frontdoor.")
		replicas := fs.Int("replicas", 1, "Fanout and frontdoor processes (herald mode).")
		etcd := fs.String("etcd", "", "Client URL of the etcd Herald reads (herald mode; empty: one embedded in this process).")
		var ho loadgen.HostOptions
		fs.StringVar(&ho.RBACDir, "rbac-dir", "", "RBAC manifests frontdoor authorizes with (herald mode; empty: only system:masters is allowed).")
		fs.BoolVar(&ho.SysmonAwake, "sysmon-awake", true, "Run Herald's services with GODEBUG=schedtrace=2147483647 (herald mode).")
		fs.Parse(os.Args[2:])
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := loadgen.Host(ctx, *mode, *dir, *bin, *tokens, *etcd, *replicas, ho, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "herald-load host:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "watchers" {
		// A child holding a share of a workload's watchers (loadgen.Runner.WatcherProcArgv).
		if err := loadgen.ServeWatchers(context.Background(), os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "herald-load watchers:", err)
			os.Exit(1)
		}
		return
	}
	var o options
	flag.StringVar(&o.kube, "kube-apiserver", "", "kube-apiserver binary for the baseline (empty: baseline not measured).")
	flag.StringVar(&o.binDir, "bin-dir", "", "Herald service binaries (empty: built into a temporary directory).")
	flag.StringVar(&o.out, "out", "docs/benchmarks.md", "Report file.")
	flag.StringVar(&o.dir, "dir", "", "Work directory for state, logs and profiles (empty: a temporary one, removed afterwards).")
	flag.DurationVar(&o.duration, "duration", 20*time.Second, "Measured writes per broadcast workload (the kubelet-like ones take -kubelet-duration; the -fleet ones always write for 15 s after 500 ms of warm-up).")
	flag.DurationVar(&o.kubeletDuration, "kubelet-duration", 60*time.Second, "Measured writes per kubelet-like workload (kubelet-*, daemonset-*): kubelet-5000x200 and daemonset-5000x200 deliver 200 events/s, so 20 s would hold 4,000 latencies and a p99 that the 40 slowest, a few stalls of the machine, decide.")
	flag.DurationVar(&o.idleAfter, "idle-after", 0, "Once a workload's writes are delivered, log each fanout and frontdoor process's heap in use, then again after this long with the watchers open and no writes (0: not measured).")
	flag.DurationVar(&o.idle, "idle", 0, "With the watchers open and before any write, measure each server process's CPU over this long without writes, and log it (0: not measured).")
	flag.DurationVar(&o.warmup, "warmup", 5*time.Second, "Unmeasured writes at the same rate before each workload's measured writes.")
	flag.DurationVar(&o.settle, "settle", 90*time.Second, "Unmeasured writes at each workload's rate before its watchers open, so that kube-apiserver's watch cache history reaches its steady state (it grows while it holds less than about 75 s of events).")
	flag.StringVar(&o.proto, "proto", "http1", "Protocol of each watcher's own connection: http1 or http2 (the -h2mux workloads multiplex instead).")
	flag.StringVar(&o.only, "workloads", "", "Comma-separated workload names to run (empty: the full-scale ones; broadcast-1000x400 saturates a machine on which broadcast-1000x200 does not; broadcast-1000x600 is past Herald's capacity on a 2-core machine; broadcast-200x100, kubelet-1000x200 and kubelet-1000x200-protobuf are reduced-scale ones for profiling; broadcast-1000x100-fleet, kubelet-5000x200-fleet, kubelet-5000x200-protobuf-fleet and the reduced broadcast-200x100-fleet open their watchers as a fleet deployed with one RBAC-authorized token would, and write right after; kubelet-50000x500-protobuf is the scale-out, 50,000 watches over child processes, 6 frontdoor and fanout replicas against 3 kube-apiservers, and kubelet-2000x50-protobuf-scaleout its reduced form).")
	flag.StringVar(&o.systems, "systems", "herald,kube-apiserver", "Systems to run.")
	flag.IntVar(&o.rounds, "rounds", 3, "Runs of each workload on each system (alternating, each on fresh systems); the report shows the median by p99, the median CPU per delivery (which the targets compare) and every run.")
	flag.IntVar(&o.replicas, "replicas", 1, "Fanout and frontdoor processes of Herald (each frontdoor routes over every fanout; the watchers spread round-robin over the frontdoors, one connection each); kube-apiserver stays one process. Above 1, the workloads' names end in -<n>replicas.")
	flag.StringVar(&o.clientCPUs, "client-cpus", "auto", "CPUs of the load client (this process), the servers getting the rest of those it may use: auto (a quarter of them, on 4 or more; on fewer everything shares them), none, or a list (3, 6-7, 0,2).")
	flag.StringVar(&o.heraldEtcd, "herald-etcd", "shared", "Where Herald's etcd runs: shared (embedded in the process of Herald's NATS, as make run does) or own (a process of its own, started and loaded as kube-apiserver's is, as a cluster's etcd would be; on 2 cores the extra process cost Herald CPU and p99, see docs/benchmark-experiments.md).")
	flag.BoolVar(&o.traceHops, "trace-hops", false, "Have Herald's processes export every event's spans to a collector in this process, and report where each event's latency went, hop by hop, on JSON watches (a protobuf stream carries no trace lines to frontdoor; tracing costs CPU and latency: compare such a run's figures with an untraced one's, not with kube-apiserver's).")
	flag.StringVar(&o.godebug, "godebug", "both", "Which systems' server processes run with GODEBUG=schedtrace=2147483647 (sysmon kept out of its deep sleep, as make run and the manifests start Herald's): both, herald (Herald's hosts and services; kube-apiserver and its etcd with the runtime's default) or none.")
	flag.IntVar(&o.memPods, "memory-pods", 20000, "Pods loaded, once stored as JSON and once as protobuf, into fresh systems to measure the memory per 10,000 pods of Herald's cache and of kube-apiserver (0: not measured).")
	flag.Parse()
	o.command = "herald-load " + strings.Join(os.Args[1:], " ")
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "herald-load:", err)
		os.Exit(1)
	}
}

type options struct {
	kube, binDir, out, dir, only, systems, command string
	proto, clientCPUs, heraldEtcd, godebug         string
	duration, kubeletDuration, warmup, settle      time.Duration
	idle, idleAfter                                time.Duration
	rounds, memPods, replicas                      int
	traceHops                                      bool
}

const (
	numPods     = 5000
	numUsers    = 10 // broadcast watchers' users
	numKubelets = 5000
)

// defaultWorkloads run when -workloads is empty: the full-scale ones,
// the fleet shape's among them (issue 57); not the reduced ones, those
// past a 2-core machine's capacity, or the 50,000-watch scale-out, which
// needs its own hour.
const defaultWorkloads = "broadcast-1000x100,broadcast-1000x200,kubelet-5000x200,kubelet-5000x200-protobuf,daemonset-5000x200,broadcast-1000x100-h2mux," +
	"broadcast-1000x100-fleet,kubelet-5000x200-fleet,kubelet-5000x200-protobuf-fleet"

// fleetWorkloads are the workloads of the fleet shape (Workload.Fleet),
// with each watcher's connection proto and settle time: measured writes
// for 15 s, 500 ms after the last watcher opened, as a client that starts
// writing once its watchers are up. The kubelet-like ones still watch one
// node's pods each; only the token is shared. The full-scale ones are in
// the default set.
func fleetWorkloads(proto string, settle time.Duration) []loadgen.Workload {
	w := func(name string, watchers, perSec int, kubelet, protobuf bool) loadgen.Workload {
		return loadgen.Workload{Name: name, Watchers: watchers, WritesPerSec: perSec, Kubelet: kubelet, Protobuf: protobuf, Fleet: true,
			Proto: proto, Duration: 15 * time.Second, Warmup: 500 * time.Millisecond, Settle: settle}
	}
	return []loadgen.Workload{
		w("broadcast-1000x100-fleet", 1000, 100, false, false),
		w("kubelet-5000x200-fleet", numKubelets, 200, true, false),
		w("kubelet-5000x200-protobuf-fleet", numKubelets, 200, true, true),
		// Reduced scale, to check the shape end to end on a shared machine.
		w("broadcast-200x100-fleet", 200, 100, false, false),
	}
}

// tokenLines is the token file of a run whose tokens start with prefix (the
// stack's format; the first line is the admin, prefix-admin): one token
// per user, every one in system:masters (broadcast: 10 controllers;
// kubelet-like: one per node; a DaemonSet's ServiceAccount), but for the
// fleet's (prefix-fleet), whose user is authorized by RBAC only
// (Workload.Fleet); nodes node users (nodeUsers).
func tokenLines(prefix string, nodes int) []byte {
	var tf bytes.Buffer
	fmt.Fprintf(&tf, "%s-admin,herald-admin,herald-admin,\"system:masters\"\n", prefix)
	for i := range numUsers {
		fmt.Fprintf(&tf, "%s-controller-%d,controller-%d,controller-%d,\"system:masters\"\n", prefix, i, i, i)
	}
	fmt.Fprintf(&tf, "%s-daemonset,system:serviceaccount:kube-system:kube-proxy,kube-proxy,\"system:masters,system:serviceaccounts\"\n", prefix)
	fmt.Fprintf(&tf, "%s-fleet,%s,%s,\"%s\"\n", prefix, loadgen.FleetUser, loadgen.FleetUser, loadgen.FleetGroup)
	for i := range nodes {
		fmt.Fprintf(&tf, "%s-node-%d,system:node:node-%d,node-%d,\"system:masters\"\n", prefix, i, i, i)
	}
	return tf.Bytes()
}

// awakeSystems says which systems' server processes run with
// GODEBUG=schedtrace=2147483647 (-godebug).
type awakeSystems struct{ herald, kube bool }

func sysmonAwake(godebug string) (awakeSystems, error) {
	switch godebug {
	case "both":
		return awakeSystems{herald: true, kube: true}, nil
	case "herald":
		return awakeSystems{herald: true}, nil
	case "none":
		return awakeSystems{}, nil
	}
	return awakeSystems{}, fmt.Errorf("-godebug %q: want both, herald or none", godebug)
}

func run(o options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if o.proto != "http1" && o.proto != "http2" {
		return fmt.Errorf("-proto %q: want http1 or http2", o.proto)
	}
	if o.heraldEtcd != "own" && o.heraldEtcd != "shared" {
		return fmt.Errorf("-herald-etcd %q: want own or shared", o.heraldEtcd)
	}
	awake, err := sysmonAwake(o.godebug)
	if err != nil {
		return err
	}
	measured := func(kubelet bool) time.Duration {
		if kubelet {
			return o.kubeletDuration
		}
		return o.duration
	}
	w := func(name string, watchers, perSec int, kubelet bool, mux int) loadgen.Workload {
		return loadgen.Workload{Name: name, Watchers: watchers, WritesPerSec: perSec, Kubelet: kubelet, Mux: mux, Proto: o.proto,
			Duration: measured(kubelet), Warmup: o.warmup, Settle: o.settle}
	}
	// protobuf is a workload with protobuf storage and clients.
	protobuf := func(w loadgen.Workload) loadgen.Workload {
		w.Name += "-protobuf"
		w.Protobuf = true
		return w
	}
	workloads := []loadgen.Workload{
		w("broadcast-1000x100", 1000, 100, false, 0),
		w("broadcast-1000x200", 1000, 200, false, 0),
		w("kubelet-5000x200", numKubelets, 200, true, 0),
		// Kubelets as they are: protobuf clients, kube-apiserver's default
		// protobuf storage (issue 14).
		protobuf(w("kubelet-5000x200", numKubelets, 200, true, 0)),
		// A DaemonSet: kubelet-like watchers sharing one ServiceAccount.
		{Name: "daemonset-5000x200", Watchers: numKubelets, WritesPerSec: 200, Kubelet: true, OneUser: true, Proto: o.proto,
			Duration: measured(true), Warmup: o.warmup, Settle: o.settle},
		// The extra, labelled workload: 100 watchers per HTTP/2 connection
		// on both systems (below both servers' stream limits).
		w("broadcast-1000x100-h2mux", 1000, 100, false, 100),
		// Saturating where broadcast-1000x200 is not (a machine on which
		// kube-apiserver delivers more than half of its 200k events/s, so
		// that the 2x target cannot be told there): not in the default set.
		w("broadcast-1000x400", 1000, 400, false, 0),
		// Past Herald's capacity on a 2-core machine: how each system
		// degrades (not in the default set).
		w("broadcast-1000x600", 1000, 600, false, 0),
		// Reduced scale for profiling on a shared machine (not in the
		// default set).
		w("broadcast-200x100", 200, 100, false, 0),
		w("kubelet-1000x200", 1000, 200, true, 0),
		protobuf(w("kubelet-1000x200", 1000, 200, true, 0)),
	}
	workloads = append(workloads, fleetWorkloads(o.proto, o.settle)...)
	workloads = append(workloads, scaleOutWorkloads(o.kubeletDuration, o.warmup, o.settle, o.proto)...)
	if o.only == "" {
		o.only = defaultWorkloads
	}
	if o.only != "" {
		var keep []loadgen.Workload
		for _, w := range workloads {
			if strings.Contains(","+o.only+",", ","+w.Name+",") {
				keep = append(keep, w)
			}
		}
		workloads = keep
	}
	if o.replicas < 1 {
		return fmt.Errorf("-replicas %d: want at least 1", o.replicas)
	}
	if o.replicas > 1 {
		for i := range workloads {
			if workloads[i].Replicas > 0 {
				continue // its own
			}
			workloads[i].Name += fmt.Sprintf("-%dreplicas", o.replicas)
			workloads[i].Replicas = o.replicas
		}
	}
	if err := raiseFileLimit(localWatchers(workloads), log); err != nil {
		return err
	}
	avail, err := loadgen.AvailableCPUs()
	if err != nil {
		return err
	}
	cpus, err := loadgen.PlanCPUs(o.clientCPUs, avail)
	if err != nil {
		return fmt.Errorf("-client-cpus: %w", err)
	}
	log.Info("CPU placement", "placement", cpus.String())
	rp := &loadgen.Report{Machine: loadgen.Machine(), CPUs: cpus.String(), Command: o.command, Started: time.Now(), Workloads: workloads,
		Herald: map[string]*loadgen.Result{}, Kube: map[string]*loadgen.Result{},
		HeraldRounds: map[string][]*loadgen.Result{}, KubeRounds: map[string][]*loadgen.Result{}, OwnEtcd: o.heraldEtcd == "own", SysmonAwake: o.godebug}
	if o.dir == "" {
		d, err := os.MkdirTemp("", "herald-load")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		o.dir = d
	}
	o.dir, _ = filepath.Abs(o.dir)
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return err
	}
	if o.binDir == "" {
		o.binDir = filepath.Join(o.dir, "bin")
		log.Info("building Herald services", "into", o.binDir)
		if err := stack.Build(o.binDir); err != nil {
			return err
		}
	}
	o.binDir, _ = filepath.Abs(o.binDir)
	// After the build, which may use every CPU.
	if err := cpus.PinClient(); err != nil {
		return err
	}

	run := make([]byte, 6)
	rand.Read(run)
	prefix := hex.EncodeToString(run)
	tokenFile := filepath.Join(o.dir, "tokens.csv")
	admin, fleetToken := prefix+"-admin", prefix+"-fleet"
	if err := os.WriteFile(tokenFile, tokenLines(prefix, nodeUsers(workloads, numKubelets)), 0o600); err != nil {
		return err
	}
	// The fleet's grant, for Herald's frontdoor; kube-apiserver gets the
	// same objects through its API (loadgen.GrantFleet).
	fleetPolicy, err := loadgen.WriteFleetPolicy(filepath.Join(o.dir, "rbac"))
	if err != nil {
		return err
	}
	token := func(w loadgen.Workload) func(int) string {
		if w.Fleet {
			return func(int) string { return fleetToken }
		}
		if w.OneUser {
			return func(int) string { return prefix + "-daemonset" }
		}
		if w.Kubelet {
			return func(i int) string { return fmt.Sprintf("%s-node-%d", prefix, i) }
		}
		return func(i int) string { return fmt.Sprintf("%s-controller-%d", prefix, i%numUsers) }
	}
	// The same pods, stored as JSON or as kube-apiserver stores them
	// (protobuf), by workload.
	jsonPods, protoPods := loadgen.NewPods(numPods, numKubelets), loadgen.NewProtobufPods(numPods, numKubelets)
	scaledPods := podSets{}
	podsOf := func(w loadgen.Workload) *loadgen.Pods {
		if w.Nodes > 0 {
			return scaledPods.get(w.Nodes, w.Nodes, w.Protobuf)
		}
		if w.Protobuf {
			return protoPods
		}
		return jsonPods
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	pkiDir := filepath.Join(o.dir, "pki") // every Herald stack of the run uses it too
	pki, err := stack.EnsurePKI(pkiDir)
	if err != nil {
		return err
	}
	httpc, err := loadgen.NewHTTPClient(pki.CAFile)
	if err != nil {
		return err
	}
	profDir := filepath.Join(o.dir, "profiles")
	os.MkdirAll(profDir, 0o755)
	plain := &http.Client{} // admin ports: metrics and profiles
	want := func(s string) bool { return strings.Contains(","+o.systems+",", ","+s+",") }
	// -trace-hops: every Herald process exports every event's spans here.
	var (
		hops      *loadgen.HopTracer
		heraldEnv []string
	)
	if o.traceHops {
		hops = &loadgen.HopTracer{}
		rcv, err := tracerecv.Start(hops.Span)
		if err != nil {
			return err
		}
		defer rcv.Stop()
		heraldEnv = rcv.Env(100)
		rp.Traced = true
	}

	// Each workload runs on freshly started systems, Herald then
	// kube-apiserver, so that no workload inherits another's backlog, heap
	// or resumed watchers, and both systems see the machine at about the
	// same time.
	// loaded starts a host (mode "herald", on the etcd at etcdEndpoint or
	// its own, or "etcd") in dir and loads pods (if any) into its etcd;
	// stop stops both.
	loaded := func(mode, dir, binDir, tokens, etcdEndpoint string, replicas int, ho loadgen.HostOptions, pods *loadgen.Pods) (info *loadgen.HostInfo, etcd *clientv3.Client, stop func(), err error) {
		var env []string
		if mode == "herald" {
			env = heraldEnv
		}
		h, info, err := startHost(ctx, cpus, mode, dir, binDir, tokens, etcdEndpoint, replicas, ho, env)
		if err != nil {
			return nil, nil, nil, err
		}
		etcd, err = clientv3.New(clientv3.Config{Endpoints: []string{info.EtcdEndpoint}, DialTimeout: 5 * time.Second})
		if err != nil {
			h.stop()
			return nil, nil, nil, err
		}
		stop = func() { etcd.Close(); h.stop() }
		if pods == nil {
			return info, etcd, stop, nil
		}
		if _, err := pods.Load(ctx, etcd); err != nil {
			stop()
			return nil, nil, nil, err
		}
		return info, etcd, stop, nil
	}
	// measure runs w against t and adds the result to rounds.
	measure := func(t *loadgen.Target, etcd *clientv3.Client, w loadgen.Workload, rounds map[string][]*loadgen.Result) {
		r := &loadgen.Runner{Target: t, HTTP: httpc, Etcd: etcd, Pods: podsOf(w), Log: log, Metrics: plain, Idle: o.idle, IdleAfter: o.idleAfter, ClientCPUs: len(cpus.Client),
			WatcherProcArgv: []string{self, "watchers"}, WatcherProcDir: filepath.Join(o.dir, "watchers-"+w.Name)}
		res, err := r.Run(ctx, w)
		if res != nil {
			log.Info(res.String())
			rounds[w.Name] = append(rounds[w.Name], res)
		}
		if err != nil {
			log.Error("workload", "target", t.Name, "workload", w.Name, "err", err)
		}
		time.Sleep(3 * time.Second) // profiles finish
	}
	// heraldHost starts a fresh Herald in dir, with pods loaded. With
	// -herald-etcd own, its etcd is a host of its own, started and loaded
	// first as kube-apiserver's is; hosts names the host processes. Its
	// frontdoors authorize with the manifests in rbacDir (if set).
	heraldHost := func(dir string, replicas int, pods *loadgen.Pods, rbacDir string) (info *loadgen.HostInfo, hosts []hostProc, etcd *clientv3.Client, stop func(), err error) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, nil, nil, nil, err
		}
		if err := os.Symlink(pkiDir, filepath.Join(dir, "pki")); err != nil && !os.IsExist(err) {
			return nil, nil, nil, nil, err
		}
		ho := loadgen.HostOptions{RBACDir: rbacDir, SysmonAwake: awake.herald}
		if o.heraldEtcd == "shared" {
			info, etcd, stop, err = loaded("herald", dir, o.binDir, tokenFile, "", replicas, ho, pods)
			if err != nil {
				return nil, nil, nil, nil, err
			}
			return info, []hostProc{{"etcd+nats", info}}, etcd, stop, nil
		}
		etcdInfo, etcd, stopEtcd, err := loaded("etcd", filepath.Join(dir, "etcd-host"), "", "", "", 1, ho, pods)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		info, heraldEtcd, stopHerald, err := loaded("herald", dir, o.binDir, tokenFile, etcdInfo.EtcdEndpoint, replicas, ho, nil)
		if err != nil {
			stopEtcd()
			return nil, nil, nil, nil, err
		}
		heraldEtcd.Close() // the same etcd as etcd's
		return info, []hostProc{{"etcd", etcdInfo}, {"nats", info}}, etcd, func() { stopHerald(); stopEtcd() }, nil
	}
	heraldRun := func(w loadgen.Workload, round int) error {
		rbacDir := ""
		if w.Fleet {
			rbacDir = fleetPolicy
		}
		replicas := heraldReplicas(w, o.replicas)
		info, hosts, etcd, stop, err := heraldHost(filepath.Join(o.dir, fmt.Sprintf("herald-%s-%d", w.Name, round)), replicas, podsOf(w), rbacDir)
		if err != nil {
			return err
		}
		defer stop()
		if w.Fleet {
			// Every frontdoor loaded the grant at its start: a refusal
			// here is a broken policy, not a delay.
			for _, u := range info.FrontdoorURLs {
				if err := loadgen.WaitAuthorized(ctx, httpc, u, fleetToken, 10*time.Second); err != nil {
					return fmt.Errorf("%s: %w", u, err)
				}
			}
		}
		t := &loadgen.Target{Name: "Herald", BaseURL: info.FrontdoorURL, BaseURLs: info.FrontdoorURLs, CAFile: info.CAFile, AdminToken: admin, Token: token(w), Hops: hops,
			EtcdMetrics: []string{info.EtcdEndpoint}}
		admins := map[string]string{}
		for _, h := range hosts {
			t.CPU = append(t.CPU, loadgen.NamedPid{Name: h.name, Pid: h.info.Pid})
			admins[h.name] = h.info.Admin
		}
		for name, pid := range info.Procs {
			t.CPU = append(t.CPU, loadgen.NamedPid{Name: name, Pid: pid})
		}
		// Every fanout and frontdoor replica: its heap per watch it holds
		// (fanout: herald_fanout_watchers; frontdoor: its open pods
		// watches).
		var fanoutAdmins []string
		for i := range replicas {
			for _, svc := range []struct{ name, metric, match string }{
				{fmt.Sprintf("fanout-%d", i), "herald_fanout_watchers", ""},
				{fmt.Sprintf("frontdoor-%d", i), "apiserver_longrunning_requests", `resource="pods"`},
			} {
				base := "http://" + info.Admins[svc.name]
				t.Mem = append(t.Mem, loadgen.MemProc{Name: svc.name, Pid: info.Procs[svc.name], Heap: loadgen.HeapFromMetrics(plain, base, ""),
					Watchers: func(ctx context.Context) (float64, error) {
						return loadgen.MetricSum(ctx, plain, base, "", svc.metric, svc.match)
					}})
			}
			fanoutAdmins = append(fanoutAdmins, "http://"+info.Admins[fmt.Sprintf("fanout-%d", i)])
		}
		t.OpenWatches = func(ctx context.Context) (float64, error) {
			var sum float64
			for _, a := range fanoutAdmins {
				v, err := loadgen.MetricSum(ctx, plain, a, "", "herald_fanout_watchers")
				if err != nil {
					return 0, err
				}
				sum += v
			}
			return sum, nil
		}
		t.Terminated = func(ctx context.Context) (float64, error) {
			var sum float64
			for name, a := range info.Admins {
				if strings.HasPrefix(name, "fanout-") {
					v, err := loadgen.MetricSum(ctx, plain, "http://"+a, "", "apiserver_terminated_watchers_total")
					if err != nil && !strings.Contains(err.Error(), "no apiserver_terminated_watchers_total") {
						return 0, err
					}
					sum += v
				}
			}
			return sum, nil
		}
		var fanoutMetrics []string
		for _, a := range fanoutAdmins {
			fanoutMetrics = append(fanoutMetrics, a+"/metrics")
		}
		t.Stages = []loadgen.Stage{
			{Name: "ingest JetStream append, until acked", URLs: []string{"http://" + info.Admins["ingest-0"] + "/metrics"}, Metric: "herald_ingest_publish_duration_seconds"},
			{Name: "cache applied, since ingest received it from etcd", URLs: []string{"http://" + info.Admins["cache-0"] + "/metrics"}, Metric: "herald_cache_apply_latency_seconds"},
			{Name: "fanout wrote it to the watcher, since ingest received it", URLs: fanoutMetrics, Metric: "herald_event_delivery_latency_seconds"},
		}
		for name, a := range info.Admins {
			admins[name] = a
		}
		t.Profile = func(ctx context.Context, d time.Duration) {
			for name, a := range admins {
				go profile(ctx, plain, "http://"+a, "", d, filepath.Join(profDir, w.Name+"-"+name+".pprof"))
			}
		}
		t.IdleProfile = func(ctx context.Context) {
			for _, name := range []string{"fanout-0", "frontdoor-0"} {
				body, err := loadgen.Get(ctx, plain, "http://"+info.Admins[name]+"/debug/pprof/heap?gc=1", "")
				if err == nil {
					os.WriteFile(filepath.Join(profDir, w.Name+"-"+name+".heap"), body, 0o644)
				}
			}
		}
		measure(t, etcd, w, rp.HeraldRounds)
		return nil
	}
	// kubeHost starts a fresh etcd in dir with pods (if any) loaded, and
	// kube-apiserver on it with JSON or protobuf storage, and RBAC or no
	// authorization.
	kubeHost := func(dir string, pods *loadgen.Pods, protobuf, rbac bool) (info *loadgen.HostInfo, etcd *clientv3.Client, k *loadgen.KubeAPIServer, stop func(), err error) {
		info, etcd, stopEtcd, err := loaded("etcd", dir, "", "", "", 1, loadgen.HostOptions{SysmonAwake: awake.kube}, pods)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		mode := loadgen.KubeMode{Protobuf: protobuf, RBAC: rbac, SysmonAwake: awake.kube}
		k, err = loadgen.StartKubeAPIServer(ctx, cpus, o.kube, dir, info.EtcdEndpoint, pki.CertFile, pki.KeyFile, tokenFile, admin, mode, httpc)
		if err != nil {
			stopEtcd()
			return nil, nil, nil, nil, err
		}
		return info, etcd, k, func() { k.Stop(); stopEtcd() }, nil
	}
	kubeHistory := func(k *loadgen.KubeAPIServer) func(ctx context.Context) (float64, error) {
		return func(ctx context.Context) (float64, error) {
			return loadgen.MetricSum(ctx, httpc, k.URL, admin, "watch_cache_capacity", `resource="pods"`)
		}
	}
	kubeRun := func(w loadgen.Workload, round int) error {
		dir := filepath.Join(o.dir, fmt.Sprintf("kube-%s-%d", w.Name, round))
		info, etcd, k, stop, err := kubeHost(dir, podsOf(w), w.Protobuf, w.Fleet)
		if err != nil {
			return err
		}
		defer stop()
		// More kube-apiservers on the same etcd, each with its own watch
		// cache and etcd watches.
		more, stopMore, err := startKubeReplicas(w.KubeReplicas, dir, func(dir string) (*loadgen.KubeAPIServer, error) {
			mode := loadgen.KubeMode{Protobuf: w.Protobuf, RBAC: w.Fleet, SysmonAwake: awake.kube}
			return loadgen.StartKubeAPIServer(ctx, cpus, o.kube, dir, info.EtcdEndpoint, pki.CertFile, pki.KeyFile, tokenFile, admin, mode, httpc)
		})
		if err != nil {
			return err
		}
		defer stopMore()
		if w.Fleet {
			// Created once, through the first; every replica's RBAC
			// authorizer reads them from its own informer.
			if err := loadgen.GrantFleet(ctx, httpc, k.URL, admin, fleetToken, time.Minute); err != nil {
				return err
			}
			for _, r := range more {
				if err := loadgen.WaitAuthorized(ctx, httpc, r.k.URL, fleetToken, time.Minute); err != nil {
					return fmt.Errorf("%s: %w", r.name, err)
				}
			}
		}
		t := &loadgen.Target{Name: "kube-apiserver", BaseURL: k.URL, CAFile: pki.CAFile, AdminToken: admin, Token: token(w),
			CPU: []loadgen.NamedPid{{Name: "etcd", Pid: info.Pid}, {Name: "kube-apiserver", Pid: k.Pid()}},
			Mem: []loadgen.MemProc{{Name: "kube-apiserver", Pid: k.Pid(), Heap: loadgen.HeapFromMetrics(httpc, k.URL, admin)}},
			OpenWatches: func(ctx context.Context) (float64, error) {
				return loadgen.MetricSum(ctx, httpc, k.URL, admin, "apiserver_longrunning_requests", `resource="pods"`, `verb="WATCH"`)
			},
			Terminated: func(ctx context.Context) (float64, error) {
				v, err := loadgen.MetricSum(ctx, httpc, k.URL, admin, "apiserver_terminated_watchers_total", `resource="pods"`)
				if err != nil && strings.Contains(err.Error(), "no apiserver_terminated_watchers_total") {
					return 0, nil // a counter with no samples yet
				}
				return v, err
			},
			History: kubeHistory(k),
			Profile: func(ctx context.Context, d time.Duration) {
				go profile(ctx, plain, "http://"+info.Admin, "", d, filepath.Join(profDir, w.Name+"-kube-etcd.pprof"))
				go profile(ctx, httpc, k.URL, admin, d, filepath.Join(profDir, w.Name+"-kube-apiserver.pprof"))
			},
			EtcdMetrics: []string{info.EtcdEndpoint}}
		if len(more) > 0 {
			scaleKubeTarget(t, append([]kubeReplica{{"kube-apiserver", k}}, more...), httpc, admin)
		}
		measure(t, etcd, w, rp.KubeRounds)
		return nil
	}
	switch {
	case !want("kube-apiserver"):
		rp.KubeNote = "not requested (-systems)."
	case o.kube == "":
		rp.KubeNote = "no kube-apiserver binary given (-kube-apiserver)."
	}
	for _, w := range workloads {
		for round := range max(o.rounds, 1) {
			if want("herald") {
				if err := heraldRun(w, round); err != nil {
					return fmt.Errorf("herald: %w", err)
				}
			}
			if rp.KubeNote == "" {
				if err := kubeRun(w, round); err != nil {
					rp.KubeNote = err.Error()
					log.Error("kube-apiserver baseline", "err", err)
				}
			}
		}
		if rs := rp.HeraldRounds[w.Name]; len(rs) > 0 {
			rp.Herald[w.Name] = loadgen.Median(rs)
		}
		if rs := rp.KubeRounds[w.Name]; len(rs) > 0 {
			rp.Kube[w.Name] = loadgen.Median(rs)
		}
	}

	// Memory per 10,000 pods: each system fresh, etcd empty, then
	// o.memPods pods loaded, stored as JSON and then as protobuf.
	if o.memPods > 0 {
		rp.MemoryPods = o.memPods
		for _, pods := range []*loadgen.Pods{loadgen.NewPods(o.memPods, numKubelets), loadgen.NewProtobufPods(o.memPods, numKubelets)} {
			enc := strings.ToLower(pods.Encoding())
			note := func(m *loadgen.Memory, err error) {
				if err != nil {
					m.Err = err.Error()
					log.Error("memory", "target", m.Target, "storage", m.Encoding, "err", err)
				} else {
					log.Info("memory per 10k pods", "target", m.Target, "process", m.Process, "storage", m.Encoding, "heap", m.HeapPer10k, "rss", m.RSSPer10k, "history", m.History)
				}
				rp.Memory = append(rp.Memory, m)
			}
			if want("herald") {
				info, _, etcd, stop, err := heraldHost(filepath.Join(o.dir, "herald-memory-"+enc), o.replicas, nil, "")
				if err != nil {
					return fmt.Errorf("herald: %w", err)
				}
				t := &loadgen.Target{Name: "Herald", BaseURL: info.FrontdoorURL, AdminToken: admin}
				note(loadgen.MeasureMemory(ctx, httpc, t, etcd, pods, loadgen.MemProc{Name: "cache-0", Pid: info.Procs["cache-0"],
					Heap: loadgen.HeapFromMetrics(plain, "http://"+info.Admins["cache-0"], "")}))
				stop()
			}
			if rp.KubeNote == "" {
				_, etcd, k, stop, err := kubeHost(filepath.Join(o.dir, "kube-memory-"+enc), nil, pods.Protobuf, false)
				if err != nil {
					note(&loadgen.Memory{Target: "kube-apiserver", Process: "kube-apiserver", Encoding: pods.Encoding(), Pods: pods.N}, err)
					continue
				}
				t := &loadgen.Target{Name: "kube-apiserver", BaseURL: k.URL, AdminToken: admin, History: kubeHistory(k)}
				note(loadgen.MeasureMemory(ctx, httpc, t, etcd, pods, loadgen.MemProc{Name: "kube-apiserver", Pid: k.Pid(),
					Heap: loadgen.HeapFromMetrics(httpc, k.URL, admin)}))
				stop()
			}
		}
	}

	rp.Notes = targets(rp)
	for _, w := range workloads {
		for _, name := range []string{"fanout-0", "frontdoor-0", "etcd+nats", "etcd", "nats", "ingest-0", "cache-0", "kube-apiserver", "kube-etcd"} {
			f := filepath.Join(profDir, w.Name+"-"+name+".pprof")
			if _, err := os.Stat(f); err != nil {
				continue
			}
			n := 25
			if !strings.HasPrefix(name, "f") {
				n = 15 // the per-write pipeline and the baseline: shorter
			}
			top, err := loadgen.PprofTop(f, n)
			if err != nil {
				log.Warn("pprof", "err", err)
				continue
			}
			rp.Profiles = append(rp.Profiles, fmt.Sprintf("### %s, %s: CPU during the writes\n\n```\n%s```", w.Name, name, trimPprof(top)))
			if top, err := loadgen.PprofTop(strings.TrimSuffix(f, ".pprof")+".heap", 15, "-sample_index=inuse_space"); err == nil {
				rp.Profiles = append(rp.Profiles, fmt.Sprintf("### %s, %s: heap in use with every watcher open and idle\n\n```\n%s```", w.Name, name, trimPprof(top)))
			}
		}
	}
	if old, err := os.ReadFile(o.out); err == nil {
		rp.Analysis = loadgen.KeptAnalysis(old)
	}
	var buf bytes.Buffer
	rp.Write(&buf)
	if err := os.WriteFile(o.out, buf.Bytes(), 0o644); err != nil {
		return err
	}
	log.Info("report written", "file", o.out)
	return nil
}

// targets states, per workload, which of issue 16's acceptance targets are
// met: on the broadcast workloads Herald's whole-stack CPU per delivery and
// p99 at most half of kube-apiserver's (where kube-apiserver falls behind
// the writes, saturated: at least twice its deliveries/s at a p99 no
// worse); on the kubelet-like ones CPU no more than kube-apiserver's and
// p99 as issue 57 decided (kubeletP99); every
// watch of a DaemonSet's one token open;
// frontdoor <= 16 KB and fanout <= 12 KB of heap per idle watch; and, on
// both systems, no event missing, duplicated or reordered.
func targets(rp *loadgen.Report) []string {
	var out []string
	for _, w := range rp.Workloads {
		h, k := rp.Herald[w.Name], rp.Kube[w.Name]
		if h != nil {
			for _, m := range []struct {
				proc  string
				limit float64
			}{{"frontdoor-0", 16000}, {"fanout-0", 12000}} {
				if heap, ok := h.HeapPerWatcher[m.proc]; ok {
					out = append(out, fmt.Sprintf("%s: %s heap per idle watch %.1f KB (target <= %.0f KB): %s.", w.Name, m.proc, heap/1000, m.limit/1000, verdict(heap <= m.limit)))
				}
			}
			out = append(out, fmt.Sprintf("%s: Herald missing %d, duplicated %d, reordered %d (target 0): %s.", w.Name, h.Missing, h.Duplicates, h.Reordered, verdict(h.Missing == 0 && h.Duplicates == 0 && h.Reordered == 0)))
			if w.OneUser || w.Fleet {
				out = append(out, fmt.Sprintf("%s: %d of %d watches of one token opened with the default flags (target all): %s.", w.Name, h.Watchers, w.Watchers, verdict(h.Watchers == w.Watchers)))
			}
		}
		if h == nil || k == nil {
			continue
		}
		if k.Deliveries == 0 || h.Deliveries == 0 {
			out = append(out, fmt.Sprintf("%s: not comparable: Herald delivered %d, kube-apiserver %d of %d/%d expected events in the measured window.", w.Name,
				h.Deliveries, k.Deliveries, h.Expected, k.Expected))
			continue
		}
		cpu, p99 := 0.5, 0.5 // broadcast
		if w.Kubelet {
			cpu = 1
		}
		// A broadcast saturates kube-apiserver when it falls behind the
		// rate the writes offer; the target is then throughput, which
		// only a Herald that falls behind too shows in full.
		if !w.Kubelet && k.OfferedShare() < 0.95 {
			ratio := h.DeliveriesPerSec() / k.DeliveriesPerSec()
			met := ratio >= 2 && h.P99 <= k.P99
			v := verdict(met)
			if !met && h.P99 <= k.P99 && h.OfferedShare() >= 0.99 {
				v = fmt.Sprintf("not shown: Herald delivered %.1f%% of the rate offered, which is less than twice kube-apiserver's; a workload that saturates Herald decides", 100*h.OfferedShare())
			}
			out = append(out, fmt.Sprintf("%s: kube-apiserver delivered %.1f%% of the rate offered (saturated); deliveries/s %.0f vs kube-apiserver %.0f, ratio %.2f (target >= 2) at p99 %.1f ms vs %.1f ms (target: no worse): %s.", w.Name,
				100*k.OfferedShare(), h.DeliveriesPerSec(), k.DeliveriesPerSec(), ratio, float64(h.P99)/1e6, float64(k.P99)/1e6, v))
		} else if w.Kubelet {
			limit, rule := kubeletP99(k.P99)
			out = append(out, fmt.Sprintf("%s: p99 %.1f ms vs kube-apiserver %.1f ms, ratio %.2f (target %s, <= %.1f ms): %s.", w.Name,
				float64(h.P99)/1e6, float64(k.P99)/1e6, float64(h.P99)/float64(k.P99), rule, float64(limit)/1e6, verdict(h.P99 <= limit)))
		} else {
			out = append(out, fmt.Sprintf("%s: p99 %.1f ms vs kube-apiserver %.1f ms, ratio %.2f (target <= %.1f): %s.", w.Name,
				float64(h.P99)/1e6, float64(k.P99)/1e6, float64(h.P99)/float64(k.P99), p99, verdict(float64(h.P99) <= p99*float64(k.P99))))
		}
		// The median CPU of the runs, which need not be the median-p99
		// run's.
		hc, kc := loadgen.MedianCPUPer1000(rp.HeraldRounds[w.Name]), loadgen.MedianCPUPer1000(rp.KubeRounds[w.Name])
		if hc < 0 || kc < 0 {
			hc, kc = h.CPUPer1000(), k.CPUPer1000()
		}
		out = append(out, fmt.Sprintf("%s: CPU per 1,000 deliveries (median of the runs) %.2f ms vs %.2f ms, ratio %.2f (target <= %.1f): %s.", w.Name,
			hc, kc, hc/kc, cpu, verdict(hc <= cpu*kc)))
		out = append(out, fmt.Sprintf("%s: kube-apiserver missing %d, duplicated %d, reordered %d, %.0f watches terminated (Herald: %.0f).", w.Name, k.Missing, k.Duplicates, k.Reordered, k.Terminated, h.Terminated))
	}
	return out
}

// kubeletP99 is the kubelet-like workloads' p99 target, as issue 57
// decided it: the five processes stay in series, each hop a wake-up on a
// machine the load client shares, so Herald may add up to 3 ms to
// kube-apiserver's p99; where kube-apiserver's p99 passes 100 ms (the loads
// a fan-out tier is for) Herald must halve it. rule says which applies.
func kubeletP99(kube time.Duration) (limit time.Duration, rule string) {
	if kube > 100*time.Millisecond {
		return kube / 2, "<= 0.5x where kube-apiserver's passes 100 ms"
	}
	return kube + 3*time.Millisecond, "<= kube-apiserver's + 3 ms"
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

func trimPprof(s string) string {
	// Drop pprof's header lines about the file and build.
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "File:") || strings.HasPrefix(l, "Build ID:") || strings.HasPrefix(l, "Type:") || strings.HasPrefix(l, "Time:") {
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}

// profile saves a CPU profile of d from a server's /debug/pprof.
func profile(ctx context.Context, c *http.Client, base, token string, d time.Duration, file string) {
	body, err := loadgen.Get(ctx, c, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, int(d.Seconds())), token)
	if err == nil {
		os.WriteFile(file, body, 0o644)
	}
}

// raiseFileLimit raises this process's open file limit (inherited by the
// servers it starts) to its hard limit: every watcher holds a connection,
// one descriptor here and one in the server. It also warns when the
// ephemeral port range is too small for the watchers' connections.
func raiseFileLimit(watchers int, log *slog.Logger) error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return err
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			return fmt.Errorf("raising RLIMIT_NOFILE to %d: %w", l.Max, err)
		}
	}
	if need := uint64(watchers)*2 + 1024; l.Cur < need {
		return fmt.Errorf("open file limit %d is below the %d this run needs (ulimit -Hn)", l.Cur, need)
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var lo, hi int
		if _, err := fmt.Sscan(string(b), &lo, &hi); err == nil && hi-lo+1 < 2*watchers {
			log.Warn("the ephemeral port range is small for one connection per watcher (closed connections wait in TIME_WAIT)", "range", strings.TrimSpace(string(b)), "watchers", watchers)
		}
	}
	log.Info("open file limit", "limit", l.Cur)
	return nil
}

type host struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// hostProc is one of Herald's host processes (etcd, NATS, or both) by the
// name the report gives it.
type hostProc struct {
	name string
	info *loadgen.HostInfo
}

// startHost runs `herald-load host` (this binary) and reads its HostInfo.
func startHost(ctx context.Context, cpus loadgen.CPUPlan, mode, dir, binDir, tokens, etcd string, replicas int, ho loadgen.HostOptions, env []string) (*host, *loadgen.HostInfo, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	os.MkdirAll(dir, 0o755)
	logf, err := os.Create(filepath.Join(dir, "host.log"))
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.CommandContext(ctx, self, "host", "-mode", mode, "-dir", dir, "-bin-dir", binDir, "-tokens", tokens, "-etcd", etcd, "-replicas", fmt.Sprint(replicas),
		"-rbac-dir", ho.RBACDir, fmt.Sprintf("-sysmon-awake=%t", ho.SysmonAwake))
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// A host runs with the runtime setting its system's services get
	// (-godebug; by default every server process of both systems has the
	// one integration/stack and the manifests give Herald's): the hosts of
	// etcd (and NATS) as much as the services and kube-apiserver.
	cmd.Env = append(stack.SysmonEnv(os.Environ(), ho.SysmonAwake), env...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	// The host and every process it starts run on the servers' CPUs.
	if err := cpus.StartServer(cmd.Start); err != nil {
		return nil, nil, err
	}
	h := &host{cmd: cmd, stdin: stdin}
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	if err != nil {
		h.stop()
		return nil, nil, fmt.Errorf("host %s did not start (see %s): %v", mode, logf.Name(), err)
	}
	var info loadgen.HostInfo
	if err := json.Unmarshal(line, &info); err != nil {
		h.stop()
		return nil, nil, fmt.Errorf("host %s: %v: %s", mode, err, line)
	}
	go io.Copy(io.Discard, stdout)
	return h, &info, nil
}

// stop closes the host's stdin (it stops its stack) and waits.
func (h *host) stop() {
	h.stdin.Close()
	done := make(chan struct{})
	go func() { h.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		h.cmd.Process.Kill()
		<-done
	}
}
