// Command etcd is etcd's own server entry point (go.etcd.io/etcd/server/v3
// etcdmain), built as a static binary for Herald's FROM-scratch test and
// deployment images. It adds nothing: flags and behaviour are etcd's.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
