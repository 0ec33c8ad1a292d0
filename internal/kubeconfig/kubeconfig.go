// Package kubeconfig finds the cluster a gpupool binary talks to.
package kubeconfig

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
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

// Client is the clientset of a service's --kubeconfig (Load's cluster),
// calling itself userAgent; tune, when not nil, sets more of the config
// first (the rate of requests). Each error is the command line's and names
// --kubeconfig.
func Client(path, userAgent string, tune func(*rest.Config)) (*kubernetes.Clientset, error) {
	cfg, err := Load(path)
	if err != nil {
		return nil, fmt.Errorf("no cluster (--kubeconfig, or run in a pod): %w", err)
	}
	cfg.UserAgent = userAgent
	if tune != nil {
		tune(cfg)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	return c, nil
}

const protobuf = "application/vnd.kubernetes.protobuf"
