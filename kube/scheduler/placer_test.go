package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/allocator/service/servicetest"
	"github.com/gpupool/gpupool/internal/metricstest"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/scheduler/schedulertest"
)

var (
	testPod  = schedulertest.Pod
	requests = schedulertest.Requests
	half     = schedulertest.Half
)

// testPlacer is a placer on a real allocator and a fake cluster.
type testPlacer struct {
	*Placer
	alloc *client.Client
	kube  *schedulertest.Cluster
	reg   *prometheus.Registry
}

// newTestPlacer is a placer on an allocator with the servers and quotas
// given, and a cluster holding pods.
func newTestPlacer(t *testing.T, servers []api.Server, quotas map[string]allocator.Share, pods ...runtime.Object) *testPlacer {
	t.Helper()
	a := servicetest.Start(t, quotas)
	a.Register(t, servers)
	return newPlacerOn(a.Client(t), pods...)
}

func newPlacerOn(alloc *client.Client, pods ...runtime.Object) *testPlacer {
	te := &testPlacer{alloc: alloc, kube: schedulertest.NewCluster(pods...), reg: prometheus.NewRegistry()}
	te.Placer = New(Config{Allocator: alloc, Kube: te.kube, Registry: te.reg})
	return te
}

// filtered is what Filter answered.
type filtered struct {
	node string
	err  error
}

// callFilter filters pod, made kube-apiserver's copy, among nodes.
func (te *testPlacer) callFilter(t *testing.T, pod *v1.Pod, nodes ...string) filtered {
	t.Helper()
	te.kube.Put(t, pod)
	node, err := te.Filter(context.Background(), ref(pod), nodes)
	return filtered{node, err}
}

func (te *testPlacer) callBind(pod *v1.Pod, node string) error {
	return te.Bind(context.Background(), ref(pod), node)
}

func ref(pod *v1.Pod) PodRef { return PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID} }

// leases are the allocator's leases of the pod.
func (te *testPlacer) leases(t *testing.T, pod *v1.Pod) []api.Lease {
	t.Helper()
	return schedulertest.Leases(t, te.alloc, pod)
}

// bound filters pod on node alone and binds it there.
func (te *testPlacer) bound(t *testing.T, pod *v1.Pod, node string) api.Lease {
	t.Helper()
	placedOn(t, te.callFilter(t, pod, node), node)
	if err := te.callBind(pod, node); err != nil {
		t.Fatalf("bind: %v", err)
	}
	held := te.leases(t, pod)
	if len(held) != 1 {
		t.Fatalf("the bound pod holds %d leases, want 1", len(held))
	}
	return held[0]
}

// placedOn checks that the filter answered node.
func placedOn(t *testing.T, got filtered, node string) {
	t.Helper()
	if got.err != nil || got.node != node {
		t.Fatalf("filter answered %q, %v; want node %s", got.node, got.err, node)
	}
}

// TestFilterAcquiresAmongTheCandidates: the pod's lease is acquired on a
// candidate node, for the pod (owner, UID as key, labels), with its CPU
// and memory as kube-scheduler counts them, until released; the answer is
// that node alone. A second filter of the same pod (a retry after a lost
// answer) gets the same lease.
func TestFilterAcquiresAmongTheCandidates(t *testing.T) {
	te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-a", 2), servicetest.Server("gpu-b", 2)}, nil)
	pod := testPod("trainer-0", half)
	// An init container asks for more than the containers together; a
	// sidecar (restartable init container) runs beside them.
	always := v1.ContainerRestartPolicyAlways
	pod.Spec.InitContainers = []v1.Container{
		{Name: "setup", Resources: requests("2", "512Mi")},
		{Name: "sidecar", RestartPolicy: &always, Resources: requests("250m", "256Mi")},
	}
	pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: "helper", Resources: requests("500m", "1Gi")})

	res := te.callFilter(t, pod, "gpu-b")
	placedOn(t, res, "gpu-b")
	held := te.leases(t, pod)
	if len(held) != 1 {
		t.Fatalf("the pod holds %d leases, want 1", len(held))
	}
	l := held[0]
	// The most at any time: setup alone (2 CPU, 512Mi) before the
	// sidecar starts, then the containers beside it (1 CPU + 250m, 2Gi +
	// 256Mi).
	want := api.Lease{ID: l.ID, Namespace: "team-a", Server: "gpu-b", Owner: api.Owner{Pod: "trainer-0", UID: "uid-trainer-0", Labels: map[string]string{"app": "trainer"}},
		CPUMilli: 2000, MemoryBytes: 2<<30 + 256<<20, IdempotencyKey: "uid-trainer-0", UntilReleased: true, GPUs: l.GPUs, GrantedAt: l.GrantedAt}
	if !reflect.DeepEqual(l, want) {
		t.Errorf("lease %+v\nwant %+v", l, want)
	}
	if len(l.GPUs) != 1 || l.GPUs[0].Percent != 50 {
		t.Errorf("lease GPUs %+v, want one at 50%%", l.GPUs)
	}

	placedOn(t, te.callFilter(t, pod, "gpu-a", "gpu-b"), "gpu-b")
	if again := te.leases(t, pod); len(again) != 1 || again[0].ID != l.ID {
		t.Errorf("a second filter of the pod left leases %+v, want %s alone", again, l.ID)
	}
}

