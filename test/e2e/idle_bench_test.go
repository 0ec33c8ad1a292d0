package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/procstat"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/leases"
	e2ekube "github.com/gpupool/gpupool/test/e2e/kube"
)

// BenchmarkIdleReclaim's policy, pool and clock. The policy is a 30-minute
// window and 15 minutes' grace compressed 30 times to the shortest window
// the allocator takes (six samples, 10 s apart) and a grace of 15 s (a
// shorter one than 30 times would give: it only has to leave room for the
// lease controller's 10 s round).
const (
	idleOffNamespace = "idle-off"
	idleOnNamespace  = "idle-on"
	idleUseBelow     = 0.1
	idleWindow       = time.Minute
	idleGrace        = 15 * time.Second
	idleCompression  = 30
	// idleScenario is how long each side's use timelines run, from the
	// first reading; the last "ends" workload goes idle at 60 s, its GPUs
	// are due back at about 135 s, and resumed 5 s later.
	idleScenario = 200 * time.Second
	// The daemons' heartbeat, as gpupool-server's; how often the
	// benchmark reads which leases hold GPUs, for the ground truth; how
	// often a silent server's daemon gets through.
	idleFeedEvery    = 5 * time.Second
	idleObserveEvery = time.Second
	idleSilentEvery  = time.Minute
	// The SM use fed for a lease busy and idle, as a fraction of its
	// share: idle is under idleUseBelow, not zero (a notebook's kernel).
	idleBusyUse, idleIdleUse = 0.8, 0.02
	// The pool: H100 servers for the workloads, and L40S servers whose
	// daemon is silent but once a minute, which only the workloads of
	// pattern silent ask for (gpupool.io/gpu-models), so that the silence
	// touches no other lease.
	idleServers, idleSilentServers, idleGPUsPerServer = 30, 2, 8
)

// BenchmarkIdleReclaim is TestIdleReclaim at the scale of a shared
// cluster: 200 workloads of the four kinds (notebooks as bare pods and as
// StatefulSets, training Deployments, Jobs, and services under an HPA),
// about 250 pods on 32 servers of 8 GPUs, each workload with a use timeline:
// idle from the start (a notebook left open), busy then idle for good (the
// work ended, the pod stayed), bursty (bursts of 5 to 20 s, idle gaps of 30 to 40 s, shorter
// than the 1-minute window), busy throughout, and idle with its telemetry
// missing: the lease absent from 20 s of every 50 s of its server's
// readings, its readings stopping at 30 s, one of its two GPUs unread from
// 30 s, or its whole server's daemon silent but for one heartbeat a
// minute. The last four must never be reclaimed: unknown is never idle.
// The allocator measures a lease once every 10 s, counts each sample for
// the 10 s before it, and takes a reading for up to 30 s; the timelines
// leave that resolution a margin (bursty gaps at most 40 s, telemetry
// read for at most 30 s at a time, a silent server's one reading a
// minute), so that no idle minute can be measured where the timeline has
// none: a reclaim of theirs is the product's.
//
// It runs on the end-to-end control plane (kube-apiserver, etcd,
// kube-controller-manager with the Job, Deployment, StatefulSet and HPA
// controllers, kwok's nodes and pods), with gpupool deployed on it as
// users deploy it (webhook, gpupool-kube-scheduler's plugin, the lease
// controller, the allocator), and the daemons' use fed to the allocator
// every 5 s as gpupool-server heart-beats it (feedUse, one heartbeat per
// server): kwok runs no process, so the benchmark plays each workload's
// timeline, compressed 30 times (the window of 1 minute stands for 30),
// against the real controllers that act on it.
//
// The same 200 workloads, the same timelines, run twice, one side after
// the other on one pool: in namespace idle-off, whose idle policy only
// reports (action: report), then in idle-on, whose policy reclaims
// (action: reclaim), each side's workloads deleted before the next; both
// {useBelow: 0.1, window: 1m, grace: 15s}. One after the other, not side
// by side, so that the allocator's CPU is each side's alone, and the two
// sides' reclaims, resumes and feeds do not queue behind each other on a
// 2-core machine; it doubles the wall time, to about 8 minutes. On the
// reclaiming side, eight reclaimed workloads (two of each kind reclaimed:
// notebook pod, notebook StatefulSet, training Deployment, Job) are
// resumed 5 s after their GPUs are back, as their owners would (gpupool
// resume's leases.Resume; a bare pod created again), and are busy from
// then on.
//
// It reports, side by side: the GPU-hours held by leases while their
// workload's use (its timeline: the ground truth, whether or not the
// allocator could read it) was under the bar, measured over each side's
// 200 s as run, not scaled (at 30 times, a real cluster's would be 30
// times more); the GPUs free at the end; from a workload's idle start (in
// its timeline) to its GPUs back in the pool, p50 and p99, against
// window + grace; the false reclaims, counted from what the API showed
// (a Job suspended, a Deployment or StatefulSet scaled to 0, a bare pod
// or any other pod deleted) and judged against the timelines: anything
// reclaimed on the reporting side, and on the reclaiming side anything
// but a notebook, training Deployment or Job idle in its timeline, read,
// for window + grace (less one 10 s sample, which the allocator counts
// for the interval before it), each with when the feed last told the
// allocator its workload was busy or unread; the idle warnings (Events
// IdleGPUs) judged the same way against the window; the time a resumed
// workload takes to hold its GPUs again; and the allocator's CPU per
// minute per 1,000 leases the side began with (the same workload's), from
// /proc/<pid>/stat: it serves the heartbeats and the lease controller, and
// the benchmark's own reads of every lease each second, alike on both
// sides; the difference is the policy's. It fails on any false reclaim.
func BenchmarkIdleReclaim(b *testing.B) {
	ctx, cancel := context.WithTimeout(b.Context(), 18*time.Minute)
	defer cancel()
	policy := fmt.Sprintf("{useBelow: %g, window: %v, grace: %v, action: %%s}", idleUseBelow, idleWindow, idleGrace)
	pool := startKubePool(b, ctx, kubePoolOptions{Namespaces: []string{idleOffNamespace, idleOnNamespace},
		IdlePolicies: map[string]string{idleOffNamespace: fmt.Sprintf(policy, "report"), idleOnNamespace: fmt.Sprintf(policy, "reclaim")}})
	servers := addIdleServers(b, ctx, pool)
	workloads := idleWorkloads()
	var off, on *idleSide
	for b.Loop() {
		off = runIdleSide(b, ctx, pool, servers, newIdleSide(idleOffNamespace, false, workloads))
		on = runIdleSide(b, ctx, pool, servers, newIdleSide(idleOnNamespace, true, workloads))
	}
	reportIdleSides(b, off, on)
}

