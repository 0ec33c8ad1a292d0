package extender

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/allocator/service/servicetest"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/scheduler"
	"github.com/gpupool/gpupool/kube/scheduler/schedulertest"
)

// The extender is a front end: what it answers is the placer's answer in
// the extender protocol's words, and it acts on the pod as kube-apiserver
// has it, never as the call describes it. These tests call it over HTTP,
// as kube-scheduler does; the placer's own are package scheduler's.

var (
	testPod = schedulertest.Pod
	half    = schedulertest.Half
)

// testExtender is an extender over a placer on a real allocator and a fake
// cluster.
type testExtender struct {
	ext     *Extender
	handler http.Handler
	alloc   *client.Client
	kube    *schedulertest.Cluster
	reg     *prometheus.Registry
}

func newTestExtender(t *testing.T, servers []api.Server) *testExtender {
	t.Helper()
	a := servicetest.Start(t, nil)
	a.Register(t, servers)
	return newExtenderOn(a.Client(t))
}

func newExtenderOn(alloc *client.Client, pods ...runtime.Object) *testExtender {
	te := &testExtender{alloc: alloc, kube: schedulertest.NewCluster(pods...), reg: prometheus.NewRegistry()}
	te.ext = New(scheduler.New(scheduler.Config{Allocator: alloc, Kube: te.kube, Registry: te.reg}), logr.Discard())
	te.handler = te.ext.Handler()
	return te
}

// call posts body to the extender as kube-scheduler does and decodes the
// answer, which must be 200.
func (te *testExtender) call(t testing.TB, verb string, body []byte, answer any) {
	t.Helper()
	rec := httptest.NewRecorder()
	te.handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/"+verb, bytes.NewReader(body)))
	if rec.Code != http.StatusOK {
		t.Fatalf("%s answered %d: %s", verb, rec.Code, rec.Body)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), answer); err != nil {
		t.Fatalf("%s answered %q: %v", verb, rec.Body, err)
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// callFilter filters pod, made kube-apiserver's copy, among nodes.
func (te *testExtender) callFilter(t *testing.T, pod *v1.Pod, nodes ...string) extenderv1.ExtenderFilterResult {
	t.Helper()
	te.kube.Put(t, pod)
	return te.filterAsCaller(t, pod, nodes...)
}

// filterAsCaller posts a filter call describing pod, without making it
// kube-apiserver's copy.
func (te *testExtender) filterAsCaller(t *testing.T, pod *v1.Pod, nodes ...string) extenderv1.ExtenderFilterResult {
	t.Helper()
	var res extenderv1.ExtenderFilterResult
	te.call(t, scheduler.VerbFilter, mustJSON(t, extenderv1.ExtenderArgs{Pod: pod, NodeNames: &nodes}), &res)
	return res
}

func (te *testExtender) callBind(t *testing.T, pod *v1.Pod, node string) extenderv1.ExtenderBindingResult {
	t.Helper()
	var res extenderv1.ExtenderBindingResult
	te.call(t, scheduler.VerbBind, mustJSON(t, extenderv1.ExtenderBindingArgs{PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: pod.UID, Node: node}), &res)
	return res
}

func (te *testExtender) leases(t *testing.T, pod *v1.Pod) []api.Lease {
	t.Helper()
	return schedulertest.Leases(t, te.alloc, pod)
}

// bound filters and binds pod to node through the extender.
func (te *testExtender) bound(t *testing.T, pod *v1.Pod, node string) api.Lease {
	t.Helper()
	placedOn(t, te.callFilter(t, pod, node), node)
	if res := te.callBind(t, pod, node); res.Error != "" {
		t.Fatalf("bind: %s", res.Error)
	}
	held := te.leases(t, pod)
	if len(held) != 1 {
		t.Fatalf("the bound pod holds %d leases, want 1", len(held))
	}
	return held[0]
}

// placedOn checks that the filter answered node as the only one.
func placedOn(t *testing.T, res extenderv1.ExtenderFilterResult, node string) {
	t.Helper()
	if res.Error != "" || res.NodeNames == nil || !slices.Equal(*res.NodeNames, []string{node}) {
		t.Fatalf("filter answered %+v, want node %s alone", res, node)
	}
}

// TestExtenderSpeaksThePlacersAnswers: the filter answers the placer's
// server as the only node, its refusal as every node failed, unresolvable,
// with the reason, and no node as none; the bind binds.
func TestExtenderSpeaksThePlacersAnswers(t *testing.T) {
	pod, big := testPod("trainer-0", half), testPod("big", kube.Request{GPUAmount: 2})
	te := newTestExtender(t, []api.Server{servicetest.Server("gpu-a", 1)})
	placedOn(t, te.callFilter(t, pod, "gpu-a", "cpu-0"), "gpu-a")
	if res := te.callBind(t, pod, "gpu-a"); res.Error != "" || len(te.kube.Bindings()) != 1 {
		t.Errorf("bind answered %+v with %d Bindings, want the pod bound", res, len(te.kube.Bindings()))
	}
	res := te.callFilter(t, big, "gpu-a", "cpu-0")
	nodes := make([]string, 0, len(res.FailedAndUnresolvableNodes))
	for n, why := range res.FailedAndUnresolvableNodes {
		if !strings.HasPrefix(why, "gpupool allocator: no server has 2 free GPUs") {
			t.Errorf("%s failed with %q, want the pool's reason", n, why)
		}
		nodes = append(nodes, n)
	}
	if slices.Sort(nodes); res.Error != "" || !slices.Equal(nodes, []string{"cpu-0", "gpu-a"}) {
		t.Errorf("filter of a pod the pool cannot place answered %+v, want every node failed", res)
	}
	if none := te.callFilter(t, pod, []string{}...); none.Error != "" || none.NodeNames == nil || len(*none.NodeNames) != 0 {
		t.Errorf("filter among no nodes answered %+v, want no node", none)
	}
}

// TestUnreadableCallIsAnError: a body that is not the extender arguments,
// or arguments kube-scheduler was configured wrongly for, is answered 200
// with the cause as the Error, so that kube-scheduler's event says it,
// counted as an error, and takes no lease.
func TestUnreadableCallIsAnError(t *testing.T) {
	pod := testPod("trainer-0", half)
	for _, tc := range []struct {
		name, verb string
		body       []byte
		err        string
	}{
		{name: "not the arguments", verb: scheduler.VerbBind, body: []byte(`{"PodName": 7}`),
			err: "gpupool scheduler: the bind call: json: cannot unmarshal number into Go struct field ExtenderBindingArgs.PodName of type string"},
		{name: "whole nodes sent", verb: scheduler.VerbFilter,
			body: mustJSON(t, extenderv1.ExtenderArgs{Pod: pod, Nodes: &v1.NodeList{Items: []v1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "gpu-a"}}}}}),
			err:  "gpupool scheduler: kube-scheduler sent nodes, not node names: set nodeCacheCapable: true"},
		{name: "no pod", verb: scheduler.VerbFilter, body: mustJSON(t, extenderv1.ExtenderArgs{NodeNames: &[]string{"gpu-a"}}),
			err: "gpupool scheduler: the filter call names no pod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			te := newTestExtender(t, []api.Server{servicetest.Server("gpu-a", 1)})
			te.kube.Put(t, pod)
			var res struct{ Error string }
			te.call(t, tc.verb, tc.body, &res)
			if !strings.HasPrefix(res.Error, tc.err) {
				t.Errorf("%s answered %q, want %q", tc.verb, res.Error, tc.err)
			}
			if n := errorsCounted(t, te.reg, tc.verb); n != 1 {
				t.Errorf("%s errors counted %v, want 1", tc.verb, n)
			}
			if held := te.leases(t, pod); len(held) > 0 {
				t.Errorf("an unreadable call took %+v", held)
			}
		})
	}
}

