// Command herald-seed writes sample objects straight into etcd under the
// Kubernetes key layout, as kube-apiserver would store them, and can keep
// changing them: a way to see Herald work without a Kubernetes control
// plane (`make seed`).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func main() {
	endpoint := flag.String("etcd", "http://127.0.0.1:2379", "etcd client URL.")
	pods := flag.Int("pods", 20, "Pods to create.")
	nodes := flag.Int("nodes", 3, "Nodes to create.")
	churn := flag.Duration("churn", 0, "Keep updating random pods at this interval until Ctrl-C (0: write once and exit).")
	flag.Parse()
	if err := run(*endpoint, *pods, *nodes, *churn); err != nil {
		fmt.Fprintln(os.Stderr, "herald-seed:", err)
		os.Exit(1)
	}
}

// Pod builds a pod object as stored in etcd (no resourceVersion).
func Pod(ns, name, node, phase string, restarts int) []byte {
	b, _ := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": ns, "uid": fmt.Sprintf("uid-%s-%s", ns, name),
			"labels": map[string]string{"app": strings.TrimRight(strings.TrimRight(name, "0123456789"), "-")}, "creationTimestamp": time.Now().UTC().Format(time.RFC3339)},
		"spec":   map[string]any{"nodeName": node, "containers": []map[string]any{{"name": "main", "image": "registry.example/app:1"}}},
		"status": map[string]any{"phase": phase, "containerStatuses": []map[string]any{{"name": "main", "ready": phase == "Running", "restartCount": restarts}}},
	})
	return b
}

func run(endpoint string, pods, nodes int, churn time.Duration) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	for i := range nodes {
		name := fmt.Sprintf("node-%d", i)
		b, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Node",
			"metadata": map[string]any{"name": name, "creationTimestamp": time.Now().UTC().Format(time.RFC3339)}})
		// kube-apiserver keeps Nodes under their historical key, minions.
		if _, err := cli.Put(ctx, "/registry/minions/"+name, string(b)); err != nil {
			return err
		}
	}
	namespaces := []string{"default", "kube-system", "team-a"}
	for i := range pods {
		ns := namespaces[i%len(namespaces)]
		name := fmt.Sprintf("web-%02d", i)
		if _, err := cli.Put(ctx, "/registry/pods/"+ns+"/"+name, string(Pod(ns, name, fmt.Sprintf("node-%d", i%max(nodes, 1)), "Running", 0))); err != nil {
			return err
		}
	}
	fmt.Printf("wrote %d nodes and %d pods\n", nodes, pods)
	if churn <= 0 {
		return nil
	}
	t := time.NewTicker(churn)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		i := rand.IntN(max(pods, 1))
		ns := namespaces[i%len(namespaces)]
		name := fmt.Sprintf("web-%02d", i)
		if _, err := cli.Put(ctx, "/registry/pods/"+ns+"/"+name, string(Pod(ns, name, fmt.Sprintf("node-%d", i%max(nodes, 1)), "Running", n))); err != nil {
			return err
		}
	}
}
