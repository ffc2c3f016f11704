package containers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	tcnetwork "github.com/testcontainers/testcontainers-go/network"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"herald.dev/integration/checker"
	"herald.dev/integration/stack"
)

// TestEtcdRestore is issue 54's disaster recovery: etcd (one member, its
// data directory on the host) is restored with etcdutl's snapshot restore
// (the library `etcdutl snapshot restore` runs) from a snapshot taken
// earlier, while a writer keeps changing pods and client-go informers watch
// them through frontdoor. After the restore the informers must hold etcd's
// restored state, and none of them may get an event of the discarded
// history (the revisions written after the snapshot, before the restore).
//
//   - Plain: the revision goes back below what Herald has served (rule
//     revision-regression), and the restored etcd re-uses those revisions.
//   - BumpRevisionMarkCompacted: --bump-revision past the old revision,
//     --mark-compacted (rule compacted).
func TestEtcdRestore(t *testing.T) {
	for _, tc := range []struct {
		name string
		bump uint64
	}{
		{"Plain", 0},
		{"BumpRevisionMarkCompacted", 100000},
	} {
		t.Run(tc.name, func(t *testing.T) { restoreScenario(t, tc.bump) })
	}
}

// etcdUID owns the etcd image's data directory (deploy/images/etcd).
const etcdUID = 65532

// startRestoreCluster is the smallest whole Herald in containers: one etcd
// member whose data directory is etcdDir on the host, one NATS, one of each
// service.
func startRestoreCluster(t *testing.T, etcdDir string) *cluster {
	t.Helper()
	images := imagePattern()
	c := &cluster{images: images, docker: requireDocker(t, images), nodes: map[string]*node{}, dir: t.TempDir(),
		shards: []cacheShard{{alias: "cache-a"}}, shardMap: "*=dns:///cache-a:7100"}
	buf := make([]byte, 4)
	rand.Read(buf)
	c.id = hex.EncodeToString(buf)
	c.token = hex.EncodeToString(append(buf, buf...))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var err error
	if c.net, err = tcnetwork.New(ctx); err != nil {
		t.Fatalf("network: %v", err)
	}
	t.Cleanup(func() { c.net.Remove(context.Background()) })
	if c.pki, err = stack.EnsurePKI(filepath.Join(c.dir, "pki")); err != nil {
		t.Fatal(err)
	}
	const etcd, nats = "--etcd.endpoints=http://etcd-0:2379", "--nats.url=nats://nats-0:4222"
	single := func(s spec) spec {
		for i, a := range s.args {
			switch a {
			case etcdEndpoints:
				s.args[i] = etcd
			case natsURLs:
				s.args[i] = nats
			case "--stream.replicas=3":
				s.args[i] = "--stream.replicas=1"
			}
		}
		return s
	}
	c.startAll(t, ctx,
		spec{name: "etcd-0", group: "etcd", image: "etcd", ports: []string{etcdClient, etcdMetrics}, health: etcdMetrics, path: "/readyz",
			binds: []string{etcdDir + ":/var/lib/etcd"},
			args: []string{"--name=etcd-0", "--data-dir=/var/lib/etcd/data",
				"--listen-client-urls=http://0.0.0.0:2379", "--advertise-client-urls=http://etcd-0:2379",
				"--listen-peer-urls=http://0.0.0.0:2380", "--initial-advertise-peer-urls=http://etcd-0:2380",
				"--listen-metrics-urls=http://0.0.0.0:2381", "--initial-cluster=etcd-0=http://etcd-0:2380",
				"--initial-cluster-state=new", "--initial-cluster-token=herald-e2e", "--log-level=warn"}},
		spec{name: "nats-0", group: "nats", image: "nats-server", ports: []string{natsMonitor}, health: natsMonitor, path: "/healthz",
			args: []string{"--name=nats-0", "--jetstream", "--store_dir=/var/lib/nats", "--port=4222", "--http_port=8222"}})
	c.etcd, err = clientv3.New(clientv3.Config{Endpoints: c.etcdEndpoints(ctx), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.etcd.Close() })
	c.startAll(t, ctx, single(c.ingestSpec(0)))
	c.startAll(t, ctx, single(c.cacheSpec(c.shards[0], 0)))
	c.startAll(t, ctx, c.fanoutSpec(0))
	c.startAll(t, ctx, c.frontdoorSpec(0))
	return c
}

