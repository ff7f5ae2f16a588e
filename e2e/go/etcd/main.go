// Command etcd is upstream's etcd server: etcd's own server/main.go, as a module of ours so
// that go.sum pins the version the Kubernetes client uses.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
