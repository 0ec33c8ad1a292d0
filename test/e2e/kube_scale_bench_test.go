package e2e

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/procstat"
	"github.com/gpupool/gpupool/inventory"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/simulate"
	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

const (
	// scaleNamespace holds BenchmarkKubeScale's pods.
	scaleNamespace = "openb"
	// scaleSettle bounds how long no pod is bound, or found
	// unschedulable, before all are: it catches a scheduler that stopped
	// placing, not a slow one.
	scaleSettle = 2 * time.Minute
	// scaleQuiet is how long no pod is bound before a settled run ends: a
	// pod marked unschedulable once may be placed on a retry.
	scaleQuiet = 5 * time.Second
	// scaleUnboundTimeout is gpupool-scheduler's --unbound-lease-timeout
	// in the benchmark, which waits that long for the leases of cycles that
	// failed after their filter to end before it compares the leases with
	// the bound pods.
	scaleUnboundTimeout = 10 * time.Second
	// scaleSeed is the replay's seed whose arrivals the benchmark submits,
	// and scalePolicy the policy that places them on both sides.
	scaleSeed   = 42
	scalePolicy = "fgd-cpu"
	// scaleMaxGap is how many points the GPU share left unallocated
	// through Kubernetes may be above the in-process replay of the same
	// pods in arrival order: placement through Kubernetes is the policy's.
	scaleMaxGap = 0.5
)

// scaleRates are the rates BenchmarkKubeScale creates pods at: `make bench`
// runs one, `make bench-kube` three: 40, 100 and 200.
// Knobs that push the pool's side into the regimes a busy cluster meets.
var (
	scaleExtenderTimeout = flag.Duration("kubescale.extender-timeout", 0, "kube-scheduler's httpTimeout for gpupool's extender; 0 is its default, 5s: shorter makes binds and filters time out as on a saturated control plane")
	scaleExtender        = flag.Bool("kubescale.extender", false, "place the pool's side through gpupool-scheduler's extender, not gpupool-kube-scheduler's plugin")
	scaleQueued          = flag.Bool("kubescale.queued", false, "stop kube-scheduler (SIGSTOP) while the pods are created: every pod is queued before the first is placed")
)

var scaleRates = flag.String("kubescale.rates", "100", "pods a second BenchmarkKubeScale creates, comma-separated: at each rate the pool and the stock kube-scheduler place the same pods, one after the other")

// scaleWorkload is what both sides of BenchmarkKubeScale place, and the
// replays they are compared with.
type scaleWorkload struct {
	trace    *simulate.Trace
	pods     []simulate.Pod
	capacity allocator.Share
	// replayed is the in-process replay's unallocated share (%) of the
	// pods in arrival order, GPUs shared; whole with each pod's ask
	// rounded up to whole GPUs, what a cluster without sharing holds.
	replayed, whole float64
}

// BenchmarkKubeScale places the OpenB cluster's workload through
// Kubernetes, at each rate of -kubescale.rates, twice: through gpupool as
// users deploy it (webhook, kube-scheduler with gpupool-scheduler's
// extender, the allocator with fgd-cpu, tokens on), and through the stock
// kube-scheduler alone, bitfusion.io/gpu a plain extended resource of the
// nodes packed by NodeResourcesFit's MostAllocated strategy: what a
// cluster without the pool does. The 1,213 servers of the node list (6,212
// GPUs) are kwok nodes with the trace's CPU and memory; the pods are those
// `gpupool-simulate` draws with seed 42 from the default pod list, in
// that order, until the GPU share asked reaches 100% of capacity. Only GPU
// pods are submitted: a pod that asks for no GPU is not the pool's, so the
// replay's CPU-only pods are left out of both sides. The pool's pods are
// written as users write them (bitfusion.io/gpu-amount, and gpu-percent
// for a fraction); the stock side's ask for their GPUs rounded up.
//
// Each side reports pods bound per second, p50 and p99 from a pod's
// creation to its binding, each component's CPU and peak RSS, and the GPU
// share left unallocated; the pool's side also the record of every call
// kube-scheduler made to the pool (kube_scale_record_test.go) and the
// in-process replay of the allocator's live order. Then a table compares
// the sides. It fails when the pool leaves more than scaleMaxGap points
// more GPU share unallocated than the replay in arrival order, or when the
// allocator's leases are not exactly the bound pods' at the end.
func BenchmarkKubeScale(b *testing.B) {
	w := loadScaleWorkload(b)
	for _, rate := range parseRates(b, *scaleRates) {
		var pool, stock *sideResult
		b.Run(fmt.Sprintf("rate=%g/pool", rate), func(b *testing.B) {
			for b.Loop() {
				pool = runPoolSide(b, w, rate, false)
			}
		})
		b.Run(fmt.Sprintf("rate=%g/stock", rate), func(b *testing.B) {
			for b.Loop() {
				stock = runStockSide(b, w, rate, false)
			}
		})
		if pool != nil && stock != nil {
			fmt.Print(compareSides(rate, w, pool, stock))
		}
	}
}