// errorsCounted is bitfusion_extender_requests_total{verb, result="error"}.
func errorsCounted(t *testing.T, reg *prometheus.Registry, verb string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "bitfusion_extender_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["verb"] == verb && labels["result"] == "error" {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no bitfusion_extender_requests_total{verb=%q,result=\"error\"}", verb)
	return 0
}

// TestFilterReadsTheRequestFromTheCluster: a call that describes a bound
// pod with a smaller request, or a pod that does not exist, changes no
// lease and takes none.
func TestFilterReadsTheRequestFromTheCluster(t *testing.T) {
	te := newTestExtender(t, []api.Server{servicetest.Server("gpu-0", 1), servicetest.Server("gpu-1", 1)})
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

// TestFilterAmongManyNodes: a pod among every node of a 10,000- or a
// 100,000-node cluster is placed on the pool's one GPU server among them.
func TestFilterAmongManyNodes(t *testing.T) {
	for _, n := range []int{6000, 10_000, 100_000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			te := newTestExtender(t, []api.Server{servicetest.Server("gpu-0", 1)})
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
	te := newTestExtender(t, []api.Server{servicetest.Server("gpu-0", 1)})
	pod := testPod("trainer-0", half)
	te.kube.Put(t, pod)
	for _, name := range []string{strings.Repeat("a", 3_500_000), strings.Repeat("a", 254), "GPU-0", "gpu_0", ""} {
		body, err := json.Marshal(extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{"gpu-0", name}})
		if err != nil {
			t.Fatal(err)
		}
		var res extenderv1.ExtenderFilterResult
		te.call(t, scheduler.VerbFilter, body, &res)
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
