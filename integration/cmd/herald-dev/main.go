// Command herald-dev runs the whole Herald stack locally (`make run`):
// embedded etcd on 127.0.0.1:2379, embedded NATS JetStream on
// 127.0.0.1:4222, and every service as its own process, frontdoor on
// https://127.0.0.1:6443. State lives in --dir and survives a restart.
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

func run(dir, bin string, fanouts int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
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
	start := time.Now()
	s, err := stack.Start(ctx, stack.Options{
		Dir:           dir,
		BinDir:        bin,
		EtcdAddr:      "127.0.0.1:2379",
		NATSAddr:      "127.0.0.1:4222",
		FrontdoorAddr: "127.0.0.1:6443",
		InternalPorts: []int{9000, 7100, 9100, 7200, 9200, 9300},
		Fanouts:       fanouts,
	})
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(mustWd(), s.Kubeconfig)
	if err != nil {
		rel = s.Kubeconfig
	}
	fmt.Printf("herald is ready in %s: etcd %s, NATS %s, API %s — try: kubectl --kubeconfig %s get pods -A  (logs in %s, Ctrl-C stops)\n",
		time.Since(start).Round(100*time.Millisecond), s.EtcdEndpoint, s.NATSURL, s.FrontdoorURL, rel, filepath.Join(dir, "logs"))
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
