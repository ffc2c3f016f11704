package cache

import (
	"fmt"
	"strings"
	"testing"

	"herald.dev/libs/kube"
	"herald.dev/libs/service"
)

func TestOwnership(t *testing.T) {
	reg, err := kube.NewRegistry(kube.DefaultPrefix, kube.DefaultResources())
	if err != nil {
		t.Fatal(err)
	}
	const m = "pods/0-7=dns:///a:1;pods/8-15=dns:///b:1;*=dns:///a:1"
	describe := func(c Config) string {
		o, err := c.ownership(reg)
		if err != nil {
			return "error: " + err.Error()
		}
		if o == nil {
			return "all"
		}
		nodes, owned := o["nodes"]
		return fmt.Sprint(len(o), " resources, pods ", len(o["pods"]), " partitions, nodes owned whole ", owned && nodes == nil)
	}
	tests := []struct {
		cfg  Config
		want string
	}{
		{Config{}, "all"},
		{Config{ShardMap: m, ShardTarget: "dns:///a:1"}, fmt.Sprint(len(reg.Resources()), " resources, pods 8 partitions, nodes owned whole true")},
		{Config{ShardMap: m, ShardTarget: "dns:///b:1"}, "1 resources, pods 8 partitions, nodes owned whole false"},
		{Config{ShardMap: m, ShardTarget: "dns:///c:1"}, `error: shard.target "dns:///c:1" owns nothing in cache.shards`},
		{Config{Resources: "pods", Partitions: "0-3"}, "1 resources, pods 4 partitions, nodes owned whole false"},
	}
	for _, tt := range tests {
		if got := describe(tt.cfg); got != tt.want {
			t.Errorf("%+v: %s, want %s", tt.cfg, got, tt.want)
		}
	}
}

// A cache serving gRPC over TLS without a client CA would serve anyone who
// reaches the port as a trusted internal peer: it refuses to start, and the
// error names the flag to set. etcd and NATS settings are checked too.
func TestRefusesUnsafeInternals(t *testing.T) {
	for args, want := range map[string]string{ // "": starts
		"--grpc.tls.cert-file=c --grpc.tls.key-file=k --grpc.tls.client-ca-file=ca": "",
		"--grpc.tls.cert-file=c --grpc.tls.key-file=k":                              "grpc.tls.client-ca-file is required with grpc.tls.cert-file",
		"--etcd.tls.ca-file=ca":    "etcd.endpoints: http://127.0.0.1:2379 is plaintext but etcd.tls.* is set",
		"--nats.user=herald-cache": "nats.user and nats.password-file go together",
	} {
		if _, err := service.Configure("cache", &Config{}, strings.Fields(args)); (err == nil) != (want == "") || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", args, err, want)
		}
	}
}
