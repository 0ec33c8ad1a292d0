package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/service/servicetest"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/kube"
)

// cycleState is the part of kube-scheduler's CycleState the plugin uses;
// the rest of the interface panics if called.
type cycleState struct {
	fwk.CycleState
	data map[fwk.StateKey]fwk.StateData
}

func newCycleState() *cycleState { return &cycleState{data: map[fwk.StateKey]fwk.StateData{}} }

func (s *cycleState) Read(k fwk.StateKey) (fwk.StateData, error) {
	if d, ok := s.data[k]; ok {
		return d, nil
	}
	return nil, fwk.ErrNotFound
}

func (s *cycleState) Write(k fwk.StateKey, d fwk.StateData) { s.data[k] = d }

// nodeInfo is a node as the plugin reads one: its name.
type nodeInfo struct {
	fwk.NodeInfo
	node *v1.Node
}

func (n nodeInfo) Node() *v1.Node { return n.node }

func nodeInfos(names ...string) []fwk.NodeInfo {
	infos := make([]fwk.NodeInfo, len(names))
	for i, name := range names {
		infos[i] = nodeInfo{node: &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}}
	}
	return infos
}

func newTestPlugin(t *testing.T, gpusPerServer int, pods ...runtime.Object) (*Plugin, *testPlacer) {
	t.Helper()
	te := newTestPlacer(t, []api.Server{servicetest.Server("gpu-0", gpusPerServer), servicetest.Server("gpu-1", gpusPerServer)}, nil, pods...)
	return NewPlugin(te.Placer), te
}

func TestPluginNarrowsToTheLeasesServer(t *testing.T) {
	pod := testPod("p", half)
	p, te := newTestPlugin(t, 1, pod)
	ctx, state := context.Background(), newCycleState()

	res, st := p.PreFilter(ctx, state, pod, nil)
	if !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	held := te.leases(t, pod)
	if len(held) != 1 || res.AllNodes() || !res.NodeNames.Has(held[0].Server) || res.NodeNames.Len() != 1 {
		t.Fatalf("PreFilter narrowed to %v with leases %+v: want the one lease's server", res, held)
	}
	node := held[0].Server
	if st := p.Reserve(ctx, state, pod, node); !st.IsSuccess() {
		t.Fatalf("Reserve on %s: %v", node, st)
	}
	if st := p.Bind(ctx, state, pod, node); !st.IsSuccess() {
		t.Fatalf("Bind on %s: %v", node, st)
	}
	if taken := te.kube.Bindings(); len(taken) != 1 || taken[0].Target.Name != node || taken[0].Annotations[kube.AnnotationLease] != held[0].ID {
		t.Fatalf("Bindings %+v: want one to %s with lease %s", taken, node, held[0].ID)
	}
	if st := p.Bind(ctx, newCycleState(), testPod("gone", half), node); st.IsSuccess() || !strings.Contains(st.Message(), "no pod team-a/gone") {
		t.Errorf("Bind of a pod the cluster does not have: %v, want the reason", st)
	}
}

func TestPluginRefusalIsUnresolvableWithThePoolsReason(t *testing.T) {
	pod := testPod("big", kube.Request{GPUAmount: 4, GPUPercent: 100})
	p, te := newTestPlugin(t, 1, pod)

	_, st := p.PreFilter(context.Background(), newCycleState(), pod, nil)
	if st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), "gpupool allocator: no server has 4 free GPUs") {
		t.Fatalf("PreFilter: %v %q: want UnschedulableAndUnresolvable with the pool's reason", st.Code(), st.Message())
	}
	if held := te.leases(t, pod); len(held) != 0 {
		t.Fatalf("leases %+v after a refusal", held)
	}
}

