package cache

import (
	"fmt"
	"testing"

	"herald.dev/libs/kube"
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
		{Config{ShardMap: m, ShardTarget: "dns:///a:1"}, "9 resources, pods 8 partitions, nodes owned whole true"},
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