func loadScaleWorkload(b *testing.B) *scaleWorkload {
	b.Helper()
	tr, err := simulate.LoadTrace(simulate.DefaultNodes, simulate.DefaultPods)
	if err != nil {
		b.Fatal(err)
	}
	w := &scaleWorkload{trace: tr}
	w.pods, w.capacity = simulate.GPUArrivals(tr, scaleSeed)
	if w.replayed, err = simulate.PlaceInOrder(tr, w.pods, scalePolicy, scaleSeed); err != nil {
		b.Fatal(err)
	}
	exclusive := *tr
	exclusive.Exclusive = true
	if w.whole, err = simulate.PlaceInOrder(&exclusive, w.pods, scalePolicy, scaleSeed); err != nil {
		b.Fatal(err)
	}
	return w
}

func parseRates(b *testing.B, list string) []float64 {
	b.Helper()
	var rates []float64
	for f := range strings.SplitSeq(list, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || r <= 0 {
			b.Fatalf("-kubescale.rates: %q is not a rate of pods a second", f)
		}
		rates = append(rates, r)
	}
	return rates
}

// runPoolSide places the workload through gpupool, each pod by its own
// ResourceClaim (claimArrivals) when claims is set.
func runPoolSide(b *testing.B, w *scaleWorkload, rate float64, claims bool) *sideResult {
	ctx, cancel := context.WithTimeout(b.Context(), 20*time.Minute)
	defer cancel()
	pool := startKubePool(b, ctx, kubePoolOptions{Namespaces: []string{scaleNamespace}, AllocatorArgs: []string{"--policy", scalePolicy},
		SchedulerArgs:   []string{"--log-level", "debug", "--log-format", "json", "--unbound-lease-timeout", scaleUnboundTimeout.String()},
		ExtenderTimeout: *scaleExtenderTimeout, Extender: *scaleExtender})
	servers, next := w.trace.Servers, podAlone(func(i int) *corev1.Pod { return tracePod(podName(i), &w.pods[i]) })
	if claims {
		createDeviceClass(b, ctx, pool.CP.Client)
		servers, next = withGPUMemory(servers), claimArrivals(w, kube.SchedulerName)
	}
	registered := time.Now()
	addTraceServers(b, ctx, pool, servers)
	if claims {
		// gpupool-scheduler publishes the servers' slices at its next read
		// of the pool (--resource-slices-every, 30 s).
		waitForSlices(b, ctx, pool.CP.Client, len(servers), registered)
	}

	components := map[string]int{"allocator": pool.Allocator.cmd.Process.Pid, "gpupool-scheduler": pool.scheduler.Process.Pid,
		"gpupool-webhook": pool.webhook.Process.Pid}
	for _, name := range controlPlane {
		components[name] = pool.CP.PID(name)
	}
	if *scaleQueued {
		if err := syscall.Kill(pool.CP.PID("kube-scheduler"), syscall.SIGSTOP); err != nil {
			b.Fatal(err)
		}
	}
	run := submit(b, ctx, pool.CP, components, len(w.pods), rate, next, func() {
		if *scaleQueued {
			_ = syscall.Kill(pool.CP.PID("kube-scheduler"), syscall.SIGCONT)
		}
	})
	loop := schedulerLoop(b, ctx, pool.CP)

	// Leases of cycles that failed after their filter end within the
	// timeout; then they must be exactly the bound pods'.
	var record *scaleRecord
	for deadline := time.Now().Add(3 * scaleUnboundTimeout); ; {
		record = recordOf(b, ctx, pool)
		if record.audit().clean() || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	status, err := pool.Admin.Pool(ctx)
	if err != nil {
		b.Fatal(err)
	}
	res := run.result("gpupool", rate)
	res.unallocated = 100 * float64(w.capacity-allocatedShare(status)) / float64(w.capacity)
	if claims {
		res.checkClaims(b, ctx, pool.CP.Client, w.capacity, record)
	}
	res.report(b)
	record.report(b, w.trace, w.pods)
	record.path(run)
	fmt.Print(loop)
	gap := res.unallocated - w.replayed
	b.ReportMetric(w.replayed, "replay-unallocated-%")
	b.ReportMetric(gap, "points-from-replay")
	fmt.Printf("unallocated GPU share: %.2f%% through Kubernetes, %.2f%% in the replay in arrival order (%d pods, %s, seed %d): %+.2f points\n",
		res.unallocated, w.replayed, len(w.pods), scalePolicy, scaleSeed, gap)
	if gap > scaleMaxGap {
		b.Errorf("the pool left %.2f%% of the GPU share unallocated through Kubernetes, %.2f points above the replay's %.2f%% (at most %.1f)",
			res.unallocated, gap, w.replayed, scaleMaxGap)
	}
	if a := record.audit(); !a.clean() {
		b.Errorf("at the end the allocator's leases are not the bound pods': %v", a)
	}
	return res
}

// controlPlane are the processes of the control plane both sides run.
var controlPlane = []string{"kube-apiserver", "kube-scheduler", "etcd", "kube-controller-manager", "kwok"}

// runStockSide places the workload through the stock kube-scheduler
// alone: with claims, each pod by its own ResourceClaim, which
// DynamicResources allocates from the pool's slices.
func runStockSide(b *testing.B, w *scaleWorkload, rate float64, claims bool) *sideResult {
	ctx, cancel := context.WithTimeout(b.Context(), 20*time.Minute)
	defer cancel()
	bins := os.Getenv("KUBE_BIN_DIR")
	if bins == "" {
		b.Skip("KUBE_BIN_DIR is not set: `make e2e` builds the control plane (test/e2e/kube/build.sh) and sets it")
	}
	cp, err := e2ekube.Start(ctx, e2ekube.Options{BinDir: bins, Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cp.Stop)
	packed := []string{"cpu", "memory", kube.ResourceGPU}
	if claims {
		packed = packed[:2] // the nodes have no GPUs of their own
	}
	if err := cp.StartScheduler(ctx, e2ekube.SchedulerOptions{DefaultOnly: true, MostAllocated: packed}); err != nil {
		b.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: scaleNamespace}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	gpus := 0
	nodes := traceNodes(w.trace.Servers)
	for i := range nodes {
		if !claims {
			nodes[i].Capacity[kube.ResourceGPU] = strconv.Itoa(len(w.trace.Servers[i].GPUs))
		}
		gpus += len(w.trace.Servers[i].GPUs)
	}
	if err := cp.AddKwokNodes(ctx, nodes); err != nil {
		b.Fatal(err)
	}
	next := podAlone(func(i int) *corev1.Pod { return stockPod(podName(i), &w.pods[i]) })
	if claims {
		createDeviceClass(b, ctx, cp.Client)
		publishSlices(b, ctx, cp.Client, withGPUMemory(w.trace.Servers))
		next = claimArrivals(w, "")
	}
	components := map[string]int{}
	for _, name := range controlPlane {
		components[name] = cp.PID(name)
	}
	run := submit(b, ctx, cp, components, len(w.pods), rate, next, nil)
	loop := schedulerLoop(b, ctx, cp)
	if claims {
		res := run.result("stock kube-scheduler (DynamicResources)", rate)
		res.checkClaims(b, ctx, cp.Client, w.capacity, nil)
		res.report(b)
		fmt.Print(loop)
		return res
	}
	pods, err := cp.Client.CoreV1().Pods(scaleNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	busy := int64(0)
	for i := range pods.Items {
		if p := &pods.Items[i]; p.Spec.NodeName != "" {
			q := p.Spec.Containers[0].Resources.Limits[kube.ResourceGPU]
			busy += q.Value()
		}
	}
	res := run.result("stock kube-scheduler", rate)
	res.unallocated = 100 * float64(int64(gpus)-busy) / float64(gpus)
	res.report(b)
	fmt.Print(loop)
	fmt.Printf("GPUs left idle: %.2f%% with the stock kube-scheduler (MostAllocated), %.2f%% in the pool's replay of whole GPUs\n", res.unallocated, w.whole)
	return res
}

// stockPod is trace pod p as a cluster without the pool asks for it: its
// GPUs as the plain extended resource bitfusion.io/gpu, rounded up to
// whole GPUs (a pod asking 0.3 GPU takes one), with its CPU and memory.
func stockPod(name string, p *simulate.Pod) *corev1.Pod {
	whole := (int64(p.GPUShare()) + int64(allocator.WholeGPU) - 1) / int64(allocator.WholeGPU)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"trace-pod": p.Name}},
		Spec: corev1.PodSpec{
			Tolerations: []corev1.Toleration{e2ekube.KwokToleration},
			Containers: []corev1.Container{{Name: "trainer", Image: "trainer", Resources: corev1.ResourceRequirements{
				Requests: hostRequests(p),
				Limits:   corev1.ResourceList{kube.ResourceGPU: *resource.NewQuantity(whole, resource.DecimalSI)},
			}}},
		},
	}
}