// TestFilterMovesALeaseOffANodeNoLongerCandidate: a pod whose earlier
// cycle acquired on a node that is no longer feasible (filled, cordoned)
// gets its lease released and a new one among the candidates, not a
// conflict that would keep it Pending forever.
func TestFilterMovesALeaseOffANodeNoLongerCandidate(t *testing.T) {
	te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-a", 1), servicetest.Server("gpu-b", 1)}, nil)
	pod := testPod("trainer-0", half)
	placedOn(t, te.callFilter(t, pod, "gpu-a"), "gpu-a")
	first := te.leases(t, pod)

	placedOn(t, te.callFilter(t, pod, "gpu-b"), "gpu-b")
	now := te.leases(t, pod)
	if len(now) != 1 || now[0].Server != "gpu-b" || now[0].ID == first[0].ID {
		t.Errorf("after the candidates moved to gpu-b the pod holds %+v, want one new lease on gpu-b (the first was %s)", now, first[0].ID)
	}
}

// TestFilterFailures: a pod the pool cannot place is Unschedulable with
// the reason, as FailedScheduling events show it; an allocator that does
// not answer is an error naming it, worth a retry. Either way no lease is
// left behind.
func TestFilterFailures(t *testing.T) {
	nodes := []string{"gpu-a", "gpu-b"}
	pool := []api.Server{servicetest.Server("gpu-a", 1), servicetest.Server("gpu-b", 1)}
	notHandled := testPod("plain", half)
	delete(notHandled.Annotations, kube.AnnotationRequest)
	badRequest := testPod("bad", half)
	badRequest.Annotations[kube.AnnotationRequest] = "{"
	capped := testPod("whole", kube.Request{GPUAmount: 1})
	capped.Namespace = "capped"
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()

	for _, tc := range []struct {
		name string
		// alloc, when set, is the allocator's address instead of a
		// running one's.
		alloc string
		pod   *v1.Pod
		// unschedulable is the refusal's message; else err is in the
		// error.
		unschedulable, err string
	}{
		{name: "not through the webhook", pod: notHandled,
			unschedulable: "gpupool: the pod has no gpupool.io/request annotation: gpupool's admission webhook did not handle it"},
		{name: "request annotation unreadable", pod: badRequest,
			unschedulable: "gpupool: annotation gpupool.io/request: unexpected end of JSON input"},
		{name: "no capacity", pod: testPod("big", kube.Request{GPUAmount: 2}),
			unschedulable: "gpupool allocator: no server has 2 free GPUs"},
		{name: "quota exceeded", pod: capped,
			unschedulable: "gpupool allocator: namespace capped quota 50% exceeded: in use 0%, asked 100%"},
		{name: "refused request", pod: testPod("odd", kube.Request{GPUAmount: 1, GPUPercent: 101}),
			unschedulable: "gpupool allocator: gpu-percent 101 out of range 1..100"},
		{name: "allocator down", alloc: down.URL, pod: testPod("trainer-0", half),
			err: "gpupool allocator: cannot reach the allocator at " + down.URL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := servicetest.Start(t, map[string]allocator.Share{"capped": allocator.SharePercent(50)})
			a.Register(t, pool)
			alloc := a.Client(t)
			if tc.alloc != "" {
				var err error
				if alloc, err = client.New([]string{tc.alloc}, servicetest.AdminToken); err != nil {
					t.Fatal(err)
				}
				alloc.Retries = 1
			}
			got := newPlacerOn(alloc).callFilter(t, tc.pod, nodes...)
			switch {
			case got.node != "":
				t.Errorf("filter answered node %s, want none", got.node)
			case tc.err != "" && (Unschedulable(got.err) || got.err == nil || !strings.Contains(got.err.Error(), tc.err)):
				t.Errorf("filter answered %v, want an error to retry with %q", got.err, tc.err)
			case tc.err == "" && (!Unschedulable(got.err) || !strings.HasPrefix(got.err.Error(), tc.unschedulable)):
				t.Errorf("filter answered %v, want Unschedulable with %q", got.err, tc.unschedulable)
			}
			if held := schedulertest.Leases(t, a.Client(t), tc.pod); len(held) > 0 {
				t.Errorf("a failed filter left leases %+v", held)
			}
		})
	}
}