// idleServer is one of the benchmark's GPU servers; a silent one's daemon
// heart-beats once a minute.
type idleServer struct {
	name   string
	silent bool
}

// addIdleServers adds the kwok nodes and registers them as GPU servers.
func addIdleServers(b testing.TB, ctx context.Context, pool *kubePool) []idleServer {
	b.Helper()
	var servers []idleServer
	var nodes []e2ekube.Node
	for i := range idleServers + idleSilentServers {
		s := idleServer{name: fmt.Sprintf("gpu-%02d", i), silent: i >= idleServers}
		servers = append(servers, s)
		nodes = append(nodes, e2ekube.Node{Name: s.name, Capacity: map[string]string{"cpu": "96", "memory": "512Gi", "pods": "110"}})
	}
	if err := pool.CP.AddKwokNodes(ctx, nodes); err != nil {
		b.Fatal(err)
	}
	for _, s := range servers {
		srv := gpuServer(s.name, idleGPUsPerServer)
		if s.silent {
			for i := range srv.GPUs {
				srv.GPUs[i].Model, srv.GPUs[i].MemoryBytes = "L40S", 48<<30
			}
		}
		register(b, pool.Servers, srv)
	}
	return servers
}

// The kinds of workload.
type idleKind string

const (
	idleNotebookPod idleKind = "notebook pod"
	idleNotebookSet idleKind = "notebook StatefulSet"
	idleTraining    idleKind = "training Deployment"
	idleJob         idleKind = "Job"
	idleService     idleKind = "service under an HPA"
)

var idleKinds = []idleKind{idleNotebookPod, idleNotebookSet, idleTraining, idleJob, idleService}

// The use timelines.
type idlePattern string

const (
	// idle from the start; ends: busy, then idle from 15, 30, 45 or 60 s;
	// bursty: busy 5-20 s, idle 30-40 s, again and again (a 5 s burst is
	// one heartbeat, which the allocator's 10 s sample may never see);
	// busy throughout.
	patternIdle   idlePattern = "idle"
	patternEnds   idlePattern = "ends"
	patternBursty idlePattern = "bursty"
	patternBusy   idlePattern = "busy"
	// Idle, with telemetry missing: the lease absent from its server's
	// readings 20 s of every 50 s; absent from 30 s on; one of its two
	// GPUs unread from 30 s on; its server's daemon silent but once a
	// minute.
	patternGaps   idlePattern = "readings-gaps"
	patternStops  idlePattern = "readings-stop"
	patternOneGPU idlePattern = "one-gpu-unread"
	patternSilent idlePattern = "server-silent"
)

var idlePatterns = []idlePattern{patternIdle, patternEnds, patternBursty, patternBusy, patternGaps, patternStops, patternOneGPU, patternSilent}

// idleWorkload is one workload and its use timeline, t from the side's
// first reading.
type idleWorkload struct {
	name     string
	kind     idleKind
	pattern  idlePattern
	replicas int
	// gpus per pod, percent of each (0: whole), on GPUs of model.
	gpus, percent int
	model         string
	// end: ends' busy time; busy, gap, phase: bursty's cycle.
	end, busy, gap, phase time.Duration
}

