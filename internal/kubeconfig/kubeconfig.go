// Package kubeconfig finds the cluster a gpupool binary talks to.
package kubeconfig

import (
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Load is the cluster of the kubeconfig file at path or, with no path, the
// one the binary runs in, as its pod's ServiceAccount.
func Load(path string) (*rest.Config, error) {
	if path != "" {
		return clientcmd.BuildConfigFromFlags("", path)
	}
	return rest.InClusterConfig()
}