// A lease on a node kube-scheduler's filters refuse (a taint the pool does
// not know) is released, and the pod's next cycle places it among the
// nodes those filters left.
func TestPluginTakesTheLongWayWhenTheLeasesNodeIsRefused(t *testing.T) {
	pod := testPod("p", half)
	p, te := newTestPlugin(t, 1, pod)
	ctx := context.Background()

	first := newCycleState()
	res, st := p.PreFilter(ctx, first, pod, nil)
	if !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	refused := res.NodeNames.UnsortedList()[0]
	if _, st := p.PostFilter(ctx, first, pod, nil); st.Code() != fwk.Unschedulable {
		t.Fatalf("PostFilter: %v", st)
	}
	if held := te.leases(t, pod); len(held) != 0 {
		t.Fatalf("leases %+v after PostFilter: want the refused node's released", held)
	}
	if hint, _ := p.longWayHint(klog.Background(), pod, nil, pod); hint != fwk.Queue {
		t.Errorf("the pod's own update: %v, want Queue", hint)
	}
	if hint, _ := p.longWayHint(klog.Background(), pod, nil, testPod("other", half)); hint != fwk.QueueSkip {
		t.Errorf("another pod's update: %v, want QueueSkip", hint)
	}

	other := "gpu-0"
	if refused == other {
		other = "gpu-1"
	}
	second := newCycleState()
	if res, st := p.PreFilter(ctx, second, pod, nil); !st.IsSuccess() || !res.AllNodes() {
		t.Fatalf("PreFilter the second time: %v %v, want every node", res, st)
	}
	if st := p.PreScore(ctx, second, pod, nodeInfos(other, "not-a-server")); !st.IsSuccess() {
		t.Fatalf("PreScore: %v", st)
	}
	for _, n := range nodeInfos(other, "not-a-server") {
		want := fwk.MinScore
		if n.Node().Name == other {
			want = fwk.MaxScore
		}
		if score, _ := p.Score(ctx, second, pod, n); score != want {
			t.Errorf("Score(%s) = %d, want %d", n.Node().Name, score, want)
		}
	}
	if st := p.Reserve(ctx, second, pod, other); !st.IsSuccess() {
		t.Fatalf("Reserve on %s: %v", other, st)
	}
	if st := p.Bind(ctx, second, pod, other); !st.IsSuccess() {
		t.Fatalf("Bind: %v", st)
	}
	if p.longWay.has(pod.UID) {
		t.Error("the pod is still marked for the long way once bound")
	}
}

// On the long way with one feasible node kube-scheduler skips PreScore;
// Reserve acquires on that node, or says the pool's refusal.
func TestPluginReservesOnTheOneFeasibleNode(t *testing.T) {
	pod, big := testPod("p", half), testPod("big", kube.Request{GPUAmount: 2, GPUPercent: 100})
	p, te := newTestPlugin(t, 1, pod, big)
	ctx := context.Background()
	p.longWay.add(pod.UID)
	p.longWay.add(big.UID)

	if st := p.Reserve(ctx, newCycleState(), pod, "gpu-1"); !st.IsSuccess() {
		t.Fatalf("Reserve: %v", st)
	}
	if held := te.leases(t, pod); len(held) != 1 || held[0].Server != "gpu-1" {
		t.Fatalf("leases %+v: want one on gpu-1", held)
	}
	if st := p.Reserve(ctx, newCycleState(), big, "gpu-1"); st.Code() != fwk.UnschedulableAndUnresolvable {
		t.Fatalf("Reserve of a pod the node cannot hold: %v, want the pool's refusal", st)
	}
}

// reserved runs pod's cycle up to Reserve, which must succeed.
func reserved(t *testing.T, p *Plugin, pod *v1.Pod) (context.Context, fwk.CycleState, string) {
	t.Helper()
	ctx, state := context.Background(), newCycleState()
	res, st := p.PreFilter(ctx, state, pod, nil)
	if !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	node := res.NodeNames.UnsortedList()[0]
	if st := p.Reserve(ctx, state, pod, node); !st.IsSuccess() {
		t.Fatalf("Reserve: %v", st)
	}
	return ctx, state, node
}

func TestPluginUnreserveReleasesTheCyclesLease(t *testing.T) {
	pod := testPod("p", half)
	p, te := newTestPlugin(t, 1, pod)
	ctx, state, node := reserved(t, p, pod)
	p.Unreserve(ctx, state, pod, node)
	if held := te.leases(t, pod); len(held) != 0 {
		t.Fatalf("leases %+v after Unreserve", held)
	}
}

// TestPluginKeepsAReservedPodsLease: a reserved pod keeps its lease
// however long Permit and PreBind hold it (a volume provisioned), past
// the wait that ends a lease no bind came for, and is bound with it.
func TestPluginKeepsAReservedPodsLease(t *testing.T) {
	pod := testPod("p", half)
	p, te := newTestPlugin(t, 1, pod)
	te.unbound.timeout = 100 * time.Millisecond
	ctx, state, node := reserved(t, p, pod)
	granted := te.leases(t, pod)
	time.Sleep(3 * te.unbound.timeout) // Permit and PreBind
	if held := te.leases(t, pod); len(held) != 1 || held[0].ID != granted[0].ID {
		t.Fatalf("leases %+v after a long PreBind, want the reserved %s", held, granted[0].ID)
	}
	if st := p.Bind(ctx, state, pod, node); !st.IsSuccess() {
		t.Fatalf("Bind: %v", st)
	}
	if got := te.kube.Bindings()[0].Annotations[kube.AnnotationLease]; got != granted[0].ID {
		t.Errorf("bound with lease %s, want the reserved %s", got, granted[0].ID)
	}
	if n := te.unbound.waiting(); n != 0 {
		t.Errorf("%d pods still wait for a bind", n)
	}
}