// idleWorkloads are the benchmark's 200 workloads: 248 pods asking 215
// H100s and 10 L40S.
func idleWorkloads() []*idleWorkload {
	type mix struct {
		pattern idlePattern
		n       int
	}
	var out []*idleWorkload
	add := func(kind idleKind, prefix string, mixes ...mix) {
		n := 0
		for _, m := range mixes {
			for i := range m.n {
				w := &idleWorkload{name: fmt.Sprintf("%s-%s-%d", prefix, m.pattern, i), kind: kind, pattern: m.pattern, replicas: 1, gpus: 1, model: "H100"}
				switch kind {
				case idleNotebookPod:
					if n%2 == 1 {
						w.percent = 50
					}
				case idleTraining:
					if n%2 == 1 && m.pattern != patternOneGPU {
						w.replicas = 2
					} else {
						w.gpus = 2
					}
				case idleService:
					w.replicas, w.percent = 2, 50
				}
				switch m.pattern {
				case patternEnds:
					w.end = time.Duration(15*(1+i%4)) * time.Second
				case patternBursty:
					cycles := [][2]time.Duration{{5, 40}, {15, 30}, {10, 40}, {20, 40}}
					w.busy, w.gap = cycles[i%4][0]*time.Second, cycles[i%4][1]*time.Second
					w.phase = time.Duration(7*i) * time.Second % (w.busy + w.gap)
				case patternGaps:
					w.phase = time.Duration(10*i) * time.Second % (50 * time.Second)
				case patternSilent:
					w.model = "L40S"
				}
				out = append(out, w)
				n++
			}
		}
	}
	add(idleNotebookPod, "nb", mix{patternIdle, 16}, mix{patternEnds, 10}, mix{patternBursty, 10}, mix{patternBusy, 6},
		mix{patternGaps, 6}, mix{patternStops, 4}, mix{patternSilent, 8})
	add(idleNotebookSet, "nbset", mix{patternIdle, 10}, mix{patternEnds, 6}, mix{patternBursty, 6}, mix{patternBusy, 2},
		mix{patternGaps, 3}, mix{patternStops, 3})
	add(idleTraining, "train", mix{patternIdle, 4}, mix{patternEnds, 14}, mix{patternBursty, 8}, mix{patternBusy, 6},
		mix{patternOneGPU, 4}, mix{patternGaps, 4})
	add(idleJob, "job", mix{patternIdle, 4}, mix{patternEnds, 14}, mix{patternBursty, 8}, mix{patternBusy, 6},
		mix{patternStops, 4}, mix{patternSilent, 4})
	add(idleService, "svc", mix{patternIdle, 12}, mix{patternEnds, 4}, mix{patternBursty, 8}, mix{patternBusy, 6})
	return out
}

// idleAt is whether the workload's use is under the bar at t of its
// timeline, read or not.
func (w *idleWorkload) idleAt(t time.Duration) bool {
	switch w.pattern {
	case patternBusy:
		return false
	case patternEnds:
		return t >= w.end
	case patternBursty:
		return (t+w.phase)%(w.busy+w.gap) >= w.busy
	}
	return true
}

// idleFrom is when, in its timeline, the workload goes idle for good.
func (w *idleWorkload) idleFrom() time.Duration {
	if w.pattern == patternEnds {
		return w.end
	}
	return 0
}

// read is whether its server's readings hold the lease at t; oneGPU,
// whether one of its GPUs is left out.
func (w *idleWorkload) read(t time.Duration) (read, oneGPU bool) {
	switch w.pattern {
	case patternGaps:
		return (t+w.phase)%(50*time.Second) < 30*time.Second, false
	case patternStops:
		return t < 30*time.Second, false
	case patternOneGPU:
		return true, t >= 30*time.Second
	}
	return true, false
}

// reclaimable is whether a reclaiming policy should reclaim it: idle for
// good, read throughout, and no autoscaler's.
func (w *idleWorkload) reclaimable() bool {
	return (w.pattern == patternIdle || w.pattern == patternEnds) && w.kind != idleService
}

// pod is the workload's pod, as its owner's template or as itself.
func (w *idleWorkload) pod() *corev1.Pod {
	pod := bfkPod("", w.gpus, w.percent)
	pod.Labels = map[string]string{"workload": w.name}
	pod.Annotations = map[string]string{kube.AnnotationModels: w.model}
	switch w.kind {
	case idleJob:
		// kwok completes a Job's pod at once but one that runs until
		// deleted.
		pod.Labels["runsUntilDeleted"] = "true"
		pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	case idleNotebookPod:
		pod.Name = w.name
	}
	return pod
}

// create creates the workload in namespace ns.
func (w *idleWorkload) create(ctx context.Context, c kubernetes.Interface, ns string) error {
	pod := w.pod()
	template := corev1.PodTemplateSpec{ObjectMeta: pod.ObjectMeta, Spec: pod.Spec}
	meta := metav1.ObjectMeta{Name: w.name}
	selector := &metav1.LabelSelector{MatchLabels: map[string]string{"workload": w.name}}
	replicas := ptr.To(int32(w.replicas))
	var err error
	switch w.kind {
	case idleNotebookPod:
		_, err = c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	case idleNotebookSet:
		_, err = c.AppsV1().StatefulSets(ns).Create(ctx, &appsv1.StatefulSet{ObjectMeta: meta, Spec: appsv1.StatefulSetSpec{Replicas: replicas,
			Selector: selector, Template: template, ServiceName: w.name, PodManagementPolicy: appsv1.ParallelPodManagement}}, metav1.CreateOptions{})
	case idleJob:
		_, err = c.BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{ObjectMeta: meta, Spec: batchv1.JobSpec{Parallelism: replicas, Template: template}},
			metav1.CreateOptions{})
	case idleTraining, idleService:
		_, err = c.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: meta, Spec: appsv1.DeploymentSpec{Replicas: replicas,
			Selector: selector, Template: template}}, metav1.CreateOptions{})
		if err == nil && w.kind == idleService {
			// On CPU, which kwok's pods never report: the HPA is there, and
			// holds the Deployment at its size; the lease controller must
			// leave it to it.
			_, err = c.AutoscalingV2().HorizontalPodAutoscalers(ns).Create(ctx, &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: meta,
				Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
					ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: w.name},
					MinReplicas:    replicas, MaxReplicas: int32(2 * w.replicas),
					Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{
						Name: corev1.ResourceCPU, Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To[int32](80)}}}},
				}}, metav1.CreateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("creating %s %s: %w", w.kind, w.name, err)
	}
	return nil
}

