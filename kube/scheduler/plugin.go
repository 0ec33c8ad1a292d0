package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/kube"
)

// PluginName is the scheduler-framework plugin's name in a
// KubeSchedulerConfiguration profile.
const PluginName = "GPUPool"

// Plugin is the Placer's front end inside kube-scheduler: it places pods
// through the pool in the one scheduling loop, without the extender's HTTP
// hop, and with what the extender protocol lacks: Unreserve, queueing
// hints, and a PreFilter that narrows the nodes. It logs through the
// logger kube-scheduler gives each call (klog.FromContext).
//
// A pod's first cycle asks the allocator first, among all its servers,
// and hands kube-scheduler the lease's server as the only node to filter
// (PreFilter), so kube-scheduler checks one node, not every node of the
// cluster. The pool's policy counts GPUs, CPU and memory as kube-scheduler
// does for the pods it places; when kube-scheduler's filters still refuse
// that node (a taint, a selector, another scheduler's pods), the lease is
// released (PostFilter) and the pod's next cycles take the long way: every
// node filtered, the lease acquired among the feasible ones (PreScore, or
// Reserve when one node is feasible), its server scored first.
type Plugin struct {
	placer *Placer
	// longWay are the pods whose lease from PreFilter was on a node
	// kube-scheduler's filters refused, with when.
	longWay longWay
}

var (
	_ fwk.PreFilterPlugin   = (*Plugin)(nil)
	_ fwk.PostFilterPlugin  = (*Plugin)(nil)
	_ fwk.PreScorePlugin    = (*Plugin)(nil)
	_ fwk.ScorePlugin       = (*Plugin)(nil)
	_ fwk.ReservePlugin     = (*Plugin)(nil)
	_ fwk.BindPlugin        = (*Plugin)(nil)
	_ fwk.EnqueueExtensions = (*Plugin)(nil)
)

// NewPlugin returns the plugin over placer.
func NewPlugin(placer *Placer) *Plugin {
	return &Plugin{placer: placer, longWay: longWay{since: map[types.UID]time.Time{}}}
}

// Name is PluginName.
func (p *Plugin) Name() string { return PluginName }

// cycleKey is where a cycle keeps the pool's answer.
const cycleKey fwk.StateKey = "gpupool.io/lease"

// cycleLease is the pool's answer in one scheduling cycle: a lease, or why
// the pool refused the pod.
type cycleLease struct {
	lease   api.Lease
	refused string
}

func (c *cycleLease) Clone() fwk.StateData { return c }

func leaseOf(state fwk.CycleState) *cycleLease {
	d, err := state.Read(cycleKey)
	if err != nil {
		return nil
	}
	c, _ := d.(*cycleLease)
	return c
}

// PreFilter acquires the pod's lease among all the pool's servers and
// narrows kube-scheduler's filters to its server; a pod whose earlier
// lease kube-scheduler refused goes the long way.
func (p *Plugin) PreFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if p.longWay.has(pod.UID) {
		return nil, nil
	}
	lease, st := p.acquire(ctx, state, pod, nil)
	if !st.IsSuccess() {
		return nil, st
	}
	return &fwk.PreFilterResult{NodeNames: sets.New(lease.Server)}, nil
}

// PreFilterExtensions is nil: the plugin keeps no per-node state.
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// acquire takes the pod's lease among nodes (nil: any server) and keeps
// it in the cycle; a refusal is Unschedulable with the pool's reason.
// A lease whose cycle fails where no Unreserve follows ends unless a bind
// comes (Placer.Place).
func (p *Plugin) acquire(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodes []string) (api.Lease, *fwk.Status) {
	lease, err := p.placer.Place(ctx, pod, nodes)
	switch {
	case err == nil:
		state.Write(cycleKey, &cycleLease{lease: lease})
		return lease, nil
	case Unschedulable(err):
		// Unresolvable: preemption frees only what kube-scheduler's own
		// filters count, never a GPU share.
		return lease, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}
	return lease, fwk.AsStatus(err)
}

// PostFilter runs when no node passed kube-scheduler's filters: a lease
// PreFilter took on a node they refused is released, and the pod goes the
// long way from its next cycle.
func (p *Plugin) PostFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	if c := leaseOf(state); c != nil && c.refused == "" {
		p.longWay.add(pod.UID)
		p.placer.Release(ctx, pod, "released the lease of a pod whose node kube-scheduler's filters refused: it is placed among the feasible nodes next")
	}
	return nil, fwk.NewStatus(fwk.Unschedulable)
}

// PreScore, on the long way, acquires the pod's lease among the feasible
// nodes; Reserve says the pool's refusal.
func (p *Plugin) PreScore(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	if leaseOf(state) != nil {
		return fwk.NewStatus(fwk.Skip)
	}
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Node().Name
	}
	_, st := p.acquire(ctx, state, pod, names)
	switch {
	case st.IsRejected():
		state.Write(cycleKey, &cycleLease{refused: st.Message()})
	case !st.IsSuccess():
		return st
	}
	return nil
}