// TestBindWritesTheLeaseOnThePod: bind acquires again with the same key
// pinned to the node (the same lease, however often it is retried) and
// creates the pod's Binding with the lease and its GPUs as annotations.
func TestBindWritesTheLeaseOnThePod(t *testing.T) {
	pod := testPod("trainer-0", half)
	te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-a", 1), servicetest.Server("gpu-b", 1)}, nil, pod)
	placedOn(t, te.callFilter(t, pod, "gpu-a"), "gpu-a")
	lease := te.leases(t, pod)[0]

	for range 2 { // the second as after a lost answer: the pod says it is bound
		if err := te.callBind(pod, "gpu-a"); err != nil {
			t.Fatalf("bind: %v", err)
		}
	}
	if held := te.leases(t, pod); len(held) != 1 || held[0].ID != lease.ID {
		t.Errorf("after bind the pod holds %+v, want %s alone", held, lease.ID)
	}
	bindings := te.kube.Bindings()
	if len(bindings) != 1 {
		t.Fatalf("%d bindings created, want one", len(bindings))
	}
	b := bindings[0]
	if b.Name != pod.Name || b.Namespace != pod.Namespace || b.UID != pod.UID || b.Target != (v1.ObjectReference{Kind: "Node", Name: "gpu-a"}) {
		t.Errorf("binding %+v, want pod %s/%s (UID %s) to node gpu-a", b, pod.Namespace, pod.Name, pod.UID)
	}
	// The one GPU of the lease, by the UUID CUDA_VISIBLE_DEVICES takes.
	want := map[string]string{kube.AnnotationLease: lease.ID, kube.AnnotationGPUs: lease.GPUs[0].UUID}
	if !reflect.DeepEqual(b.Annotations, want) {
		t.Errorf("binding annotations %v, want %v", b.Annotations, want)
	}
}