// resume resumes the reclaimed workload as its owner does, through
// leases.Resume (what gpupool resume runs), or a bare pod created again.
func (w *idleWorkload) resume(ctx context.Context, c kubernetes.Interface, ns string) error {
	ref := map[idleKind]string{idleJob: "job/", idleNotebookSet: "statefulset/", idleTraining: "deployment/"}[w.kind] + w.name
	if w.kind == idleNotebookPod {
		_, err := c.CoreV1().Pods(ns).Create(ctx, w.pod(), metav1.CreateOptions{})
		return err
	}
	_, err := leases.Resume(ctx, c, ns, ref)
	return err
}

// idleReclaim is a reclaim, or a pod's deletion, as the API showed it.
type idleReclaim struct {
	workload, how string
	at            time.Time
	// owned: a pod of a controller deleted, which is no way the policy
	// reclaims but with its owner.
	owned bool
}

// idleSide is one side's run and what it measured.
type idleSide struct {
	ns        string
	reclaims  bool // the policy's action: reclaim, or report
	workloads []*idleWorkload
	byName    map[string]*idleWorkload
	t0, end   time.Time

	mu sync.Mutex
	// resumed: when each resumed workload was; back: when each workload
	// first held no lease; seen: the reclaims and pod deletions the API
	// showed.
	resumed map[string]time.Time
	back    map[string]time.Time
	seen    []idleReclaim
	// pods: each pod's workload, by UID; warned: the IdleGPUs Events;
	// notIdle: when the feed sent a reading of each workload busy, or
	// left one of its leases' GPUs unread.
	pods    map[types.UID]string
	warned  []idleReclaim
	notIdle map[string][]time.Time
	// GPU-seconds held, and held idle, by pattern; lease-seconds held.
	held, idleHeld map[idlePattern]float64
	leaseSeconds   float64
	resumes        []time.Duration

	leases                      int // at the start
	allocatorCPU, controllerCPU time.Duration
	gpusFree                    float64
	falseReclaims, falseWarned  []string
}

func newIdleSide(ns string, reclaims bool, ws []*idleWorkload) *idleSide {
	s := &idleSide{ns: ns, reclaims: reclaims, workloads: ws, byName: map[string]*idleWorkload{}, resumed: map[string]time.Time{},
		back: map[string]time.Time{}, pods: map[types.UID]string{}, notIdle: map[string][]time.Time{}, held: map[idlePattern]float64{}, idleHeld: map[idlePattern]float64{}}
	for _, w := range ws {
		s.byName[w.name] = w
	}
	return s
}

// idleNow is whether w's use is under the bar at now: its timeline's, or
// busy once resumed; s.mu is held.
func (s *idleSide) idleNow(w *idleWorkload, now time.Time) bool {
	if at, ok := s.resumed[w.name]; ok && !now.Before(at) {
		return false
	}
	return w.idleAt(now.Sub(s.t0))
}

// runIdleSide creates the side's workloads, waits until each pod holds its
// lease, plays the timelines for idleScenario while it reads the
// allocator's leases and watches the workloads, and deletes them.
func runIdleSide(b *testing.B, ctx context.Context, pool *kubePool, servers []idleServer, s *idleSide) *idleSide {
	b.Helper()
	c := pool.CP.Client
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	pods := 0
	for _, w := range s.workloads {
		pods += w.replicas
		g.Go(func() error { return w.create(gctx, c, s.ns) })
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	created := time.Now()
	var held []api.Lease
	pollUntil(b, 4*time.Minute, "every pod holding its lease", func() bool {
		var err error
		held, err = pool.Admin.Leases(ctx, client.LeaseFilter{Namespace: s.ns})
		if err != nil || len(held) != pods {
			return false
		}
		bound, err := leasedPods(ctx, c, s.ns, "")
		return err == nil && len(bound) == pods
	})
	s.leases = len(held)
	fmt.Printf("%s: %d workloads, %d pods each holding its lease %v after the last was created\n", s.ns, len(s.workloads), pods, time.Since(created).Round(time.Second))

	factory := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(s.ns))
	s.watch(factory)
	stopInformers := make(chan struct{})
	factory.Start(stopInformers)
	factory.WaitForCacheSync(stopInformers)

	allocator, controller := pool.Allocator.cmd.Process.Pid, pool.scheduler.Process.Pid
	cpu0 := [2]procstat.Usage{readUsage(b, allocator), readUsage(b, controller)}
	s.t0 = time.Now()
	playing, stop := context.WithDeadline(ctx, s.t0.Add(idleScenario))
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() { s.feed(playing, b, pool, servers) })
	wg.Go(func() { s.observe(playing, b, pool) })
	if s.reclaims {
		for _, w := range idleResumed(s.workloads) {
			wg.Go(func() { s.resumeWhenBack(playing, b, c, w) })
		}
	}
	<-playing.Done()
	wg.Wait()
	s.end = time.Now()
	cpu1 := [2]procstat.Usage{readUsage(b, allocator), readUsage(b, controller)}
	s.allocatorCPU, s.controllerCPU = cpu1[0].CPU-cpu0[0].CPU, cpu1[1].CPU-cpu0[1].CPU
	status, err := pool.Admin.Pool(ctx)
	if err != nil {
		b.Fatal(err)
	}
	s.gpusFree = float64(len(servers)*idleGPUsPerServer) - allocatedShare(status).GPUs()
	events, err := c.CoreV1().Events(s.ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + leases.EventIdle})
	if err != nil {
		b.Fatal(err)
	}
	close(stopInformers)
	factory.Shutdown()
	for _, e := range events.Items {
		s.warned = append(s.warned, idleReclaim{workload: s.pods[e.InvolvedObject.UID], how: "warned idle", at: e.FirstTimestamp.Time})
	}
	s.judge()

	deleteIdleWorkloads(b, ctx, c, s.ns)
	pollUntil(b, 3*time.Minute, "the deleted workloads' leases ended", func() bool {
		ls, err := pool.Admin.Leases(ctx, client.LeaseFilter{Namespace: s.ns})
		return err == nil && len(ls) == 0
	})
	return s
}

