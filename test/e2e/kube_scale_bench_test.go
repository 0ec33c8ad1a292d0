package e2e

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/internal/procstat"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/simulate"
	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

const (
	// scaleNamespace holds BenchmarkKubeScale's pods.
	scaleNamespace = "openb"
	// scaleCreators create the pods, so that one slow create does not hold
	// back the next ones; each pod still goes out at its own time.
	scaleCreators = 8
	// scaleSettle bounds how long the pods have to be bound, or found
	// unschedulable, after the last one is created: it catches a pool that
	// stopped placing, not a slow one.
	scaleSettle = 5 * time.Minute
	// scaleSeed is the replay's seed whose arrivals the benchmark submits,
	// and scalePolicy the policy that places them on both sides.
	scaleSeed   = 42
	scalePolicy = "fgd-cpu"
)

// scaleRate is how many pods a second BenchmarkKubeScale creates: by
// default above the 100 a second the pool must bind, below the 160-220 that
// kwok keeps up with at this size (BenchmarkKwokScale). A lower rate shows
// the latency at an arrival rate the machine sustains, without queueing.
var scaleRate = flag.Float64("kubescale.rate", 150, "pods a second BenchmarkKubeScale creates")

// BenchmarkKubeScale places the OpenB cluster's workload through
// Kubernetes: the 1,213 servers of the node list (6,212 GPUs) as kwok
// nodes, registered in the allocator in the trace's order with fgd-cpu,
// and the pods `gpupool simulate` draws with seed 42 from the default pod
// list, in that order, until the GPU share asked reaches 100% of capacity.
// Only GPU pods are submitted: a pod that asks for no GPU is not the
// pool's (kube-scheduler's default profile places it), so the replay's
// CPU-only pods are left out of both sides. Each pod is written as users
// write it (bitfusion.io/gpu-amount, and gpu-percent for a fraction; the
// trace's CPU and memory as requests), created through the webhook at
// -kubescale.rate pods a second (150 by default), open loop, and placed by kube-scheduler with
// gpupool's extender.
//
// It reports pods bound per second, p50 and p99 from a pod's creation to
// its binding, each component's CPU seconds over the run and peak RSS,
// and the GPU share the allocator has left unallocated next to the
// replay's for the same pods in the same order, and how far apart they
// are. That is a report, not a check: how far the live path comes from
// the replay depends on how fast this machine's control plane takes the
// pods (docs/design.md, "Scheduling at 1,213 nodes"): 0.2-0.4 points at
// 47-63 pods created a second, 5-10 points at 80-115.
func BenchmarkKubeScale(b *testing.B) {
	tr, err := simulate.LoadTrace(simulate.DefaultNodes, simulate.DefaultPods)
	if err != nil {
		b.Fatal(err)
	}
	pods, capacity := gpuArrivals(tr)
	replayed, err := simulate.PlaceInOrder(tr, pods, scalePolicy, scaleSeed)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		ctx, cancel := context.WithTimeout(b.Context(), 15*time.Minute)
		pool := startKubePool(b, ctx, kubePoolOptions{Namespaces: []string{scaleNamespace}, AllocatorArgs: []string{"--policy", scalePolicy}})
		addTraceServers(b, ctx, pool, tr.Servers)

		components := map[string]int{"allocator": pool.Allocator.cmd.Process.Pid, "gpupool-scheduler": pool.scheduler.Process.Pid}
		for _, name := range []string{"kube-scheduler", "kube-apiserver", "etcd", "kube-controller-manager", "kwok"} {
			components[name] = pool.CP.PID(name)
		}
		before := usageOf(b, components)
		run := submit(b, ctx, pool.CP, pods)
		after := usageOf(b, components)

		status, err := pool.Admin.Pool(ctx)
		if err != nil {
			b.Fatal(err)
		}
		unallocated := 100 * float64(capacity-allocatedShare(status)) / float64(capacity)
		cancel()
		run.report(b, before, after)
		b.ReportMetric(unallocated, "unallocated-%")
		b.ReportMetric(replayed, "replay-unallocated-%")
		b.Logf("unallocated GPU share: %.2f%% through Kubernetes, %.2f%% in the replay (%d pods, %s, seed %d)",
			unallocated, replayed, len(pods), scalePolicy, scaleSeed)
		b.ReportMetric(unallocated-replayed, "points-from-replay")
	}
}