// TestPluginQueueingHints: a pod the pool refused is tried again, each
// try an acquisition, only on an event that can change the pool's answer:
// a pod that held a lease deleted, a node added, and, on the long way, a
// node's taints or labels changed.
func TestPluginQueueingHints(t *testing.T) {
	refused := testPod("refused", half)
	p, _ := newTestPlugin(t, 1, refused)
	registered, err := p.EventsToRegister(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	hint := func(event fwk.ClusterEvent, oldObj, newObj any) fwk.QueueingHint {
		t.Helper()
		for _, r := range registered {
			if r.Event.Resource != event.Resource || r.Event.ActionType&event.ActionType == 0 {
				continue
			}
			if r.QueueingHintFn == nil { // kube-scheduler's default
				return fwk.Queue
			}
			h, err := r.QueueingHintFn(klog.Background(), refused, oldObj, newObj)
			if err != nil {
				t.Fatalf("%s: %v", event.Label(), err)
			}
			return h
		}
		return fwk.QueueSkip
	}
	plain := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team-a"}, Spec: v1.PodSpec{NodeName: "cpu-0"}}
	leased := testPod("leased", half)
	leased.Spec.NodeName, leased.Annotations[kube.AnnotationLease] = "gpu-0", "lease-000001"
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu-0"}}
	deleted := fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Delete}
	tainted := fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.UpdateNodeTaint}
	for _, tc := range []struct {
		name           string
		event          fwk.ClusterEvent
		oldObj, newObj any
		longWay        bool
		want           fwk.QueueingHint
	}{
		{"a pod without a lease deleted", deleted, plain, nil, false, fwk.QueueSkip},
		{"a pod with a lease deleted", deleted, leased, nil, false, fwk.Queue},
		{"a node added", fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add}, nil, node, false, fwk.Queue},
		{"a node's taint changed", tainted, node, node, false, fwk.QueueSkip},
		{"a node's label changed", fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.UpdateNodeLabel}, node, node, false, fwk.QueueSkip},
		{"a node's taint changed, on the long way", tainted, node, node, true, fwk.Queue},
	} {
		if tc.longWay {
			p.longWay.add(refused.UID)
		}
		if got := hint(tc.event, tc.oldObj, tc.newObj); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
		p.longWay.remove(refused.UID)
	}
}

func TestPluginArgs(t *testing.T) {
	t.Setenv(AllocatorEnv, "")
	t.Setenv(cli.AllocatorCAEnv, "")
	args, err := DecodePluginArgs(&runtime.Unknown{Raw: []byte(`{"allocator":"http://a","tokenFile":"/t","unboundLeaseTimeout":"30s"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if args.Allocator != "http://a" || args.TokenFile != "/t" || args.UnboundLeaseTimeout.Duration.String() != "30s" || args.AllocatorCAFile != "" {
		t.Errorf("args %+v", args)
	}
	for raw, want := range map[string]string{
		`{"allocater":"http://a"}`:           `unknown field "allocater"`,
		`{"tokenFile":"/t"}`:                 "allocator: empty, and $GPUPOOL_ALLOCATOR unset",
		`{"allocator":"http://a"}`:           "tokenFile: empty",
		`{"allocator":" ","tokenFile":"/t"}`: "allocator: empty",
		`{"allocator":"http://a","tokenFile":"/t","unboundLeaseTimeout":"-1s"}`: "unboundLeaseTimeout -1s: must not be negative",
	} {
		if _, err := DecodePluginArgs(&runtime.Unknown{Raw: []byte(raw)}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want it to say %q", raw, err, want)
		}
	}
	if _, err := DecodePluginArgs(nil); err == nil {
		t.Error("no args: no error")
	}

	// The Deployment's way: the address and the CA from the environment,
	// set from the ConfigMap gpupool-endpoints and the allocator's Secret.
	t.Setenv(AllocatorEnv, "https://gpupool-allocator.gpupool.svc:8470")
	t.Setenv(cli.AllocatorCAEnv, "/etc/gpupool/allocator-ca/ca.crt")
	args, err = DecodePluginArgs(&runtime.Unknown{Raw: []byte(`{"tokenFile":"/t"}`)})
	if err != nil || args.Allocator != "https://gpupool-allocator.gpupool.svc:8470" || args.AllocatorCAFile != "/etc/gpupool/allocator-ca/ca.crt" {
		t.Errorf("args from the environment: %+v, %v", args, err)
	}
	args, err = DecodePluginArgs(&runtime.Unknown{Raw: []byte(`{"allocator":"http://a","allocatorCAFile":"/ca","tokenFile":"/t"}`)})
	if err != nil || args.Allocator != "http://a" || args.AllocatorCAFile != "/ca" {
		t.Errorf("args over the environment: %+v, %v", args, err)
	}
}