// recordOf reads what explains a run's placement once it settled.
func recordOf(b testing.TB, ctx context.Context, pool *kubePool) *scaleRecord {
	b.Helper()
	r := &scaleRecord{}
	logs, prefix := pool.Logs.String(), "gpupool-scheduler: "
	if pool.plugin {
		raw, err := pool.CP.Log("kube-scheduler")
		if err != nil {
			b.Fatal(err)
		}
		logs, prefix = string(raw), ""
	}
	var err error
	if r.calls, r.released, err = extenderCalls(logs, prefix); err != nil {
		b.Fatalf("reading the filter and bind records: %v", err)
	}
	pods, err := pool.CP.Client.CoreV1().Pods(scaleNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	r.pods = pods.Items
	if r.leases, err = pool.Admin.Leases(ctx, client.LeaseFilter{Namespace: scaleNamespace}); err != nil {
		b.Fatal(err)
	}
	return r
}

// addTraceServers adds the trace's servers as kwok nodes of their CPU and
// memory, and registers them in the allocator one after another in the
// trace's order, so that the allocator's servers are in the replay's
// order (its policies break ties by it).
func addTraceServers(b testing.TB, ctx context.Context, pool *kubePool, servers []inventory.Server) {
	b.Helper()
	nodes := traceNodes(servers)
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

// traceNodes are kwok nodes of the servers' CPU and memory.
func traceNodes(servers []inventory.Server) []e2ekube.Node {
	nodes := make([]e2ekube.Node, len(servers))
	for i, s := range servers {
		nodes[i] = e2ekube.Node{Name: s.Name, Capacity: map[string]string{
			"cpu":    resource.NewMilliQuantity(s.CPUMilli, resource.DecimalSI).String(),
			"memory": resource.NewQuantity(s.MemoryBytes, resource.BinarySI).String(),
			"pods":   "1000",
		}}
	}
	return nodes
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
	pod.Spec.Containers[0].Resources.Requests = hostRequests(p)
	if len(p.Models) > 0 {
		pod.Annotations = map[string]string{kube.AnnotationModels: strings.Join(p.Models, ",")}
	}
	return pod
}

// hostRequests are trace pod p's CPU and memory, as its container asks.
func hostRequests(p *simulate.Pod) corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(p.CPUMilli, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(p.Memory, resource.BinarySI),
	}
}

// scaleRun is what submit saw of each pod, by arrival index.
type scaleRun struct {
	mu            sync.Mutex
	created       []time.Time // when its Create was sent
	admitted      []time.Time // when its Create returned: admission, webhooks included
	bound         []time.Time // when the informer first saw spec.nodeName
	unschedulable []bool      // PodScheduled=False, Unschedulable, and not bound
	settled       int         // pods bound or unschedulable
	lastBound     time.Time
	// cpu are the machine's and the components' CPU times at the first
	// create and every 10 s after, and once all pods settled.
	cpu []cpuSample
}

// cpuSample is the machine's CPU time and each component's usage at one
// moment.
type cpuSample struct {
	at      time.Time
	machine procstat.Machine
	procs   map[string]procUsage
}

// sampleCPU samples the machine and the processes pids now, every 10 s
// until stop is closed, and then once more; the samples come on the
// channel it returns.
func sampleCPU(b testing.TB, pids map[string]int, stop <-chan struct{}) <-chan []cpuSample {
	b.Helper()
	sample := func() cpuSample {
		m, err := procstat.ReadMachine()
		if err != nil {
			b.Error(err)
		}
		procs := make(map[string]procUsage, len(pids))
		for name, pid := range pids {
			u, err := procstat.Read(pid)
			if err != nil {
				b.Errorf("%s: %v", name, err)
			}
			procs[name] = procUsage{cpu: u.CPU, peakRSS: u.PeakRSS}
		}
		return cpuSample{at: time.Now(), machine: m, procs: procs}
	}
	out := make(chan []cpuSample, 1)
	samples := []cpuSample{sample()}
	go func() {
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				samples = append(samples, sample())
			case <-stop:
				out <- append(samples, sample())
				return
			}
		}
	}()
	return out
}