// gpuArrivals are the GPU pods of the replay's arrivals with scaleSeed, up
// to the last one that keeps the GPU share asked within capacity, which it
// returns too.
func gpuArrivals(tr *simulate.Trace) ([]simulate.Pod, allocator.Share) {
	var capacity, asked allocator.Share
	for _, s := range tr.Servers {
		capacity += allocator.ShareGPUs(len(s.GPUs))
	}
	var pods []simulate.Pod
	for _, p := range simulate.Arrivals(tr, scaleSeed) {
		if p.GPUs == 0 {
			continue
		}
		if asked+p.GPUShare() > capacity {
			break
		}
		asked += p.GPUShare()
		pods = append(pods, p)
	}
	return pods, capacity
}

// addTraceServers adds the trace's servers as kwok nodes of their CPU and
// memory, and registers them in the allocator one after another in the
// trace's order, so that the allocator's servers are in the replay's
// order (its policies break ties by it).
func addTraceServers(b *testing.B, ctx context.Context, pool *kubePool, servers []allocator.Server) {
	b.Helper()
	nodes := make([]e2ekube.Node, len(servers))
	for i, s := range servers {
		nodes[i] = e2ekube.Node{Name: s.Name, Capacity: map[string]string{
			"cpu":    resource.NewMilliQuantity(s.CPUMilli, resource.DecimalSI).String(),
			"memory": resource.NewQuantity(s.MemoryBytes, resource.BinarySI).String(),
			"pods":   "1000",
		}}
	}
	var g errgroup.Group
	g.Go(func() error { return pool.CP.AddKwokNodes(ctx, nodes) })
	g.Go(func() error {
		for _, s := range servers {
			if err := pool.Servers.RegisterServer(ctx, api.NewServer(s)); err != nil {
				return fmt.Errorf("registering %s: %w", s.Name, err)
			}
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
}

// tracePod is trace pod p as its user writes it: its CPU and memory as
// requests, its GPUs in BFK's limits, and the GPU models it may run on.
func tracePod(name string, p *simulate.Pod) *corev1.Pod {
	percent := 0
	if p.PerGPU < allocator.WholeGPU {
		percent = int(p.PerGPU.Percent())
	}
	pod := bfkPod(name, p.GPUs, percent)
	pod.Labels["trace-pod"] = p.Name
	pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(p.CPUMilli, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(p.Memory, resource.BinarySI),
	}
	if len(p.Models) > 0 {
		pod.Annotations = map[string]string{kube.AnnotationModels: strings.Join(p.Models, ",")}
	}
	return pod
}

// scaleRun is what submit saw of each pod, by arrival index.
type scaleRun struct {
	mu            sync.Mutex
	created       []time.Time // when its Create was sent
	bound         []time.Time // when the informer first saw spec.nodeName
	unschedulable []bool      // PodScheduled=False, Unschedulable, and not bound
	settled       int         // pods bound or unschedulable
}

// submit creates pods in order at -kubescale.rate a second and returns once
// each is bound or unschedulable, as a pod informer sees them.
func submit(b *testing.B, ctx context.Context, cp *e2ekube.ControlPlane, pods []simulate.Pod) *scaleRun {
	b.Helper()
	run := &scaleRun{created: make([]time.Time, len(pods)), bound: make([]time.Time, len(pods)), unschedulable: make([]bool, len(pods))}
	factory := informers.NewSharedInformerFactoryWithOptions(cp.Client, 0, informers.WithNamespace(scaleNamespace))
	informer := factory.Core().V1().Pods().Informer()
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    run.observe,
		UpdateFunc: func(_, obj any) { run.observe(obj) },
	}); err != nil {
		b.Fatal(err)
	}
	stop := make(chan struct{})
	defer func() { close(stop); factory.Shutdown() }()
	factory.Start(stop)
	factory.WaitForCacheSync(stop)

	next := make(chan int)
	g, gctx := errgroup.WithContext(ctx)
	for range scaleCreators {
		g.Go(func() error {
			for i := range next {
				pod := tracePod(podName(i), &pods[i])
				run.mu.Lock()
				run.created[i] = time.Now()
				run.mu.Unlock()
				if _, err := cp.Client.CoreV1().Pods(scaleNamespace).Create(gctx, pod, metav1.CreateOptions{}); err != nil {
					return fmt.Errorf("creating pod %d (%s): %w", i, pods[i].Name, err)
				}
			}
			return nil
		})
	}
	start := time.Now()
	func() {
		defer close(next)
		for i := range pods {
			time.Sleep(time.Until(start.Add(time.Duration(float64(i) * float64(time.Second) / *scaleRate))))
			select {
			case next <- i:
			case <-gctx.Done():
				return
			}
		}
	}()
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(scaleSettle)
	for run.settledCount() < len(pods) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d pods bound or unschedulable %v after the last was created", run.settledCount(), len(pods), scaleSettle)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return run
}

// podName is the name of the pod that arrives i-th.
func podName(i int) string { return fmt.Sprintf("pod-%05d", i) }

// observe records when a pod is first seen bound, or unschedulable.
func (r *scaleRun) observe(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	i, err := strconv.Atoi(strings.TrimPrefix(pod.Name, "pod-"))
	if err != nil || i >= len(r.bound) {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !r.bound[i].IsZero():
	case pod.Spec.NodeName != "":
		r.bound[i] = now
		if !r.unschedulable[i] {
			r.settled++
		}
	case !r.unschedulable[i] && unschedulable(pod):
		r.unschedulable[i] = true
		r.settled++
	}
}

func unschedulable(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable
		}
	}
	return false
}

