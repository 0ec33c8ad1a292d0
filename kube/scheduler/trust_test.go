package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/service/servicetest"
	"github.com/gpupool/gpupool/kube"
)

// The extender acts on the pod as kube-apiserver has it, never as the call
// describes it: whoever reaches /filter must not move, shrink or take a
// lease by describing a pod.

// bound binds pod to node through the extender, and makes the cluster's
// copy say so, as kube-apiserver does on a Binding.
func (te *testPlacer) bound(t *testing.T, pod *v1.Pod, node string) api.Lease {
	t.Helper()
	placedOn(t, te.callFilter(t, pod, node), node)
	if res := te.callBind(t, pod, node); res.Error != "" {
		t.Fatalf("bind: %s", res.Error)
	}
	held := te.leases(t, pod)
	if len(held) != 1 {
		t.Fatalf("the bound pod holds %d leases, want 1", len(held))
	}
	live := pod.DeepCopy()
	live.Spec.NodeName = node
	live.Annotations[kube.AnnotationLease] = held[0].ID
	if _, err := te.kube.CoreV1().Pods(pod.Namespace).Update(context.Background(), live, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return held[0]
}

// filterAsCaller posts a filter call describing pod, without making it
// kube-apiserver's copy.
func (te *testPlacer) filterAsCaller(t *testing.T, pod *v1.Pod, nodes ...string) extenderv1.ExtenderFilterResult {
	t.Helper()
	var res extenderv1.ExtenderFilterResult
	te.call(t, verbFilter, mustJSON(t, extenderv1.ExtenderArgs{Pod: pod, NodeNames: &nodes}), &res)
	return res
}

// TestFilterNeverMovesABoundPodsLease: a filter for a bound pod's UID
// listing another node leaves its lease where the pod runs.
func TestFilterNeverMovesABoundPodsLease(t *testing.T) {
	te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-0", 1), servicetest.Server("gpu-1", 1)}, nil)
	pod := testPod("trainer-0", half)
	lease := te.bound(t, pod, "gpu-0")

	res := te.filterAsCaller(t, pod, "gpu-1")
	if res.NodeNames != nil && len(*res.NodeNames) > 0 || !strings.Contains(res.Error, "is bound to gpu-0") {
		t.Errorf("filter of a bound pod answered %+v, want an error saying it is bound", res)
	}
	if held := te.leases(t, pod); len(held) != 1 || held[0].ID != lease.ID {
		t.Errorf("the bound pod holds %+v, want its lease %s alone", held, lease.ID)
	}
}

// TestFilterReadsTheRequestFromTheCluster: a call that describes a bound
// pod with a smaller request, or a pod that does not exist, changes no
// lease and takes none.
func TestFilterReadsTheRequestFromTheCluster(t *testing.T) {
	te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-0", 1), servicetest.Server("gpu-1", 1)}, nil)
	pod := testPod("trainer-0", kube.Request{GPUAmount: 1, GPUPercent: 10})
	lease := te.bound(t, pod, "gpu-0")

	smaller := pod.DeepCopy()
	smaller.Annotations[kube.AnnotationRequest] = kube.Request{GPUAmount: 1, GPUPercent: 1}.Annotation()
	te.filterAsCaller(t, smaller, "gpu-0", "gpu-1")
	if held := te.leases(t, pod); len(held) != 1 || held[0].ID != lease.ID || held[0].GPUs[0].Percent != 10 {
		t.Errorf("after a filter describing 1%% the pod holds %+v, want its 10%% lease %s", held, lease.ID)
	}

	forged := testPod("nobody", kube.Request{GPUAmount: 1})
	forged.Namespace = "team-b"
	res := te.filterAsCaller(t, forged, "gpu-1")
	if !strings.Contains(res.Error, "no pod team-b/nobody with UID uid-nobody in the cluster") {
		t.Errorf("filter of a pod that does not exist answered %+v, want an error saying so", res)
	}
	if held := te.leases(t, forged); len(held) > 0 {
		t.Errorf("a pod that does not exist got leases %+v", held)
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
	bound := make(chan extenderv1.ExtenderBindingResult)
	go func() {
		var res extenderv1.ExtenderBindingResult
		te.call(t, verbBind, mustJSON(t, extenderv1.ExtenderBindingArgs{PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: pod.UID, Node: "gpu-0"}), &res)
		bound <- res
	}()
	<-binding
	filtered := make(chan extenderv1.ExtenderFilterResult)
	go func() { filtered <- te.filterAsCaller(t, pod, "gpu-1") }()
	select {
	case res := <-filtered:
		t.Fatalf("a filter during the pod's bind answered %+v before the bind ended", res)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if res := <-bound; res.Error != "" {
		t.Fatalf("bind: %s", res.Error)
	}
	res := <-filtered
	if res.NodeNames != nil && len(*res.NodeNames) > 0 || res.Error == "" {
		t.Errorf("the filter after the bind answered %+v, want an error", res)
	}
	if held := te.leases(t, pod); len(held) != 1 || held[0].ID != lease.ID {
		t.Errorf("after the bind and the filter the pod holds %+v, want %s alone", held, lease.ID)
	}
}

// TestFilterAmongNoNodesPlacesNowhere: no feasible node is no lease.
func TestFilterAmongNoNodesPlacesNowhere(t *testing.T) {
	te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-0", 1)}, nil)
	pod := testPod("trainer-0", half)
	res := te.callFilter(t, pod, []string{}...)
	if res.Error != "" || res.NodeNames == nil || len(*res.NodeNames) != 0 {
		t.Errorf("filter among no nodes answered %+v, want no node", res)
	}
	if held := te.leases(t, pod); len(held) > 0 {
		t.Errorf("filter among no nodes took %+v", held)
	}
}

// TestFilterAmongManyNodes: a pod among every node of a 10,000- or a
// 100,000-node cluster is placed on the pool's one GPU server among them.
func TestFilterAmongManyNodes(t *testing.T) {
	for _, n := range []int{6000, 10_000, 100_000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-0", 1)}, nil)
			nodes := make([]string, n)
			for i := range nodes {
				nodes[i] = fmt.Sprintf("node-%06d.example.internal", i)
			}
			nodes[n/2] = "gpu-0"
			placedOn(t, te.callFilter(t, testPod("trainer-0", half), nodes...), "gpu-0")
		})
	}
}

// TestNodeNamesRefusesWhatIsNoNodeName: a name no node can have is refused,
// naming it (shortened) and the rule, and is not kept: the names seen stay
// bounded by what nodes can be called.
func TestNodeNamesRefusesWhatIsNoNodeName(t *testing.T) {
	te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-0", 1)}, nil)
	pod := testPod("trainer-0", half)
	te.inCluster(t, pod)
	for _, name := range []string{strings.Repeat("a", 3_500_000), strings.Repeat("a", 254), "GPU-0", "gpu_0", ""} {
		body, err := json.Marshal(extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{"gpu-0", name}})
		if err != nil {
			t.Fatal(err)
		}
		var res extenderv1.ExtenderFilterResult
		te.call(t, verbFilter, body, &res)
		if !strings.Contains(res.Error, "is not a node name") || len(res.Error) > 400 {
			t.Errorf("a filter naming %.20q (%d bytes) answered %.300q, want it refused as no node name", name, len(name), res.Error)
		}
	}
	if n := len(te.ext.names.names); n != 1 {
		t.Errorf("the extender keeps %d names, want gpu-0 alone", n)
	}
	if held := te.leases(t, pod); len(held) > 0 {
		t.Errorf("a refused call took %+v", held)
	}
}
