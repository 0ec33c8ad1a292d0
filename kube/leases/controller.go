// Package leases is the controller that makes a pod's lease live exactly
// as long as the pod: the scheduler extender acquires leases that never
// expire (until released), and this controller releases each when its pod
// is deleted, succeeds or fails, or when its node is deleted. A resync on
// start and every period repairs what events missed while either side was
// down: leases whose pod is gone are released, bound pods whose lease is
// gone get one again on their node. It also makes the namespaces'
// ResourceQuotas the one source of the allocator's quotas.
//
// Every state it writes can be recomputed from the Kubernetes API and the
// allocator, so a restart of the controller, of the allocator or of both
// loses nothing: the resync converges.
package leases

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/kube"
)

// Config configures a Controller.
type Config struct {
	// Client reads pods, nodes and ResourceQuotas, patches the lease
	// annotations of a pod whose lease is acquired again, and writes
	// Events.
	Client kubernetes.Interface
	// Allocator is the pool's allocator, with an admin token: the
	// controller releases leases of every namespace and sets quotas.
	Allocator *client.Client
	// Unit is what one unit of bitfusion.io/gpu stands for, the unit of
	// the ResourceQuotas' requests.bitfusion.io/gpu; percent when empty.
	Unit kube.Unit
	// GPUMemoryBytes is one GPU's memory, the webhook's --gpu-memory: in a
	// unit of memory, a quota's share is its memory's part of it.
	GPUMemoryBytes int64
	// Resync is how often the controller compares every lease with its
	// pod and every quota with its ResourceQuotas; 5 minutes when 0.
	Resync time.Duration
	// UnboundLeaseTimeout is how long after its grant a lease whose pod is
	// still not bound is released, by every resync: the scheduling cycle
	// that took it died with kube-scheduler, and with it the wait for the
	// bind that the plugin keeps in memory. It must outlast the longest
	// bind: a reserved pod's Permit and PreBind (a volume provisioned
	// waits up to VolumeBinding's bindTimeoutSeconds, 10 minutes) hold its
	// lease unbound. DefaultUnboundLeaseTimeout when 0.
	UnboundLeaseTimeout time.Duration
	// IdleEvery is how often the controller asks the allocator which
	// leases are idle, to warn their pods; DefaultIdleEvery when 0.
	IdleEvery time.Duration
	// StartUnboundLeaseTimeout, when set, replaces UnboundLeaseTimeout in
	// the resync at start: the extender's --unbound-lease-timeout, where
	// this process serves the extender, whose waits for binds were lost
	// with the process that just restarted.
	StartUnboundLeaseTimeout time.Duration
	// Recorder writes Events on pods; nil records them through Client.
	Recorder record.EventRecorder
	// Election, when set, makes one replica of several reconcile; without
	// it this one always does (a single replica).
	Election *Election
	Logger   *slog.Logger
	Registry prometheus.Registerer
	// WhileLeading, when set, runs beside the reconciling, in the one
	// replica that reconciles, until it stops: work that one replica must
	// do, such as publishing the pool's ResourceSlices.
	WhileLeading func(ctx context.Context)
}

// DefaultResync is the resync period when Config.Resync is 0.
const DefaultResync = 5 * time.Minute

// DefaultUnboundLeaseTimeout is Config.UnboundLeaseTimeout when 0: longer
// than VolumeBinding's 10 minutes, the longest wait of a bind upstream.
const DefaultUnboundLeaseTimeout = 15 * time.Minute

// EventSource names the controller in the Events it writes.
const EventSource = "gpupool-leases"

// Retries after a failure back off exponentially per item between these
// bounds: quick after a blip, every half minute through a long outage,
// and never given up, so that no release is lost.
const (
	retryBase = 100 * time.Millisecond
	retryMax  = 30 * time.Second
)

// uidIndex indexes pods by UID: a lease names its pod by UID, and a pod
// deleted and created again under the same name is another pod.
const uidIndex = "uid"