func (r *scaleRun) settledCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.settled
}

// report logs and reports the run's throughput and latencies, and each
// component's CPU time over the run and peak memory.
func (r *scaleRun) report(b *testing.B, before, after map[string]procUsage) {
	b.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var latencies []time.Duration
	var lastBound time.Time
	for i, t := range r.bound {
		if t.IsZero() {
			continue
		}
		latencies = append(latencies, t.Sub(r.created[i]))
		if t.After(lastBound) {
			lastBound = t
		}
	}
	if len(latencies) == 0 {
		b.Fatal("no pod was bound")
	}
	slices.Sort(latencies)
	quantile := func(q float64) time.Duration { return latencies[int(q*float64(len(latencies)-1))] }
	created := r.created[len(r.created)-1].Sub(r.created[0])
	perSecond := float64(len(latencies)) / lastBound.Sub(r.created[0]).Seconds()
	var table strings.Builder
	fmt.Fprintf(&table, "%d pods created in %v (%.0f/s asked, %.0f/s sent)\n", len(r.created), created.Round(time.Millisecond),
		*scaleRate, float64(len(r.created)-1)/created.Seconds())
	fmt.Fprintf(&table, "%d bound, %d unschedulable; %.1f pods bound/s; creation to bound p50 %v, p99 %v, max %v\n",
		len(latencies), len(r.created)-len(latencies), perSecond, quantile(0.5).Round(time.Millisecond),
		quantile(0.99).Round(time.Millisecond), latencies[len(latencies)-1].Round(time.Millisecond))
	// Components in columns: a benchmark's log is cut after ten lines.
	names := make([]string, 0, len(after))
	for name := range after {
		names = append(names, name)
	}
	slices.Sort(names)
	var header, cpuRow, rssRow strings.Builder
	fmt.Fprintf(&header, "%-10s", "")
	fmt.Fprintf(&cpuRow, "%-10s", "cpu-s")
	fmt.Fprintf(&rssRow, "%-10s", "rss-MB")
	for _, name := range names {
		cpu := (after[name].cpu - before[name].cpu).Seconds()
		rss := float64(after[name].peakRSS) / (1 << 20)
		w := len(name) + 2
		fmt.Fprintf(&header, "%*s", w, name)
		fmt.Fprintf(&cpuRow, "%*.1f", w, cpu)
		fmt.Fprintf(&rssRow, "%*.0f", w, rss)
		b.ReportMetric(cpu, name+"-cpu-s")
		b.ReportMetric(rss, name+"-rss-MB")
	}
	fmt.Fprintf(&table, "%s\n%s\n%s", header.String(), cpuRow.String(), rssRow.String())
	b.Logf("through Kubernetes at 1,213 nodes:\n%s", table.String())
	b.ReportMetric(perSecond, "pods/s")
	b.ReportMetric(float64(quantile(0.5).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(quantile(0.99).Microseconds())/1000, "p99-ms")
}

// procUsage is a process's CPU time so far and its peak resident memory.
type procUsage struct {
	cpu     time.Duration
	peakRSS int64 // bytes
}

// usageOf reads each process's usage from /proc.
func usageOf(b testing.TB, pids map[string]int) map[string]procUsage {
	b.Helper()
	usage := make(map[string]procUsage, len(pids))
	for name, pid := range pids {
		u, err := procstat.Read(pid)
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		usage[name] = procUsage{cpu: u.CPU, peakRSS: u.PeakRSS}
	}
	return usage
}

// allocatedShare is the GPU share the pool's leases hold.
func allocatedShare(status api.PoolStatus) allocator.Share {
	var allocated allocator.Share
	for _, s := range status.Servers {
		for _, g := range s.GPUs {
			allocated += g.Allocated()
		}
	}
	return allocated
}
