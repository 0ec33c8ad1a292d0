// Package kubetest holds what the tests of gpupool's Kubernetes components
// share.
package kubetest

import (
	"context"
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
)

// Acquire takes pod's lease on node as the scheduler extender does, with
// an admin client of the allocator, and writes the lease's annotations on
// pod, as binding it does.
func Acquire(ctx context.Context, t testing.TB, admin *client.Client, pod *corev1.Pod, node string) api.Lease {
	t.Helper()
	req, err := kube.LeaseRequest(pod, []string{node})
	if err != nil {
		t.Fatal(err)
	}
	l, err := admin.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(pod.Annotations, kube.LeaseAnnotations(&l))
	return l
}