// Controller keeps leases and quotas following the cluster.
type Controller struct {
	whileLeading func(ctx context.Context)
	unit         kube.Unit
	gpuMemory    int64
	resyncEvery  time.Duration
	log          *slog.Logger
	alloc        *client.Client
	client       kubernetes.Interface
	record       record.EventRecorder
	events       record.EventBroadcaster // nil when Config.Recorder was given
	metrics      *metrics

	// unboundTimeout and, at start, startUnboundTimeout: how long after
	// its grant the resync releases a lease whose pod is still unbound.
	unboundTimeout, startUnboundTimeout time.Duration

	factory informers.SharedInformerFactory
	pods    cache.SharedIndexInformer
	nodes   corelisters.NodeLister
	quotas  corelisters.ResourceQuotaLister
	synced  []cache.InformerSynced
	queue   workqueue.TypedRateLimitingInterface[item]

	election *Election
	// reconciling is set while this replica reconciles: a standby queues
	// nothing, and the resync its leadership starts with covers what it
	// saw meanwhile.
	reconciling atomic.Bool

	idleEvery time.Duration
	// warned and reclaimed are, by lease, the start of the idle run its
	// pod was warned of, and reclaimed for; the worker's alone.
	warned, reclaimed map[string]time.Time

	// allocatorDown is set while the allocator does not answer, so that an
	// outage is logged once, not once per item retried through it.
	allocatorDown atomic.Bool
}

// NewController builds the controller and its informers; Run starts them.
func NewController(cfg Config) (*Controller, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("leases: no Kubernetes client")
	case cfg.Allocator == nil:
		return nil, errors.New("leases: no allocator client")
	}
	if cfg.Unit == "" {
		cfg.Unit = kube.UnitPercent
	}
	if _, err := kube.ParseUnit(string(cfg.Unit)); err != nil {
		return nil, fmt.Errorf("leases: %w", err)
	}
	if cfg.Unit.MemoryBytes() > 0 && cfg.GPUMemoryBytes <= 0 {
		return nil, fmt.Errorf("leases: unit %s counts GPU memory, and no GPU memory says how much of a GPU a quota is", cfg.Unit)
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.UnboundLeaseTimeout <= 0 {
		cfg.UnboundLeaseTimeout = DefaultUnboundLeaseTimeout
	}
	if cfg.IdleEvery <= 0 {
		cfg.IdleEvery = DefaultIdleEvery
	}
	if cfg.StartUnboundLeaseTimeout <= 0 {
		cfg.StartUnboundLeaseTimeout = cfg.UnboundLeaseTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Election != nil {
		election := *cfg.Election
		if err := election.validate(); err != nil {
			return nil, err
		}
		cfg.Election = &election
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	c := &Controller{
		unit: cfg.Unit, gpuMemory: cfg.GPUMemoryBytes, resyncEvery: cfg.Resync, unboundTimeout: cfg.UnboundLeaseTimeout, startUnboundTimeout: cfg.StartUnboundLeaseTimeout, log: cfg.Logger, alloc: cfg.Allocator, client: cfg.Client, record: cfg.Recorder, metrics: m,
		election: cfg.Election, idleEvery: cfg.IdleEvery, whileLeading: cfg.WhileLeading,
		factory: informers.NewSharedInformerFactory(cfg.Client, 0),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[item](retryBase, retryMax),
			workqueue.TypedRateLimitingQueueConfig[item]{Name: "gpupool-leases"}),
	}
	// A single replica queues from its informers' first events on; a
	// replica of several, once it leads.
	c.reconciling.Store(cfg.Election == nil)
	if c.record == nil {
		c.events = record.NewBroadcaster()
		c.record = c.events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: EventSource})
	}
	if err := c.watch(); err != nil {
		return nil, err
	}
	return c, nil
}

