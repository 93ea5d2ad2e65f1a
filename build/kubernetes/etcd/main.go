// Command etcd is etcd's own server, built at the version Kubernetes pins,
// for the end-to-end test's API server.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