// restoreInformer is one client-go pod informer through frontdoor and the
// events its handlers saw.
type restoreInformer struct{ fleetInformer }

func restoreScenario(t *testing.T, bump uint64) {
	etcdDir := filepath.Join(t.TempDir(), "etcd")
	if err := os.Mkdir(etcdDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(etcdDir, etcdUID, etcdUID); err != nil {
		t.Fatal(err)
	}
	c := startRestoreCluster(t, etcdDir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	cctx, stopChurn := context.WithCancel(ctx)
	churned := make(chan struct{})
	go func() { defer close(churned); churn(cctx, c.etcd, 20*time.Millisecond) }()
	defer func() { stopChurn(); <-churned }()

	informers := startRestoreInformers(t, ctx, c, 3)
	waitUntil := func(rev int64, what string) {
		t.Helper()
		waitFor(t, 3*time.Minute, what, func() bool {
			for _, f := range informers {
				if f.synced() < rev {
					return false
				}
			}
			return true
		})
	}
	waitUntil(currentRevision(t, ctx, c.etcd)+100, "the informers to follow 100 revisions of churn")

	// The snapshot (the backup), then more churn: the history to discard.
	snapFile := filepath.Join(t.TempDir(), "snapshot.db")
	snapRev := saveSnapshot(t, ctx, c.etcd, snapFile)
	waitUntil(snapRev+150, "the informers to see 150 revisions after the snapshot")

	// The restore: etcd stopped, its data directory replaced by the
	// snapshot's, started again.
	etcdNode := c.node(t, "etcd-0")
	oldLast := currentRevision(t, ctx, c.etcd)
	oldHistory, err := etcdHistory(ctx, c.etcd, snapRev+1, oldLast)
	if err != nil {
		t.Fatal(err)
	}
	c.stop(t, ctx, etcdNode)
	oldLast = max(oldLast, lastRev(oldHistory))
	restoreData(t, snapFile, etcdDir, bump)
	seen := make([]int, len(informers))
	for i, f := range informers {
		seen[i] = len(f.events())
	}
	c.restart(t, ctx, etcdNode)
	restored := currentRevision(t, ctx, c.etcd)
	t.Logf("etcd restored from the snapshot at revision %d: it was at %d, now at %d (revision gap %d; bump %d); %d changes of the discarded history",
		snapRev, oldLast, restored, restored-oldLast, bump, len(oldHistory))

	// Churn on the restored etcd until it has passed the discarded
	// history's revisions, then stop and let the informers settle.
	waitFor(t, 3*time.Minute, "the restored etcd to pass the discarded history's last revision", func() bool {
		return currentRevision(t, ctx, c.etcd) > oldLast+100
	})
	stopChurn()
	<-churned
	last := currentRevision(t, ctx, c.etcd)
	waitUntil(last, fmt.Sprintf("the informers to reach the restored etcd's revision %d", last))

	// Every informer holds etcd's restored state.
	state, err := c.etcd.Get(ctx, podPrefix, clientv3.WithPrefix(), clientv3.WithRev(last))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{}
	for _, kv := range state.Kvs {
		want[checker.KeyName(podPrefix, string(kv.Key))] = kv.ModRevision
	}
	newHistory, err := etcdHistory(ctx, c.etcd, restored+1, last)
	if err != nil {
		t.Fatal(err)
	}
	newSet := map[checker.WatchEvent]bool{}
	for _, ch := range newHistory {
		newSet[checker.WatchEvent{Key: checker.KeyName(podPrefix, ch.Key), RV: ch.Rev}] = true
	}
	for i, f := range informers {
		got := map[string]int64{}
		for _, o := range f.inf.GetStore().List() {
			p := o.(*corev1.Pod)
			rv, _ := strconv.ParseInt(p.ResourceVersion, 10, 64)
			got[p.Namespace+"/"+p.Name] = rv
		}
		if !mapsEqual(got, want) {
			t.Errorf("informer %d holds %d pods, etcd %d at revision %d: differs (first differences: %s)", i, len(got), len(want), last, diff(got, want))
		}
		// After the restore: no event of the discarded history. An event
		// past the snapshot's revision must be a change of the restored
		// etcd (relists' ADDED and MODIFIED carry revisions up to the
		// snapshot's, the history both share; client-go's own deletions of
		// objects a relist no longer finds are not events served).
		var old []checker.WatchEvent
		after := f.events()[seen[i]:]
		for _, e := range after {
			if e.Type == "DELETED-UNKNOWN" || e.RV <= snapRev {
				continue
			}
			if !newSet[checker.WatchEvent{Key: e.Key, RV: e.RV}] {
				old = append(old, e)
			}
		}
		t.Logf("informer %d: %d events after the restore, %d events of the old history; holds %d pods as etcd does at %d", i, len(after), len(old), len(got), last)
		if len(old) > 0 {
			t.Errorf("informer %d got %d events of the discarded history after the restore, first %v", i, len(old), old[:min(5, len(old))])
		}
	}
}

// saveSnapshot writes etcd's snapshot to file and returns its revision.
func saveSnapshot(t *testing.T, ctx context.Context, cli *clientv3.Client, file string) int64 {
	t.Helper()
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadFrom(rc); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.NewV3(zap.NewNop()).Status(file)
	if err != nil {
		t.Fatal(err)
	}
	return st.Revision
}

// restoreData replaces the member's data directory (etcdDir/data) by the
// snapshot's, as `etcdutl snapshot restore` does, with the same member name,
// peer URL and cluster token as the member had (so the same cluster ID).
func restoreData(t *testing.T, snapFile, etcdDir string, bump uint64) {
	t.Helper()
	data := filepath.Join(etcdDir, "data")
	if err := os.RemoveAll(data); err != nil {
		t.Fatal(err)
	}
	err := snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath: snapFile, Name: "etcd-0", OutputDataDir: data,
		PeerURLs: []string{"http://etcd-0:2380"}, InitialCluster: "etcd-0=http://etcd-0:2380", InitialClusterToken: "herald-e2e",
		RevisionBump: bump, MarkCompacted: bump > 0,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := filepath.Walk(data, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, etcdUID, etcdUID)
	}); err != nil {
		t.Fatal(err)
	}
}