// watch registers the event handlers: each turns an event into the item
// that reconciles it, or into nothing when the event changes nothing the
// controller acts on.
func (c *Controller) watch() error {
	pods := c.factory.Core().V1().Pods()
	c.pods = pods.Informer()
	if err := c.pods.AddIndexers(cache.Indexers{uidIndex: func(obj any) ([]string, error) {
		return []string{string(obj.(*corev1.Pod).UID)}, nil
	}}); err != nil {
		return err
	}
	if _, err := c.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, cur any) {
			if pod, reason := cur.(*corev1.Pod), endReason(cur.(*corev1.Pod)); reason != "" && endReason(old.(*corev1.Pod)) == "" {
				c.enqueuePod(pod, reason)
			}
		},
		DeleteFunc: func(obj any) {
			if pod, ok := tombstoned[*corev1.Pod](obj); ok {
				c.enqueuePod(pod, reasonPodDeleted)
			}
		},
	}); err != nil {
		return err
	}

	nodes := c.factory.Core().V1().Nodes()
	c.nodes = nodes.Lister()
	if _, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if node, ok := tombstoned[*corev1.Node](obj); ok {
				c.add(item{kind: kindNode, name: node.Name})
			}
		},
	}); err != nil {
		return err
	}

	quotas := c.factory.Core().V1().ResourceQuotas()
	c.quotas = quotas.Lister()
	enqueueNamespace := func(obj any) {
		if q, ok := tombstoned[*corev1.ResourceQuota](obj); ok {
			c.add(item{kind: kindQuota, namespace: q.Namespace})
		}
	}
	if _, err := quotas.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueueNamespace,
		// A quota's status changes with every pod it counts; only its hard
		// limits matter here.
		UpdateFunc: func(old, cur any) {
			if !equality.Semantic.DeepEqual(old.(*corev1.ResourceQuota).Spec.Hard, cur.(*corev1.ResourceQuota).Spec.Hard) {
				enqueueNamespace(cur)
			}
		},
		DeleteFunc: enqueueNamespace,
	}); err != nil {
		return err
	}
	c.synced = []cache.InformerSynced{c.pods.HasSynced, nodes.Informer().HasSynced, quotas.Informer().HasSynced}
	return nil
}

// Pods reads the controller's cache of pods, which Run fills: the
// scheduler extender reads pods from it rather than watch them twice.
func (c *Controller) Pods() corelisters.PodLister {
	return corelisters.NewPodLister(c.pods.GetIndexer())
}

// enqueuePod queues the release of an ended pod's lease; pods the pool
// did not place hold none.
func (c *Controller) enqueuePod(pod *corev1.Pod, reason string) {
	if _, placed := pod.Annotations[kube.AnnotationRequest]; placed {
		c.add(item{kind: kindPod, namespace: pod.Namespace, name: pod.Name, uid: pod.UID,
			lease: pod.Annotations[kube.AnnotationLease], reason: reason})
	}
}

// add queues an item while this replica reconciles.
func (c *Controller) add(it item) {
	if c.reconciling.Load() {
		c.queue.Add(it)
	}
}

// tombstoned is the object of an informer event, the last state known of
// a deleted object included.
func tombstoned[T any](obj any) (T, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	v, ok := obj.(T)
	return v, ok
}

// Run starts the informers and, once they are synced, reconciles until
// ctx ends: at once with no Election, else while this replica leads.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	if c.events != nil {
		c.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.client.CoreV1().Events("")})
		defer c.events.Shutdown()
	}
	// The informers stop with Run, a lost leadership included, before
	// Shutdown waits for them.
	ctx, stopInformers := context.WithCancel(ctx)
	defer c.factory.Shutdown()
	defer stopInformers()
	c.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return fmt.Errorf("leases: informer caches did not sync: %w", context.Cause(ctx))
	}
	if c.election != nil {
		return c.lead(ctx)
	}
	c.reconcileUntil(ctx)
	return nil
}