// Score puts the lease's server first.
func (p *Plugin) Score(_ context.Context, state fwk.CycleState, _ *v1.Pod, node fwk.NodeInfo) (int64, *fwk.Status) {
	if c := leaseOf(state); c != nil && c.lease.Server == node.Node().Name {
		return fwk.MaxScore, nil
	}
	return fwk.MinScore, nil
}

// ScoreExtensions is nil: scores are already in range.
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return nil }

// Reserve holds the lease on the chosen node: the cycle's lease, or one
// acquired on that node when it was the only one feasible (kube-scheduler
// then skips PreScore).
func (p *Plugin) Reserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, node string) *fwk.Status {
	c := leaseOf(state)
	if c == nil {
		if _, st := p.acquire(ctx, state, pod, []string{node}); !st.IsSuccess() {
			return st
		}
		c = leaseOf(state)
	}
	switch {
	case c.refused != "":
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, c.refused)
	case c.lease.Server != node:
		return fwk.AsStatus(fmt.Errorf("gpupool: the pod's lease %s is on %s, not on %s", c.lease.ID, c.lease.Server, node))
	}
	// From here Unreserve or Bind ends the lease's wait, however long
	// Permit and PreBind hold the pod (a volume provisioned: up to
	// VolumeBinding's 10 minutes); the wait's timer would release the
	// lease under them. Should kube-scheduler die meanwhile, the lease
	// controller's resync releases the lease of a pod still unbound long
	// after its grant.
	p.placer.Reserve(pod.UID)
	return nil
}

// Unreserve releases the cycle's lease: the cycle failed after Reserve
// (Placer.Unreserve).
func (p *Plugin) Unreserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ string) {
	if c := leaseOf(state); c != nil && c.refused == "" {
		p.placer.Unreserve(ctx, pod, "released the lease of a pod whose scheduling cycle failed")
	}
}

// Bind binds the pod with its lease (Placer.Bind).
func (p *Plugin) Bind(ctx context.Context, _ fwk.CycleState, pod *v1.Pod, node string) *fwk.Status {
	if err := p.placer.Bind(ctx, PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}, node); err != nil {
		return fwk.AsStatus(err)
	}
	p.longWay.remove(pod.UID)
	return nil
}

// EventsToRegister: a pod the pool refused is tried again only on an
// event that can change the pool's answer, since each try is an
// acquisition: a lease ending (a pod that held one deleted, or ended,
// which kube-scheduler's informer sees as a deletion), a node added (it
// may be a new GPU server, whose registration with the allocator
// kube-scheduler does not see), and, for a pod on the long way, whose
// candidates are the nodes kube-scheduler's filters pass, a node's taints
// or labels changed. A pod whose lease kube-scheduler refused is tried
// again, the long way, at its own next update (kube-scheduler's
// PodScheduled condition).
func (p *Plugin) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	return []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Delete}, QueueingHintFn: leaseEnded},
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add}},
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.UpdateNodeTaint | fwk.UpdateNodeLabel}, QueueingHintFn: p.candidatesChanged},
		{Event: fwk.ClusterEvent{Resource: fwk.TargetPod, ActionType: fwk.Update}, QueueingHintFn: p.longWayHint},
	}, nil
}

// leaseEnded queues when the deleted pod held a lease, which the lease
// controller releases now: the pool wrote it on the pod at its bind. Any
// other pod frees nothing the pool counts.
func leaseEnded(_ klog.Logger, _ *v1.Pod, oldObj, _ any) (fwk.QueueingHint, error) {
	deleted, ok := oldObj.(*v1.Pod)
	if !ok {
		return fwk.Queue, fmt.Errorf("gpupool: an assigned pod's deletion carries a %T, not a pod", oldObj)
	}
	if _, leased := deleted.Annotations[kube.AnnotationLease]; leased {
		return fwk.Queue, nil
	}
	return fwk.QueueSkip, nil
}

// candidatesChanged queues a pod on the long way: the pool was asked
// among the nodes kube-scheduler's filters passed, which a taint or a
// label changes. On the short way the pool was asked among all its
// servers, whatever their taints and labels.
func (p *Plugin) candidatesChanged(_ klog.Logger, pod *v1.Pod, _, _ any) (fwk.QueueingHint, error) {
	if p.longWay.has(pod.UID) {
		return fwk.Queue, nil
	}
	return fwk.QueueSkip, nil
}

func (p *Plugin) longWayHint(_ klog.Logger, pod *v1.Pod, _, newObj any) (fwk.QueueingHint, error) {
	if updated, ok := newObj.(*v1.Pod); ok && updated.UID == pod.UID && p.longWay.has(pod.UID) {
		return fwk.Queue, nil
	}
	return fwk.QueueSkip, nil
}

// longWay remembers the pods to place among the feasible nodes, for an
// hour at most: a pod deleted meanwhile is forgotten then.
type longWay struct {
	mu    sync.Mutex
	since map[types.UID]time.Time
}

const longWayFor = time.Hour

func (l *longWay) add(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	for u, t := range l.since {
		if now.Sub(t) > longWayFor {
			delete(l.since, u)
		}
	}
	l.since[uid] = now
}

