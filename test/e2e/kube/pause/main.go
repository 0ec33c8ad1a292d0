// Command pause is the process of every pod sandbox on the end-to-end
// tests' kubelet node, the image containerd's sandbox_image names: it holds
// the pod's namespaces until it is stopped, as registry.k8s.io/pause does,
// which cannot be pulled here.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// As PID 1 of its container it gets no signal it does not handle.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
