//go:build tools

// The rest of the Kubernetes release this module pins, which the end-to-end
// tests start (test/e2e/kube/build.sh builds them from here): one
// dependency graph for them and for gpupool-kube-scheduler, so that each
// package of it is compiled once.
package main

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
