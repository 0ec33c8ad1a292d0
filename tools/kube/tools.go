//go:build tools

// Package kube pins the Kubernetes control plane the end-to-end tests run
// against; test/e2e/kube builds it from here (k8s.io/kubernetes cannot be a
// dependency of the main module: it replaces its staging modules locally).
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