func startRestoreInformers(t *testing.T, ctx context.Context, c *cluster, n int) []*restoreInformer {
	t.Helper()
	base, err := c.frontdoorURL(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	out := make([]*restoreInformer, n)
	for i := range out {
		cs, err := kubernetes.NewForConfig(&rest.Config{
			Host: base, BearerToken: c.token, TLSClientConfig: rest.TLSClientConfig{CAData: c.pki.CAPEM}, QPS: -1,
			Dial: (&net.Dialer{Timeout: 5 * time.Second}).DialContext, UserAgent: fmt.Sprintf("herald-restore-%d", i),
		})
		if err != nil {
			t.Fatal(err)
		}
		f := &restoreInformer{}
		f.inf = coreinformers.NewPodInformer(cs, metav1.NamespaceAll, 0, cache.Indexers{})
		f.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { f.record("ADDED", o) },
			UpdateFunc: func(_, o any) { f.record("MODIFIED", o) },
			DeleteFunc: func(o any) { f.record("DELETED", o) },
		})
		out[i] = f
		go f.inf.Run(stop)
	}
	waitFor(t, 2*time.Minute, "the informers to sync", func() bool {
		for _, f := range out {
			if !f.inf.HasSynced() {
				return false
			}
		}
		return true
	})
	return out
}

func lastRev(chs []checker.Change) int64 {
	if len(chs) == 0 {
		return 0
	}
	return chs[len(chs)-1].Rev
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// diff names up to five keys whose revisions differ (got/want; -1: absent).
func diff(got, want map[string]int64) []string {
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	for k := range want {
		if _, ok := got[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []string
	for _, k := range keys {
		g, ok1 := got[k]
		w, ok2 := want[k]
		if ok1 && ok2 && g == w {
			continue
		}
		if !ok1 {
			g = -1
		}
		if !ok2 {
			w = -1
		}
		out = append(out, fmt.Sprintf("%s %d/%d", k, g, w))
		if len(out) == 5 {
			break
		}
	}
	return out
}
