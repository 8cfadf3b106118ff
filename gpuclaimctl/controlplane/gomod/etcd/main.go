// Command etcd is the etcd server, built from its Go module at the version
// that the pinned Kubernetes release expects (kubeadm's DefaultEtcdVersion).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