// arrivals are the i-th pod to create, and the ResourceClaim to create
// before it when it has one of its own (else nil).
type arrivals func(i int) (*corev1.Pod, *resourceapi.ResourceClaim)

// podAlone are arrivals of pods without a claim.
func podAlone(pod func(int) *corev1.Pod) arrivals {
	return func(i int) (*corev1.Pod, *resourceapi.ResourceClaim) { return pod(i), nil }
}

// submit creates n pods, next(i) the i-th (its claim first), in order at
// rate a second, calls created (if any) once all are, and returns once each
// is bound or unschedulable, as a pod informer sees them, and no pod was
// bound for scaleQuiet; it fails when none settles for scaleSettle. It
// samples the CPU of the machine and of the processes pids every 10 s
// meanwhile.
func submit(b *testing.B, ctx context.Context, cp *e2ekube.ControlPlane, pids map[string]int, n int, rate float64, next arrivals, created func()) *scaleRun {
	b.Helper()
	run := &scaleRun{created: make([]time.Time, n), admitted: make([]time.Time, n), bound: make([]time.Time, n), unschedulable: make([]bool, n)}
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

	due := make(chan int)
	g, gctx := errgroup.WithContext(ctx)
	// Enough creators that a create taking half a second under load does
	// not hold back the rate asked; each pod still goes out at its time.
	for range max(8, int(rate/2)) {
		g.Go(func() error {
			for i := range due {
				p, claim := next(i)
				run.mu.Lock()
				run.created[i] = time.Now()
				run.mu.Unlock()
				if claim != nil {
					if _, err := cp.Client.ResourceV1().ResourceClaims(scaleNamespace).Create(gctx, claim, metav1.CreateOptions{}); err != nil {
						return fmt.Errorf("creating claim %d (%s): %w", i, p.Labels["trace-pod"], err)
					}
				}
				if _, err := cp.Client.CoreV1().Pods(scaleNamespace).Create(gctx, p, metav1.CreateOptions{}); err != nil {
					return fmt.Errorf("creating pod %d (%s): %w", i, p.Labels["trace-pod"], err)
				}
				run.mu.Lock()
				run.admitted[i] = time.Now()
				run.mu.Unlock()
			}
			return nil
		})
	}
	stopSampling := make(chan struct{})
	samples := sampleCPU(b, pids, stopSampling)
	start := time.Now()
	func() {
		defer close(due)
		for i := range n {
			time.Sleep(time.Until(start.Add(time.Duration(float64(i) * float64(time.Second) / rate))))
			select {
			case due <- i:
			case <-gctx.Done():
				return
			}
		}
	}()
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	if created != nil {
		created()
	}
	was, progressed := -1, time.Now()
	for {
		settled, lastBound := run.progress()
		if settled == n && time.Since(lastBound) > scaleQuiet {
			close(stopSampling)
			run.cpu = <-samples
			return run
		}
		if settled != was {
			was, progressed = settled, time.Now()
		}
		if time.Since(progressed) > scaleSettle {
			b.Fatalf("%d of %d pods bound or unschedulable, and none more for %v", settled, n, scaleSettle)
		}
		time.Sleep(100 * time.Millisecond)
	}
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
		r.bound[i], r.lastBound = now, now
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

func (r *scaleRun) progress() (settled int, lastBound time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.settled, r.lastBound
}

// sideResult is what one side of BenchmarkKubeScale measured.
type sideResult struct {
	name           string
	asked, sent    float64 // pods created a second
	created, bound int
	boundPerSecond float64
	p50, p99, max  time.Duration // creation to bound
	// admission is each pod's Create call, from sending it to its answer:
	// part of creation to bound, and the only part a webhook adds.
	admission []time.Duration
	// byCreation is creation to bound of the pods created in each 10 s.
	byCreation [][]time.Duration
	// cpuBy10s is the CPU of the machine and of each component in each
	// 10 s of the run.
	cpuBy10s    []cpuWindow
	lastBound   time.Duration // from the first create to the last bind
	cpu         map[string]time.Duration
	peakRSS     map[string]int64
	unallocated float64 // GPU share (%) the side left unallocated
}

// result sums up the run: throughput, latencies, each component's CPU
// over the run and peak memory.
func (r *scaleRun) result(name string, rate float64) *sideResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := &sideResult{name: name, asked: rate, created: len(r.created), cpu: map[string]time.Duration{}, peakRSS: map[string]int64{}}
	var latencies []time.Duration
	for i, t := range r.bound {
		if !t.IsZero() {
			latencies = append(latencies, t.Sub(r.created[i]))
		}
	}
	res.bound = len(latencies)
	slices.Sort(latencies)
	quantile := func(q float64) time.Duration {
		if len(latencies) == 0 {
			return 0
		}
		return latencies[int(q*float64(len(latencies)-1))]
	}
	res.p50, res.p99, res.max = quantile(0.5), quantile(0.99), quantile(1)
	for i, t := range r.admitted {
		res.admission = append(res.admission, t.Sub(r.created[i]))
	}
	for i, t := range r.bound {
		if !t.IsZero() {
			at := tenSeconds(&res.byCreation, r.created[0], r.created[i])
			*at = append(*at, t.Sub(r.created[i]))
		}
	}
	last := r.created[len(r.created)-1]
	res.sent = float64(len(r.created)-1) / last.Sub(r.created[0]).Seconds()
	res.boundPerSecond = float64(res.bound) / r.lastBound.Sub(r.created[0]).Seconds()
	res.lastBound = r.lastBound.Sub(r.created[0])
	for k := 1; k < len(r.cpu); k++ {
		from, to := r.cpu[k-1], r.cpu[k]
		wnd := cpuWindow{busy: to.machine.Busy - from.machine.Busy, steal: to.machine.Steal - from.machine.Steal,
			wall: to.at.Sub(from.at), procs: map[string]time.Duration{}}
		for name, u := range to.procs {
			wnd.procs[name] = u.cpu - from.procs[name].cpu
		}
		res.cpuBy10s = append(res.cpuBy10s, wnd)
	}
	opening, closing := r.cpu[0], r.cpu[len(r.cpu)-1]
	for name, u := range closing.procs {
		res.cpu[name] = u.cpu - opening.procs[name].cpu
		res.peakRSS[name] = u.peakRSS
	}
	return res
}

