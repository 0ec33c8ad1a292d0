//go:build tools

// The two KEDA binaries the end-to-end tests would start, which
// test/e2e/kube/build.sh builds from here in one go build (they share most
// of their packages): the operator, which turns a ScaledObject into an
// HPA, and the metrics API server (KEDA calls it the adapter), which serves
// external.metrics.k8s.io to that HPA. Not the admission webhooks
// (cmd/webhooks): they only validate ScaledObjects and ScaledJobs as they
// are written, and the operator works without them.
package main

import (
	_ "github.com/kedacore/keda/v2/cmd/adapter"
	_ "github.com/kedacore/keda/v2/cmd/operator"
)
