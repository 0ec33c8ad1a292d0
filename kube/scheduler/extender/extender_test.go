package scheduler

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/service/servicetest"
	"github.com/gpupool/gpupool/kube"
)

// The extender is a front end: what it answers is the placer's answer in
// the extender protocol's words. Most of the placer's tests call it
// through the extender, as kube-scheduler does (placer_test.go); these
// call the placer directly.

// TestPlacerFiltersAndBindsByName: Filter answers the lease's server among
// the named nodes, Bind writes the lease on the pod, and a pod the pool
// cannot place is a refusal, not an error to retry.
func TestPlacerFiltersAndBindsByName(t *testing.T) {
	pod, big := testPod("trainer-0", half), testPod("big", kube.Request{GPUAmount: 2})
	te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-a", 1), servicetest.Server("gpu-b", 1)}, nil, pod, big)
	ctx := context.Background()
	ref := PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	server, err := te.Filter(ctx, ref, []string{"gpu-b"})
	if err != nil || server != "gpu-b" {
		t.Fatalf("Filter: %q, %v; want gpu-b", server, err)
	}
	if err := te.Bind(ctx, ref, "gpu-b"); err != nil {
		t.Fatal(err)
	}
	held := te.leases(t, pod)
	if b := te.bindings(); len(b) != 1 || len(held) != 1 || b[0].Annotations[kube.AnnotationLease] != held[0].ID || b[0].Target.Name != "gpu-b" {
		t.Errorf("bindings %+v, leases %+v: want one Binding to gpu-b with the pod's one lease", b, held)
	}
	if server, err := te.Filter(ctx, PodRef{Namespace: big.Namespace, Name: big.Name, UID: big.UID}, []string{"gpu-a", "gpu-b"}); server != "" || !errors.As(err, new(*refusal)) {
		t.Errorf("Filter of a pod the pool cannot place: %q, %v; want a refusal", server, err)
	}
	if server, err := te.Filter(ctx, ref, nil); server != "" || err != nil {
		t.Errorf("Filter among no nodes: %q, %v; want nothing, no error", server, err)
	}
}

// TestExtenderSpeaksThePlacersAnswers: the filter answers the placer's
// server as the only node, its refusal as every node failed, unresolvable,
// with the reason.
func TestExtenderSpeaksThePlacersAnswers(t *testing.T) {
	pod, big := testPod("trainer-0", half), testPod("big", kube.Request{GPUAmount: 2})
	te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-a", 1)}, nil)
	placedOn(t, te.callFilter(t, pod, "gpu-a", "cpu-0"), "gpu-a")
	res := te.callFilter(t, big, "gpu-a", "cpu-0")
	nodes := make([]string, 0, len(res.FailedAndUnresolvableNodes))
	for n, why := range res.FailedAndUnresolvableNodes {
		if why == "" {
			t.Errorf("%s failed without a reason", n)
		}
		nodes = append(nodes, n)
	}
	if slices.Sort(nodes); res.Error != "" || !slices.Equal(nodes, []string{"cpu-0", "gpu-a"}) {
		t.Errorf("filter of a pod the pool cannot place answered %+v, want every node failed", res)
	}
	var none extenderv1.ExtenderFilterResult
	te.call(t, verbFilter, mustJSON(t, extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{}}), &none)
	if none.Error != "" || none.NodeNames == nil || len(*none.NodeNames) != 0 {
		t.Errorf("filter among no nodes answered %+v, want no node", none)
	}
}

// TestUnreadableCallIsAnError: a body that is not the extender arguments
// is answered 200 with the cause as the Error, so that kube-scheduler's
// event says it, and counted as an error.
func TestUnreadableCallIsAnError(t *testing.T) {
	te := newTestPlacer(t, nil, nil)
	var res extenderv1.ExtenderBindingResult
	te.call(t, verbBind, []byte(`{"PodName": 7}`), &res)
	if want := "gpupool scheduler: the bind call: json: cannot unmarshal number into Go struct field ExtenderBindingArgs.PodName of type string"; res.Error != want {
		t.Errorf("bind answered %q, want %q", res.Error, want)
	}
	if n := testutil.ToFloat64(te.metrics.requests.WithLabelValues(verbBind, string(resultError))); n != 1 {
		t.Errorf("bind errors counted %v, want 1", n)
	}
}