// cpuWindow is the CPU time spent in one window of the run, all CPUs
// summed: busy, stolen by a hypervisor, by each component, in wall time.
type cpuWindow struct {
	busy, steal, wall time.Duration
	procs             map[string]time.Duration
}

// String says the window's busy and stolen CPU, in cores, and what each
// component and everything else (this benchmark, other processes) spent.
func (w cpuWindow) String() string {
	cores := func(d time.Duration) float64 { return d.Seconds() / w.wall.Seconds() }
	var b strings.Builder
	fmt.Fprintf(&b, "%.2f busy, %.2f stolen:", cores(w.busy), cores(w.steal))
	rest := w.busy
	for _, name := range slices.Sorted(maps.Keys(w.procs)) {
		fmt.Fprintf(&b, " %s %.2f", name, cores(w.procs[name]))
		rest -= w.procs[name]
	}
	fmt.Fprintf(&b, ", the rest %.2f", cores(rest))
	return b.String()
}

// tenSeconds is the slot of t among slots of 10 s from start, the slots
// grown to hold it.
func tenSeconds[T any](slots *[]T, start, t time.Time) *T {
	k := max(0, int(t.Sub(start)/(10*time.Second)))
	for len(*slots) <= k {
		*slots = append(*slots, *new(T))
	}
	return &(*slots)[k]
}

