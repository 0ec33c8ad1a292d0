// Package kubeconfig finds the cluster a gpupool binary talks to.
package kubeconfig

import (
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Load is the cluster of the kubeconfig file at path or, with no path, the
// one the binary runs in, as its pod's ServiceAccount.
//
// It speaks protobuf, as kube-scheduler and the kubelet do: kube-apiserver
// then encodes each pod event once for every watcher, where a JSON watcher
// costs it an encoding of its own, and decoding costs the binary less. The
// gpupool binaries read built-in types only, which all have protobuf.
func Load(path string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if path != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, err
	}
	cfg.ContentType = protobuf
	cfg.AcceptContentTypes = protobuf + ",application/json"
	return cfg, nil
}

const protobuf = "application/vnd.kubernetes.protobuf"