// reconcileUntil resyncs at once and every Resync period after, and
// reconciles the items queued, until ctx ends.
func (c *Controller) reconcileUntil(ctx context.Context) {
	c.reconciling.Store(true)
	c.metrics.leader.Set(1)
	defer func() {
		c.reconciling.Store(false)
		c.metrics.leader.Set(0)
	}()
	// One worker: a resync then never races a pod's release (acquiring
	// again the lease of a pod whose deletion is being handled), and one
	// release costs a few milliseconds, hundreds a second.
	var wg sync.WaitGroup
	wg.Go(func() {
		for c.processNext(ctx) {
		}
	})
	if c.whileLeading != nil {
		wg.Go(func() { c.whileLeading(ctx) })
	}
	c.queue.Add(item{kind: kindResync, atStart: true})
	ticker := time.NewTicker(c.resyncEvery)
	defer ticker.Stop()
	idle := time.NewTicker(c.idleEvery)
	defer idle.Stop()
	for {
		select {
		case <-ticker.C:
			c.queue.Add(item{kind: kindResync})
		case <-idle.C:
			c.queue.Add(item{kind: kindIdle})
		case <-ctx.Done():
			c.queue.ShutDown()
			wg.Wait()
			return
		}
	}
}

// processNext reconciles one item; a failure puts it back with backoff.
func (c *Controller) processNext(ctx context.Context) bool {
	it, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(it)
	err := c.reconcile(ctx, it)
	c.metrics.reconciled(it.kind, err)
	if err == nil {
		c.queue.Forget(it)
		return true
	}
	if ctx.Err() != nil {
		return true // shutting down: the next start resyncs
	}
	if !unreachable(err) { // an outage is logged once, by reached
		c.log.Warn("reconcile failed; retrying", "item", it, "err", err)
	}
	c.queue.AddRateLimited(it)
	return true
}

// itemKind is what an item reconciles.
type itemKind string

const (
	kindPod    itemKind = "pod"    // release the lease of an ended pod
	kindNode   itemKind = "node"   // release the leases on a deleted node
	kindQuota  itemKind = "quota"  // set a namespace's quota from its ResourceQuotas
	kindResync itemKind = "resync" // compare every lease and quota with the cluster
	kindIdle   itemKind = "idle"   // warn, and reclaim, the pods of the leases measured idle
)

// item is one unit of work. A pod's item carries what its reconcile needs
// once the pod is gone from the cache.
type item struct {
	kind            itemKind
	namespace, name string
	uid             types.UID
	// lease is the pod's gpupool.io/lease annotation, if it had one.
	lease string
	// reason is why the pod's lease ends (a releases_total reason).
	reason string
	// atStart marks the resync when the controller starts.
	atStart bool
}

func (c *Controller) reconcile(ctx context.Context, it item) error {
	switch it.kind {
	case kindPod:
		return c.releasePod(ctx, it.namespace, it.uid, it.lease, it.reason)
	case kindNode:
		return c.releaseNode(ctx, it.name)
	case kindQuota:
		return c.syncQuota(ctx, it.namespace)
	case kindResync:
		return c.resync(ctx, it.atStart)
	case kindIdle:
		return c.actOnIdle(ctx)
	}
	return fmt.Errorf("unknown item kind %q", it.kind)
}

// unreachable tells an allocator that did not answer, or whose replicas
// all stand by (an item to retry through the outage), from one that
// answered no.
func unreachable(err error) bool {
	var u *client.UnreachableError
	return errors.As(err, &u) || client.IsReason(err, api.ReasonUnavailable)
}

// reached notes whether the allocator answered, logging once when an
// outage starts and once when it ends, and returns err.
func (c *Controller) reached(err error) error {
	if unreachable(err) {
		if c.allocatorDown.CompareAndSwap(false, true) {
			c.log.Error("allocator unreachable; leases and quotas wait and are retried with backoff", "err", err)
		}
	} else if c.allocatorDown.CompareAndSwap(true, false) {
		c.log.Info("allocator reachable again")
	}
	return err
}