// pollUntil waits until cond holds, asking every second: what it asks
// lists hundreds of objects.
func pollUntil(b testing.TB, limit time.Duration, what string, cond func() bool) {
	b.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(time.Second) {
		if time.Now().After(deadline) {
			b.Fatalf("not %s within %v", what, limit)
		}
	}
}

func readUsage(b testing.TB, pid int) procstat.Usage {
	b.Helper()
	u, err := procstat.Read(pid)
	if err != nil {
		b.Fatal(err)
	}
	return u
}

// leasedPods are namespace ns's pods (of workload, if not "") bound with
// their lease and not terminating.
func leasedPods(ctx context.Context, c kubernetes.Interface, ns, workload string) ([]corev1.Pod, error) {
	selector := ""
	if workload != "" {
		selector = "workload=" + workload
	}
	list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil && p.Annotations[kube.AnnotationLease] != "" {
			out = append(out, p)
		}
	}
	return out, nil
}

// watch records what the API shows of reclaims: a Job suspended, a
// Deployment or StatefulSet scaled to 0, a pod deleted.
func (s *idleSide) watch(factory informers.SharedInformerFactory) {
	record := func(workload, how string, owned bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.seen = append(s.seen, idleReclaim{workload: workload, how: how, at: time.Now(), owned: owned})
	}
	_, _ = factory.Batch().V1().Jobs().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(old, cur any) {
		o, n := old.(*batchv1.Job), cur.(*batchv1.Job)
		if !ptr.Deref(o.Spec.Suspend, false) && ptr.Deref(n.Spec.Suspend, false) {
			record(n.Name, "suspended", false)
		}
	}})
	scaled := func(name string, old, cur *int32) {
		if ptr.Deref(old, 1) > 0 && ptr.Deref(cur, 1) == 0 {
			record(name, "scaled to 0", false)
		}
	}
	_, _ = factory.Apps().V1().Deployments().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(old, cur any) {
		scaled(cur.(*appsv1.Deployment).Name, old.(*appsv1.Deployment).Spec.Replicas, cur.(*appsv1.Deployment).Spec.Replicas)
	}})
	_, _ = factory.Apps().V1().StatefulSets().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(old, cur any) {
		scaled(cur.(*appsv1.StatefulSet).Name, old.(*appsv1.StatefulSet).Spec.Replicas, cur.(*appsv1.StatefulSet).Spec.Replicas)
	}})
	var deleted sync.Map // pod UIDs recorded
	podGone := func(pod *corev1.Pod) {
		if _, dup := deleted.LoadOrStore(pod.UID, true); dup {
			return
		}
		record(pod.Labels["workload"], "pod deleted", metav1.GetControllerOf(pod) != nil)
	}
	_, _ = factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			pod := obj.(*corev1.Pod)
			s.mu.Lock()
			defer s.mu.Unlock()
			s.pods[pod.UID] = pod.Labels["workload"]
		},
		UpdateFunc: func(old, cur any) {
			if pod := cur.(*corev1.Pod); old.(*corev1.Pod).DeletionTimestamp == nil && pod.DeletionTimestamp != nil {
				podGone(pod)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				podGone(pod)
			}
		},
	})
}