// report prints the side's figures and reports them as metrics.
func (res *sideResult) report(b *testing.B) {
	b.Helper()
	fmt.Printf("\n%s at 1,213 nodes: %d pods created at %.0f/s (%.0f/s asked); %d bound, %d unschedulable; %.1f pods bound/s; "+
		"creation to bound p50 %v, p99 %v, max %v; the last bound %v after the first created; the Create call (admission) p50 %v, p99 %v, max %v\n",
		res.name, res.created, res.sent, res.asked, res.bound, res.created-res.bound, res.boundPerSecond,
		res.p50.Round(time.Millisecond), res.p99.Round(time.Millisecond), res.max.Round(time.Millisecond), res.lastBound.Round(time.Millisecond),
		quantileOf(res.admission, 0.5), quantileOf(res.admission, 0.99), quantileOf(res.admission, 1))
	fmt.Println("  creation to bound by 10 s of creation (pods bound: p50 / p99 / max):")
	for k, d := range res.byCreation {
		fmt.Printf("    %4ds %4d  %v / %v / %v\n", 10*k, len(d), quantileOf(d, 0.5), quantileOf(d, 0.99), quantileOf(d, 1))
	}
	fmt.Printf("  the machine by 10 s of the run, in cores of %d: busy, stolen by the hypervisor, each component:\n", runtime.NumCPU())
	for k, w := range res.cpuBy10s {
		fmt.Printf("    %4ds  %v\n", 10*k, w)
	}
	for _, name := range slices.Sorted(maps.Keys(res.cpu)) {
		fmt.Printf("  %-24s %7.1f CPU s  %6.2f CPU ms a pod  %5.0f MB peak RSS\n", name, res.cpu[name].Seconds(),
			res.cpuPerPod(name), float64(res.peakRSS[name])/(1<<20))
		b.ReportMetric(res.cpuPerPod(name), name+"-cpu-ms/pod")
		b.ReportMetric(float64(res.peakRSS[name])/(1<<20), name+"-rss-MB")
	}
	b.ReportMetric(res.sent, "created/s")
	b.ReportMetric(res.boundPerSecond, "bound/s")
	b.ReportMetric(float64(res.p50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(res.p99.Microseconds())/1000, "p99-ms")
	b.ReportMetric(res.unallocated, "unallocated-%")
}

// cpuPerPod is the CPU milliseconds component spent per pod created.
func (res *sideResult) cpuPerPod(component string) float64 {
	return float64(res.cpu[component].Microseconds()) / 1000 / float64(res.created)
}

// totalCPUPerPod is the CPU milliseconds a pod cost all components.
func (res *sideResult) totalCPUPerPod() float64 {
	total := 0.0
	for name := range res.cpu {
		total += res.cpuPerPod(name)
	}
	return total
}

// poolComponents are gpupool's own processes.
var poolComponents = []string{"allocator", "gpupool-scheduler", "gpupool-webhook"}

// compareSides is the side-by-side table of one rate, with the targets
// for the pool against the stock kube-scheduler.
func compareSides(rate float64, w *scaleWorkload, pool, stock *sideResult) string {
	t := sideBySide(fmt.Sprintf("%.0f pods a second asked, %d OpenB pods on 1,213 nodes", rate, len(w.pods)), pool, stock)
	fmt.Fprintf(t, "| GPU share unallocated, shared (replay in arrival order) | %.2f%% (%.2f%%) | | |\n", pool.unallocated, w.replayed)
	fmt.Fprintf(t, "| GPUs idle, whole GPUs (pool: replay) | %.2f%% | %.2f%% | |\n", w.whole, stock.unallocated)
	return t.String()
}

// sideBySide is the table of what the two sides share: throughput,
// latency, CPU and memory by component, against the pool's targets.
func sideBySide(title string, pool, stock *sideResult) *strings.Builder {
	var t strings.Builder
	fmt.Fprintf(&t, "\n### %s\n\n", title)
	fmt.Fprintln(&t, "| | gpupool | stock kube-scheduler | gpupool / stock |")
	fmt.Fprintln(&t, "|---|--:|--:|--:|")
	fmt.Fprintf(&t, "| pods created a second | %.0f | %.0f | |\n", pool.sent, stock.sent)
	fmt.Fprintf(&t, "| pods bound a second | %.1f | %.1f | %.2f (target ≥ 0.8) |\n", pool.boundPerSecond, stock.boundPerSecond, pool.boundPerSecond/stock.boundPerSecond)
	fmt.Fprintf(&t, "| creation to bound, p50 | %v | %v | |\n", pool.p50.Round(time.Millisecond), stock.p50.Round(time.Millisecond))
	fmt.Fprintf(&t, "| creation to bound, p99 | %v | %v | %.2f (target ≤ 1.5) |\n", pool.p99.Round(time.Millisecond), stock.p99.Round(time.Millisecond),
		pool.p99.Seconds()/stock.p99.Seconds())
	fmt.Fprintf(&t, "| the Create call (admission), p50 / p99 | %v / %v | %v / %v | |\n", quantileOf(pool.admission, 0.5), quantileOf(pool.admission, 0.99),
		quantileOf(stock.admission, 0.5), quantileOf(stock.admission, 0.99))
	fmt.Fprintf(&t, "| bound / unschedulable | %d / %d | %d / %d | |\n", pool.bound, pool.created-pool.bound, stock.bound, stock.created-stock.bound)
	for _, name := range append(slices.Clone(controlPlane), poolComponents...) {
		s := "–"
		if _, ok := stock.cpu[name]; ok {
			s = fmt.Sprintf("%.2f", stock.cpuPerPod(name))
		}
		fmt.Fprintf(&t, "| CPU ms a pod, %s | %.2f | %s | |\n", name, pool.cpuPerPod(name), s)
	}
	fmt.Fprintf(&t, "| CPU ms a pod, all | %.2f | %.2f | %.2f |\n", pool.totalCPUPerPod(), stock.totalCPUPerPod(), pool.totalCPUPerPod()/stock.totalCPUPerPod())
	own := 0.0
	for _, name := range poolComponents {
		own += pool.cpuPerPod(name)
	}
	fmt.Fprintf(&t, "| gpupool's own share of the CPU a pod | %.1f%% | | (target ≤ 20%%) |\n", 100*own/pool.totalCPUPerPod())
	for _, name := range append(slices.Clone(controlPlane), poolComponents...) {
		s := "–"
		if rss, ok := stock.peakRSS[name]; ok {
			s = fmt.Sprintf("%.0f", float64(rss)/(1<<20))
		}
		fmt.Fprintf(&t, "| peak RSS MB, %s | %.0f | %s | |\n", name, float64(pool.peakRSS[name])/(1<<20), s)
	}
	return &t
}

// procUsage is a process's CPU time so far and its peak resident memory.
type procUsage struct {
	cpu     time.Duration
	peakRSS int64 // bytes
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
