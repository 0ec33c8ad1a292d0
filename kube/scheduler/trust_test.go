package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/service/servicetest"
)

// The placer acts on the pod as kube-apiserver has it, never as a caller
// describes it: whoever reaches a front end must not move, shrink or take
// a lease by describing a pod.

// TestFilterNeverMovesABoundPodsLease: a filter for a bound pod's UID
// listing another node leaves its lease where the pod runs.
func TestFilterNeverMovesABoundPodsLease(t *testing.T) {
	te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-0", 1), servicetest.Server("gpu-1", 1)}, nil)
	pod := testPod("trainer-0", half)
	lease := te.bound(t, pod, "gpu-0")

	node, err := te.Filter(context.Background(), ref(pod), []string{"gpu-1"})
	if node != "" || err == nil || !strings.Contains(err.Error(), "is bound to gpu-0") {
		t.Errorf("filter of a bound pod answered %q, %v; want an error saying it is bound", node, err)
	}
	if held := te.leases(t, pod); len(held) != 1 || held[0].ID != lease.ID {
		t.Errorf("the bound pod holds %+v, want its lease %s alone", held, lease.ID)
	}
}

// TestFilterLeavesALeaseABindIsWriting: kube-scheduler gives up a bind
// after its httpTimeout and filters the pod again while the first bind
// may still land; that filter must not release the lease being bound, and
// the pod ends bound with the lease the allocator holds for it.
func TestFilterLeavesALeaseABindIsWriting(t *testing.T) {
	te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-0", 1), servicetest.Server("gpu-1", 1)}, nil)
	pod := testPod("trainer-0", half)
	placedOn(t, te.callFilter(t, pod, "gpu-0"), "gpu-0")
	lease := te.leases(t, pod)[0]

	binding, release := make(chan struct{}), make(chan struct{})
	te.kube.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "binding" {
			close(binding)
			<-release
		}
		return false, nil, nil // on to the reactor that binds
	})
	bound := make(chan error)
	go func() { bound <- te.callBind(pod, "gpu-0") }()
	<-binding
	answered := make(chan filtered)
	go func() {
		node, err := te.Filter(context.Background(), ref(pod), []string{"gpu-1"})
		answered <- filtered{node, err}
	}()
	select {
	case got := <-answered:
		t.Fatalf("a filter during the pod's bind answered %q, %v before the bind ended", got.node, got.err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-bound; err != nil {
		t.Fatalf("bind: %v", err)
	}
	if got := <-answered; got.node != "" || got.err == nil {
		t.Errorf("the filter after the bind answered %q, %v; want an error", got.node, got.err)
	}
	if held := te.leases(t, pod); len(held) != 1 || held[0].ID != lease.ID {
		t.Errorf("after the bind and the filter the pod holds %+v, want %s alone", held, lease.ID)
	}
}

// TestFilterAmongNoNodesPlacesNowhere: no feasible node is no lease.
func TestFilterAmongNoNodesPlacesNowhere(t *testing.T) {
	te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-0", 1)}, nil)
	pod := testPod("trainer-0", half)
	if got := te.callFilter(t, pod); got.node != "" || got.err != nil {
		t.Errorf("filter among no nodes answered %q, %v; want no node and no error", got.node, got.err)
	}
	if held := te.leases(t, pod); len(held) > 0 {
		t.Errorf("filter among no nodes took %+v", held)
	}
}
