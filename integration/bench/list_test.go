// Package bench holds Herald's whole-stack benchmarks (`make bench`). They
// start the real stack (embedded etcd and NATS, every service a process) and
// compare Herald with the baseline it replaces, in the same run.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"herald.dev/integration/stack"
	heraldv1 "herald.dev/libs/proto/herald/v1"
	"herald.dev/libs/service"
)

var binDir string

func TestMain(m *testing.M) { stack.RunTests(m, &binDir) }

// benchPod is a pod of about 1.3 KB, the size of a small real one.
func benchPod(ns, name string, i int) string {
	b, _ := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": ns, "uid": fmt.Sprintf("0000-%08d", i),
			"labels":            map[string]string{"app": fmt.Sprintf("app-%d", i%50), "tier": "web", "pod-template-hash": "5d8f7c9b6"},
			"creationTimestamp": "2026-01-01T00:00:00Z", "ownerReferences": []map[string]any{{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": fmt.Sprintf("app-%d-5d8f7c9b6", i%50), "uid": "abcd", "controller": true}}},
		"spec": map[string]any{"nodeName": fmt.Sprintf("node-%d", i%500), "schedulerName": "default-scheduler", "restartPolicy": "Always",
			"containers": []map[string]any{{"name": "app", "image": "registry.example/app:1.2.3", "ports": []map[string]any{{"containerPort": 8080, "protocol": "TCP"}},
				"resources": map[string]any{"requests": map[string]string{"cpu": "100m", "memory": "128Mi"}}, "env": []map[string]string{{"name": "MODE", "value": "production"}}}}},
		"status": map[string]any{"phase": "Running", "podIP": fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), "hostIP": "192.168.0.1",
			"conditions":        []map[string]string{{"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}},
			"containerStatuses": []map[string]any{{"name": "app", "ready": true, "restartCount": 0, "image": "registry.example/app:1.2.3", "started": true}}},
	})
	return string(b)
}

// BenchmarkList compares a full LIST of all pods served from Herald's cache
// (the cache's gRPC List, and the whole path through frontdoor's HTTPS) with
// a direct etcd range read of the same keys, at 10k and 100k pods, and
// reports the cache's heap per 10k pods.
func BenchmarkList(b *testing.B) {
	dir := b.TempDir()
	logs, _ := os.Create(dir + "/services.log")
	defer logs.Close()
	ctx := context.Background()
	s, err := stack.Start(ctx, stack.Options{Dir: dir, BinDir: binDir, Logs: logs})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.EtcdEndpoint}, DialTimeout: 5 * time.Second, MaxCallRecvMsgSize: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	conn, err := service.DialCache(s.Proc("cache-0").Addrs["grpc"], nil, 1<<30)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	cache := heraldv1.NewCacheClient(conn)
	httpc := s.HTTPClient()
	fmt.Printf("machine: %d CPUs, %s/%s\n", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)

	heap0 := heapInuse(b, s.Proc("cache-0"))
	loaded := 0
	for _, n := range []int{10_000, 100_000} {
		// Load up to n pods, 100 per transaction.
		for loaded < n {
			ops := make([]clientv3.Op, 0, 100)
			for range 100 {
				ns, name := fmt.Sprintf("ns-%d", loaded%100), fmt.Sprintf("pod-%06d", loaded)
				ops = append(ops, clientv3.OpPut("/registry/pods/"+ns+"/"+name, benchPod(ns, name, loaded)))
				loaded++
			}
			if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				b.Fatal(err)
			}
		}
		// Wait until the cache has them all.
		for {
			resp, err := cache.List(ctx, &heraldv1.ListRequest{Resource: "pods", Limit: 1})
			if err == nil && resp.RemainingItemCount != nil && *resp.RemainingItemCount+1 == int64(n) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		heap := heapInuse(b, s.Proc("cache-0"))
		fmt.Printf("%d pods: cache heap in use %.1f MiB, %.1f MiB per 10k pods\n", n, float64(heap)/(1<<20), float64(heap-heap0)/(1<<20)/float64(n/10_000))

		b.Run(fmt.Sprintf("pods=%d/etcd-range", n), func(b *testing.B) {
			for b.Loop() {
				resp, err := cli.Get(ctx, "/registry/pods/", clientv3.WithPrefix())
				if err != nil || len(resp.Kvs) != n {
					b.Fatalf("etcd: %v, %d keys", err, len(resp.Kvs))
				}
			}
		})
		b.Run(fmt.Sprintf("pods=%d/cache-grpc", n), func(b *testing.B) {
			for b.Loop() {
				resp, err := cache.List(ctx, &heraldv1.ListRequest{Resource: "pods", ResourceVersion: "0"})
				if err != nil || len(resp.Items) != n {
					b.Fatalf("cache: %v", err)
				}
			}
		})
		b.Run(fmt.Sprintf("pods=%d/cache-grpc-consistent", n), func(b *testing.B) {
			for b.Loop() {
				resp, err := cache.List(ctx, &heraldv1.ListRequest{Resource: "pods"})
				if err != nil || len(resp.Items) != n {
					b.Fatalf("cache: %v", err)
				}
			}
		})
		b.Run(fmt.Sprintf("pods=%d/frontdoor-https", n), func(b *testing.B) {
			for b.Loop() {
				resp, err := httpc.Get(s.FrontdoorURL + "/api/v1/pods?resourceVersion=0")
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("frontdoor: %d", resp.StatusCode)
				}
			}
		})
	}
}

// heapInuse forces a GC in the process (pprof's gc=1) and reads its heap in
// use from /metrics.
func heapInuse(b *testing.B, p *stack.Proc) uint64 {
	b.Helper()
	resp, err := http.Get("http://" + p.Admin + "/debug/pprof/heap?gc=1")
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	resp, err = http.Get("http://" + p.Admin + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "go_memstats_heap_inuse_bytes ") {
			v, _ := strconv.ParseFloat(strings.Fields(line)[1], 64)
			return uint64(v)
		}
	}
	b.Fatal("go_memstats_heap_inuse_bytes not found")
	return 0
}