// feed heart-beats every server every idleFeedEvery with its leases' SM
// use by their workloads' timelines, as their daemons would, leaving out
// what the timelines do not read; a silent server's daemon gets through
// once every idleSilentEvery.
func (s *idleSide) feed(ctx context.Context, b testing.TB, pool *kubePool, servers []idleServer) {
	tick := time.NewTicker(idleFeedEvery)
	defer tick.Stop()
	for ; ctx.Err() == nil; <-tick.C {
		ls, err := pool.Admin.Leases(ctx, client.LeaseFilter{Namespace: s.ns})
		if err != nil {
			continue
		}
		now := time.Now()
		t := now.Sub(s.t0)
		on := map[string][]api.Lease{}
		for _, l := range ls {
			on[l.Server] = append(on[l.Server], l)
		}
		s.mu.Lock()
		var beats []func() error
		for _, srv := range servers {
			if srv.silent && t%idleSilentEvery >= idleFeedEvery {
				continue
			}
			use := &api.ServerUse{SampledAt: now}
			hb := api.Heartbeat{Use: use}
			gpu := make([]float64, idleGPUsPerServer)
			for _, l := range on[srv.name] {
				w := s.byName[l.Owner.Labels["workload"]]
				if w == nil {
					continue
				}
				read, oneGPU := w.read(t)
				if _, ok := s.resumed[w.name]; ok {
					read, oneGPU = true, false
				}
				level := idleBusyUse
				if s.idleNow(w, now) {
					level = idleIdleUse
				}
				if sent := s.notIdle[w.name]; (!read || oneGPU || level == idleBusyUse) && (len(sent) == 0 || sent[len(sent)-1] != now) {
					s.notIdle[w.name] = append(sent, now)
				}
				if !read {
					continue
				}
				for i, g := range l.GPUs {
					if oneGPU && i == len(l.GPUs)-1 {
						continue
					}
					sm := level * g.Percent / 100
					gpu[g.Index] = min(1, gpu[g.Index]+sm)
					use.Leases = append(use.Leases, api.LeaseUse{Lease: l.ID, GPU: g.Index, SMUtilization: ptr.To(sm)})
				}
			}
			for i := range idleGPUsPerServer {
				hb.GPUs = append(hb.GPUs, api.GPUHealth{Index: i, Healthy: true})
				use.GPUs = append(use.GPUs, api.GPUUse{Index: i, Utilization: ptr.To(gpu[i])})
			}
			beats = append(beats, func() error { return pool.Servers.Heartbeat(ctx, srv.name, hb) })
		}
		s.mu.Unlock()
		for _, beat := range beats {
			if err := beat(); err != nil && ctx.Err() == nil {
				b.Errorf("heartbeat: %v", err)
			}
		}
	}
}

// observe reads the side's leases every idleObserveEvery: the GPU-seconds
// held, and held while the workload's use was under the bar, and when
// each workload first held none.
func (s *idleSide) observe(ctx context.Context, b testing.TB, pool *kubePool) {
	tick := time.NewTicker(idleObserveEvery)
	defer tick.Stop()
	last := s.t0
	for ; ctx.Err() == nil; <-tick.C {
		ls, err := pool.Admin.Leases(ctx, client.LeaseFilter{Namespace: s.ns})
		if err != nil {
			if ctx.Err() == nil {
				b.Errorf("listing the leases: %v", err)
			}
			continue
		}
		now := time.Now()
		dt := now.Sub(last).Seconds()
		last = now
		s.mu.Lock()
		holding := map[string]bool{}
		for _, l := range ls {
			w := s.byName[l.Owner.Labels["workload"]]
			if w == nil {
				continue
			}
			holding[w.name] = true
			share := 0.0
			for _, g := range l.GPUs {
				share += g.Percent / 100
			}
			s.held[w.pattern] += share * dt
			s.leaseSeconds += dt
			if s.idleNow(w, now) {
				s.idleHeld[w.pattern] += share * dt
			}
		}
		for _, w := range s.workloads {
			if _, done := s.back[w.name]; !done && !holding[w.name] {
				s.back[w.name] = now
			}
		}
		s.mu.Unlock()
	}
}

// idleResumed are the workloads the reclaiming side resumes: of each kind
// the policy reclaims, the first idle from the start and the first whose
// work ends.
func idleResumed(ws []*idleWorkload) []*idleWorkload {
	var out []*idleWorkload
	for _, kind := range idleKinds {
		for _, p := range []idlePattern{patternIdle, patternEnds} {
			if i := slices.IndexFunc(ws, func(w *idleWorkload) bool { return w.kind == kind && w.pattern == p && w.reclaimable() }); i >= 0 {
				out = append(out, ws[i])
			}
		}
	}
	return out
}