// TestOnlyTheBindWaitsForTheStore: the filter, inside kube-scheduler's
// one scheduling loop, asks for the lease without waiting for its write;
// the bind asks again for the same lease, durably, before the Binding.
func TestOnlyTheBindWaitsForTheStore(t *testing.T) {
	a := servicetest.Start(t, nil)
	a.Register(t, []api.Server{servicetest.Server("gpu-a", 1)})
	var mu sync.Mutex
	var asked []string // each acquisition, in order: "early" or "durable" and its key
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method == http.MethodPost && r.URL.Path == "/v1/leases" {
			var in api.AcquireRequest
			if err := json.Unmarshal(body, &in); err != nil {
				t.Errorf("acquisition %s: %v", body, err)
			}
			how := "durable"
			if in.AnswerBeforeDurable {
				how = "early"
			}
			mu.Lock()
			asked = append(asked, how+" "+in.IdempotencyKey)
			mu.Unlock()
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.URL.Scheme, r.URL.Host, r.RequestURI = "http", strings.TrimPrefix(a.URL, "http://"), ""
		resp, err := http.DefaultTransport.RoundTrip(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer func() { _ = resp.Body.Close() }()
		maps.Copy(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	t.Cleanup(proxy.Close)
	alloc, err := client.New([]string{proxy.URL}, servicetest.AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	pod := testPod("trainer-0", half)
	te := newPlacerOn(alloc, pod)
	placedOn(t, te.callFilter(t, pod, "gpu-a", "gpu-b"), "gpu-a")
	mu.Lock()
	filtered := slices.Clone(asked)
	mu.Unlock()
	if len(filtered) != 1 || !strings.HasPrefix(filtered[0], "early ") {
		t.Fatalf("the filter's acquisitions: %q, want one answered early", filtered)
	}
	if err := te.callBind(pod, "gpu-a"); err != nil {
		t.Fatalf("bind: %v", err)
	}
	key := strings.TrimPrefix(filtered[0], "early ")
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"early " + key, "durable " + key}; !slices.Equal(asked, want) {
		t.Errorf("acquisitions %q, want %q: the bind asks for the filter's lease, durably", asked, want)
	}
	if n := len(te.kube.Bindings()); n != 1 {
		t.Errorf("%d bindings, want one", n)
	}
}

// TestBindFailures: a bind that cannot write the pod's own lease on it
// answers why and binds nothing; the lease stays where filter put it.
func TestBindFailures(t *testing.T) {
	pod := testPod("trainer-0", half)
	replaced := pod.DeepCopy()
	replaced.UID = "uid-of-a-new-pod"
	for _, tc := range []struct {
		name string
		pod  *v1.Pod // what the cluster holds
		node string
		// apiserver, when set, fails the Binding.
		apiserver error
		err       string
	}{
		{name: "another node than filter's", pod: pod, node: "gpu-b",
			err: `gpupool allocator: idempotency-key "uid-trainer-0" already used by lease lease-000001 on server gpu-a, which is not among the servers asked`},
		{name: "pod gone", node: "gpu-a",
			err: "gpupool scheduler: no pod team-a/trainer-0 with UID uid-trainer-0 in the cluster"},
		{name: "pod replaced", pod: replaced, node: "gpu-a",
			err: "gpupool scheduler: no pod team-a/trainer-0 with UID uid-trainer-0 in the cluster"},
		{name: "binding refused", pod: pod, node: "gpu-a", apiserver: errors.New("etcdserver: request timed out"),
			err: "gpupool scheduler: binding the pod: etcdserver: request timed out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-a", 1), servicetest.Server("gpu-b", 1)}, nil)
			placedOn(t, te.callFilter(t, pod, "gpu-a"), "gpu-a")
			filtered := te.leases(t, pod)
			if err := te.kube.CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if tc.pod != nil {
				te.kube.Put(t, tc.pod)
			}
			if tc.apiserver != nil {
				te.kube.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
					return a.GetSubresource() == "binding", nil, tc.apiserver
				})
			}
			if err := te.callBind(pod, tc.node); err == nil || err.Error() != tc.err {
				t.Errorf("bind answered %v, want %q", err, tc.err)
			}
			if tc.apiserver == nil && len(te.kube.Bindings()) > 0 {
				t.Errorf("a failed bind created %+v", te.kube.Bindings())
			}
			if held := te.leases(t, pod); !reflect.DeepEqual(held, filtered) {
				t.Errorf("after a failed bind the pod holds %+v, want filter's %+v", held, filtered)
			}
		})
	}
}

// TestMetricsCountEachResult: each call is counted by verb and result and
// timed by verb; the table is docs/metrics.md's.
func TestMetricsCountEachResult(t *testing.T) {
	pod := testPod("trainer-0", half)
	te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-a", 1)}, nil, pod)
	te.callFilter(t, pod, "gpu-a")
	te.callFilter(t, testPod("big", kube.Request{GPUAmount: 2}), "gpu-a")
	_ = te.callBind(pod, "gpu-a")
	_ = te.callBind(pod, "gpu-b")

	want := `
# HELP bitfusion_extender_requests_total kube-scheduler's calls answered, by verb (filter, bind) and result (placed, unschedulable, bound, error).
# TYPE bitfusion_extender_requests_total counter
bitfusion_extender_requests_total{result="bound",verb="bind"} 1
bitfusion_extender_requests_total{result="error",verb="bind"} 1
bitfusion_extender_requests_total{result="error",verb="filter"} 0
bitfusion_extender_requests_total{result="placed",verb="filter"} 1
bitfusion_extender_requests_total{result="unschedulable",verb="filter"} 1
`
	if err := testutil.GatherAndCompare(te.reg, strings.NewReader(want), "bitfusion_extender_requests_total"); err != nil {
		t.Error(err)
	}
	families, err := te.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	timed := map[string]uint64{}
	for _, f := range families {
		if f.GetName() == "bitfusion_extender_request_duration_seconds" {
			for _, m := range f.GetMetric() {
				timed[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
			}
		}
	}
	if want := map[string]uint64{VerbFilter: 2, VerbBind: 2}; !reflect.DeepEqual(timed, want) {
		t.Errorf("calls timed by verb: %v, want %v", timed, want)
	}
	metricstest.Documented(t, "../../docs/metrics.md", "Scheduler extender", MetricFamilies, te.reg)
}
