package checker

import (
	"context"
	"reflect"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"herald.dev/integration/stack"
)

// startEtcd starts an embedded etcd for one test, the way the stack does,
// and returns a client of it.
func startEtcd(t *testing.T) *clientv3.Client {
	t.Helper()
	e, endpoint, err := stack.StartEtcd(t.TempDir(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestEtcdHistory reads etcd's history back over ranges that end on a
// change under the prefix, on a change outside it, and hold no change at
// all: each read returns exactly the changes under the prefix in range, and
// returns (a watch that catches up without an event at to must still learn
// that it reached to).
func TestEtcdHistory(t *testing.T) {
	cli := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	write := func(ops ...clientv3.Op) int64 {
		t.Helper()
		r, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	put, del := clientv3.OpPut, clientv3.OpDelete
	a1 := write(put("/registry/pods/a/1", "one"))
	a2 := write(put("/registry/pods/a/2", "two"))
	other := write(put("/registry/nodes/n", "node"))
	a1again := write(put("/registry/pods/a/1", "one again"))
	gone := write(del("/registry/pods/a/2"))
	txn := write(put("/registry/pods/b/1", "b1"), put("/registry/pods/a/3", "a3"))
	last := write(put("/registry/nodes/m", "node"))

	all := []Change{
		{Rev: a1, Key: "/registry/pods/a/1", Value: "one"},
		{Rev: a2, Key: "/registry/pods/a/2", Value: "two"},
		{Rev: a1again, Key: "/registry/pods/a/1", Value: "one again"},
		{Rev: gone, Key: "/registry/pods/a/2", Delete: true},
		{Rev: txn, Key: "/registry/pods/b/1", Value: "b1"},
		{Rev: txn, Key: "/registry/pods/a/3", Value: "a3"},
	}
	cases := []struct {
		name     string
		prefix   string
		from, to int64
		want     []Change
	}{
		{"ends on a change under the prefix", "/registry/pods/", a1, gone, all[:4]},
		{"ends on a change outside the prefix", "/registry/pods/", a1, other, all[:2]},
		{"ends after the last change under the prefix", "/registry/pods/", a1, last, all},
		{"no change in range", "/registry/pods/", other, other, nil},
		{"one revision", "/registry/pods/", a2, a2, all[1:2]},
		{"a namespace", "/registry/pods/a/", a2, last, []Change{all[1], all[2], all[3], all[5]}},
		{"a transaction's changes in its order", "/registry/pods/", txn, txn, all[4:]},
		{"empty range", "/registry/pods/", gone, a1, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			got, err := EtcdHistory(ctx, cli, c.prefix, c.from, c.to)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("EtcdHistory(%s, %d, %d) = %v, want %v", c.prefix, c.from, c.to, got, c.want)
			}
		})
	}

	t.Run("compacted", func(t *testing.T) {
		if _, err := cli.Compact(ctx, last); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := EtcdHistory(ctx, cli, "/registry/pods/", a1, last); err == nil {
			t.Error("EtcdHistory over compacted revisions returned no error")
		}
	})
}