func (l *longWay) has(uid types.UID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.since[uid]
	return ok
}

func (l *longWay) remove(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.since, uid)
}

// DecodePluginArgs reads the plugin's args from a profile's pluginConfig:
// strictly, so that a misspelt field is named, with the allocator's address
// and CA from the environment where the args leave them out (the
// Deployment sets them from the ConfigMap gpupool-endpoints and the
// allocator's Secret, as for every other gpupool binary).
func DecodePluginArgs(obj runtime.Object) (PluginArgs, error) {
	var args PluginArgs
	u, ok := obj.(*runtime.Unknown)
	if !ok || u == nil {
		return args, fmt.Errorf("%s: no args: its pluginConfig must name the token file", PluginName)
	}
	d := json.NewDecoder(bytes.NewReader(u.Raw))
	d.DisallowUnknownFields()
	if err := d.Decode(&args); err != nil {
		return args, fmt.Errorf("%s args: %w", PluginName, err)
	}
	if args.Allocator == "" {
		args.Allocator = os.Getenv(AllocatorEnv)
	}
	if args.AllocatorCAFile == "" {
		args.AllocatorCAFile = os.Getenv(cli.AllocatorCAEnv)
	}
	switch {
	case strings.TrimSpace(args.Allocator) == "":
		return args, fmt.Errorf("%s args: allocator: empty, and $%s unset: name the allocator's URL", PluginName, AllocatorEnv)
	case args.TokenFile == "":
		return args, fmt.Errorf("%s args: tokenFile: empty: name the file of an allocator admin token", PluginName)
	case args.UnboundLeaseTimeout.Duration < 0:
		return args, fmt.Errorf("%s args: unboundLeaseTimeout %v: must not be negative", PluginName, args.UnboundLeaseTimeout.Duration)
	}
	return args, nil
}

// PreFilterPlugins are the PreFilter plugins of the profile that runs
// GPUPool, in their order: GPUPool first, since the allocation it notes
// for a pod's claim must be there for DynamicResources' PreFilter, then
// kube-scheduler v1.37's defaults in their default order. A profile that
// only enabled GPUPool would run it after them. cmd/gpupool-kube-scheduler's
// TestPreFilterPluginsAreTheDefaults checks them against the defaults of
// the kube-scheduler it pins.
var PreFilterPlugins = []string{PluginName, "NodeName", "NodeUnschedulable", "TaintToleration", "NodeAffinity", "NodePorts",
	"NodeResourcesFit", "VolumeRestrictions", "NodeVolumeLimits", "VolumeBinding", "VolumeZone", "PodTopologySpread",
	"InterPodAffinity", "DynamicResources", "NodeDeclaredFeatures"}

// AllocatorEnv names the allocator's URL(s) where the plugin's args do not.
const AllocatorEnv = "GPUPOOL_ALLOCATOR"

// PluginArgs are the plugin's args in a profile's pluginConfig.
type PluginArgs struct {
	// Allocator is the allocator's URL, or its replicas', comma-separated;
	// empty: $GPUPOOL_ALLOCATOR.
	Allocator string `json:"allocator,omitempty"`
	// AllocatorCAFile verifies an https allocator; empty:
	// $GPUPOOL_ALLOCATOR_CA_FILE, and when that is unset too the system's
	// roots.
	AllocatorCAFile string `json:"allocatorCAFile,omitempty"`
	// TokenFile holds an admin token: the plugin acquires in every
	// namespace.
	TokenFile string `json:"tokenFile"`
	// UnboundLeaseTimeout: how long a lease waits for its bind where no
	// Unreserve comes (DefaultUnboundLeaseTimeout when 0).
	UnboundLeaseTimeout metav1.Duration `json:"unboundLeaseTimeout,omitempty"`
}

// NewPluginFromArgs is the plugin's factory for kube-scheduler's registry
// (app.WithPlugin).
func NewPluginFromArgs(_ context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := DecodePluginArgs(obj)
	if err != nil {
		return nil, err
	}
	alloc, err := client.NewFromFlags(client.Flags{Allocator: args.Allocator, CAFile: args.AllocatorCAFile, TokenFile: args.TokenFile, TokenFlag: "tokenFile"})
	if err != nil {
		return nil, fmt.Errorf("%s args: %w", PluginName, err)
	}
	// The acquisition holds the one scheduling loop: fail over between
	// replicas once, and give up within 3 s.
	alloc.Retries, alloc.Timeout = 2*len(strings.Split(args.Allocator, ",")), 3*time.Second
	cfg := Config{Allocator: alloc, Kube: h.ClientSet(), Pods: h.SharedInformerFactory().Core().V1().Pods().Lister(),
		UnboundLeaseTimeout: args.UnboundLeaseTimeout.Duration, Registry: legacyregistry.Registerer()}
	if m := h.SharedDRAManager(); m != nil {
		// GPUPool's PreFilter comes before DynamicResources': the claim it
		// allocates is then one DynamicResources only reserves.
		cfg.Claims = m.ResourceClaims()
	}
	placer := New(cfg)
	return NewPlugin(placer), nil
}