// resumeWhenBack resumes w 5 s after its GPUs are back in the pool, busy
// from then on, and times until each of its pods is bound with its lease.
func (s *idleSide) resumeWhenBack(ctx context.Context, b testing.TB, c kubernetes.Interface, w *idleWorkload) {
	for {
		s.mu.Lock()
		_, back := s.back[w.name]
		s.mu.Unlock()
		if back {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(5 * time.Second):
	}
	start := time.Now()
	s.mu.Lock()
	s.resumed[w.name] = start
	s.mu.Unlock()
	if err := w.resume(ctx, c, s.ns); err != nil {
		b.Errorf("resuming %s: %v", w.name, err)
		return
	}
	for {
		bound, err := leasedPods(ctx, c, s.ns, w.name)
		if err == nil && len(bound) == w.replicas {
			break
		}
		if ctx.Err() != nil {
			b.Errorf("%s resumed %v before the end still holds no GPUs", w.name, time.Since(start).Round(time.Second))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.mu.Lock()
	s.resumes = append(s.resumes, time.Since(start))
	s.mu.Unlock()
}

// judge counts the false reclaims: on the reporting side every reclaim;
// on the reclaiming side one of a workload the policy should not reclaim,
// or before its timeline was idle and read for window + grace, less the
// one 10 s sample the allocator counts for the interval before it, or
// after it was resumed; a pod of a controller deleted with no reclaim of
// its owner; and GPUs back in the pool with no reclaim the API showed.
// It counts the false idle warnings the same way, against the window.
func (s *idleSide) judge() {
	owners := map[string][]time.Time{}
	for _, r := range s.seen {
		if !r.owned {
			owners[r.workload] = append(owners[r.workload], r.at)
		}
	}
	for _, r := range s.seen {
		why := s.unjustified(r, idleWindow+idleGrace, true)
		if r.owned {
			// With its owner's reclaim, a moment apart in the informers.
			if slices.ContainsFunc(owners[r.workload], func(at time.Time) bool { return at.Before(r.at.Add(2 * time.Second)) }) {
				continue
			}
			why = "a pod of a controller deleted, its owner not reclaimed"
		}
		if why != "" {
			s.falseReclaims = append(s.falseReclaims, s.describe(r, why))
		}
	}
	for _, w := range s.workloads {
		if at, ok := s.back[w.name]; ok && len(owners[w.name]) == 0 {
			s.falseReclaims = append(s.falseReclaims, s.describe(idleReclaim{workload: w.name, how: "GPUs back in the pool", at: at}, "no reclaim seen"))
		}
	}
	for _, r := range s.warned {
		// Event times are whole seconds.
		if why := s.unjustified(r, idleWindow-time.Second, false); why != "" {
			s.falseWarned = append(s.falseWarned, s.describe(r, why))
		}
	}
}

// unjustified says why r, a reclaim (or an idle warning, if not reclaim),
// is false, or "" when the timelines justify it: its workload idle and
// read for at least least, less one sample.
func (s *idleSide) unjustified(r idleReclaim, least time.Duration, reclaim bool) string {
	w := s.byName[r.workload]
	if w == nil {
		return "of no workload"
	}
	idle := r.at.Sub(s.t0.Add(w.idleFrom()))
	resumed, wasResumed := s.resumed[r.workload]
	switch {
	case reclaim && !s.reclaims:
		return "under a policy that only reports"
	case reclaim && w.kind == idleService:
		return "scaled by its HPA"
	case w.pattern != patternIdle && w.pattern != patternEnds:
		return "never idle and read for a whole window"
	case wasResumed && r.at.After(resumed):
		return "busy since it was resumed"
	case idle < least-api.HistoryInterval:
		return fmt.Sprintf("idle only %v", idle.Round(time.Second))
	}
	return ""
}

// describe says what r was, why it is false, and when before it the
// feed last sent a reading of its workload busy or unread: less than
// window + grace (less a sample) before a reclaim, the allocator had
// been told the workload was not idle.
func (s *idleSide) describe(r idleReclaim, why string) string {
	w := s.byName[r.workload]
	what := "?"
	if w != nil {
		what = fmt.Sprintf("%s, %s", w.kind, w.pattern)
	}
	last := "none sent"
	if i, _ := slices.BinarySearchFunc(s.notIdle[r.workload], r.at, time.Time.Compare); i > 0 {
		last = fmt.Sprintf("%v before", r.at.Sub(s.notIdle[r.workload][i-1]).Round(time.Second))
	}
	return fmt.Sprintf("%s: %s %s (%s) %v into the run: %s; its last reading busy or unread: %s", s.ns, r.workload, r.how, what,
		r.at.Sub(s.t0).Round(time.Second), why, last)
}

// idleToBack are the reclaimable workloads' times from their idle start to
// their GPUs back in the pool, and how many never came back.
func (s *idleSide) idleToBack() (d []time.Duration, missed int) {
	for _, w := range s.workloads {
		if !w.reclaimable() {
			continue
		}
		if at, ok := s.back[w.name]; ok {
			d = append(d, at.Sub(s.t0.Add(w.idleFrom())))
		} else {
			missed++
		}
	}
	return d, missed
}

// reclaimed is how many workloads of pattern p (all, if "") the API
// showed reclaimed.
func (s *idleSide) reclaimed(p idlePattern) int {
	seen := map[string]bool{}
	for _, r := range s.seen {
		if !r.owned && (p == "" || s.byName[r.workload].pattern == p) {
			seen[r.workload] = true
		}
	}
	return len(seen)
}

func sumValues(m map[idlePattern]float64) float64 {
	total := 0.0
	for _, v := range m {
		total += v
	}
	return total
}

// cpuPer1000Leases is the allocator's CPU ms a minute of the side's run
// per 1,000 leases it began with: the same workload's on both sides.
func (s *idleSide) cpuPer1000Leases() float64 {
	return float64(s.allocatorCPU.Microseconds()) / 1000 / s.end.Sub(s.t0).Minutes() / (float64(s.leases) / 1000)
}

// reportIdleSides reports the metrics and prints the sides' table (with
// fmt: testing keeps only 10 lines of a benchmark's log).
func reportIdleSides(b *testing.B, off, on *idleSide) {
	b.Helper()
	if off == nil || on == nil {
		return
	}
	hours := func(gpuSeconds float64) float64 { return gpuSeconds / 3600 }
	falses := append(slices.Clone(off.falseReclaims), on.falseReclaims...)
	warned := append(slices.Clone(off.falseWarned), on.falseWarned...)
	back, missed := on.idleToBack()
	p50, p99 := quantileOf(back, 0.5), quantileOf(back, 0.99)
	b.ReportMetric(float64(len(falses)), "false-reclaims")
	b.ReportMetric(float64(len(warned)), "false-idle-warnings")
	b.ReportMetric(hours(sumValues(off.idleHeld)), "idle-held-gpu-hours-off")
	b.ReportMetric(hours(sumValues(on.idleHeld)), "idle-held-gpu-hours-on")
	b.ReportMetric(p50.Seconds(), "p50-s-idle-to-back")
	b.ReportMetric(p99.Seconds(), "p99-s-idle-to-back")
	b.ReportMetric((idleWindow + idleGrace).Seconds(), "s-window+grace")
	b.ReportMetric(float64(missed), "reclaims-missed")
	b.ReportMetric(off.gpusFree, "gpus-free-end-off")
	b.ReportMetric(on.gpusFree, "gpus-free-end-on")
	b.ReportMetric(float64(quantileOf(on.resumes, 0.5).Microseconds())/1000, "resume-ms")
	b.ReportMetric(float64(quantileOf(on.resumes, 1).Microseconds())/1000, "max-resume-ms")
	b.ReportMetric(off.cpuPer1000Leases(), "allocator-cpu-ms-per-1000-leases-off")
	b.ReportMetric(on.cpuPer1000Leases(), "allocator-cpu-ms-per-1000-leases-on")

	var t strings.Builder
	fmt.Fprintf(&t, "\n%d workloads, %d pods, %d GPUs; {useBelow: %g, window: %v, grace: %v}, time compressed %d times; each side's timelines %v\n\n",
		len(off.workloads), off.leases, (idleServers+idleSilentServers)*idleGPUsPerServer, idleUseBelow, idleWindow, idleGrace, idleCompression, idleScenario)
	fmt.Fprintln(&t, "| | action: report (idle-off) | action: reclaim (idle-on) |")
	fmt.Fprintln(&t, "|---|--:|--:|")
	fmt.Fprintf(&t, "| GPU-hours held over the %v | %.2f | %.2f |\n", idleScenario, hours(sumValues(off.held)), hours(sumValues(on.held)))
	fmt.Fprintf(&t, "| of them idle-held (use under the bar, by the timelines) | %.2f (%.0f%%) | %.2f (%.0f%%) |\n",
		hours(sumValues(off.idleHeld)), 100*sumValues(off.idleHeld)/sumValues(off.held), hours(sumValues(on.idleHeld)), 100*sumValues(on.idleHeld)/sumValues(on.held))
	fmt.Fprintf(&t, "| GPUs free at the end | %.1f | %.1f |\n", off.gpusFree, on.gpusFree)
	fmt.Fprintf(&t, "| workloads reclaimed | %d | %d |\n", off.reclaimed(""), on.reclaimed(""))
	fmt.Fprintf(&t, "| false reclaims | %d | %d |\n", len(off.falseReclaims), len(on.falseReclaims))
	fmt.Fprintf(&t, "| idle warnings (false) | %d (%d) | %d (%d) |\n", len(off.warned), len(off.falseWarned), len(on.warned), len(on.falseWarned))
	fmt.Fprintf(&t, "| idle start to GPUs back, p50 / p99 / max (window + grace: %v) | | %v / %v / %v |\n", idleWindow+idleGrace,
		p50.Round(100*time.Millisecond), p99.Round(100*time.Millisecond), quantileOf(back, 1).Round(100*time.Millisecond))
	fmt.Fprintf(&t, "| reclaimable workloads not back by the end | | %d of %d |\n", missed, missed+len(back))
	fmt.Fprintf(&t, "| resumed, to its pods bound with their leases: p50 / max (%d resumed) | | %v / %v |\n", len(on.resumes),
		quantileOf(on.resumes, 0.5).Round(time.Millisecond), quantileOf(on.resumes, 1).Round(time.Millisecond))
	fmt.Fprintf(&t, "| allocator CPU over the %v | %.2f s | %.2f s |\n", idleScenario, off.allocatorCPU.Seconds(), on.allocatorCPU.Seconds())
	fmt.Fprintf(&t, "| allocator CPU ms a minute per 1,000 leases at the start | %.0f | %.0f |\n", off.cpuPer1000Leases(), on.cpuPer1000Leases())
	fmt.Fprintf(&t, "| lease controller (gpupool-scheduler) CPU over the %v | %.2f s | %.2f s |\n", idleScenario, off.controllerCPU.Seconds(), on.controllerCPU.Seconds())
	fmt.Fprintln(&t, "\n| timeline | workloads | reclaimed, report / reclaim | idle-held GPU-hours, report / reclaim |")
	fmt.Fprintln(&t, "|---|--:|--:|--:|")
	for _, p := range idlePatterns {
		n := 0
		for _, w := range off.workloads {
			if w.pattern == p {
				n++
			}
		}
		fmt.Fprintf(&t, "| %s | %d | %d / %d | %.2f / %.2f |\n", p, n, off.reclaimed(p), on.reclaimed(p), hours(off.idleHeld[p]), hours(on.idleHeld[p]))
	}
	fmt.Print(t.String())
	for _, f := range warned {
		fmt.Printf("false idle warning: %s\n", f)
	}
	for _, f := range falses {
		b.Errorf("false reclaim: %s", f)
	}
}

// deleteIdleWorkloads deletes namespace ns's workloads and pods.
func deleteIdleWorkloads(b testing.TB, ctx context.Context, c kubernetes.Interface, ns string) {
	b.Helper()
	all, opts := metav1.ListOptions{}, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}
	for _, del := range []func() error{
		func() error { return c.AutoscalingV2().HorizontalPodAutoscalers(ns).DeleteCollection(ctx, opts, all) },
		func() error { return c.AppsV1().Deployments(ns).DeleteCollection(ctx, opts, all) },
		func() error { return c.AppsV1().StatefulSets(ns).DeleteCollection(ctx, opts, all) },
		func() error { return c.BatchV1().Jobs(ns).DeleteCollection(ctx, opts, all) },
		func() error { return c.CoreV1().Pods(ns).DeleteCollection(ctx, opts, all) },
	} {
		if err := del(); err != nil {
			b.Fatal(err)
		}
	}
}
