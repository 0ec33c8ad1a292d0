package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/simulate"
)

// TestBurstsAndFaults: what users of GPU schedulers report (bind
// timeouts, many minutes to place pods submitted at once, GPUs held by
// pods deleted long ago) on the OpenB cluster's 1,213 kwok nodes, through
// gpupool as deployed with controller.replicas=3, tokens on: three
// allocators on etcd, one leading. After each step the allocator's leases
// are exactly the bound pods' leases: none held by an unbound or deleted
// pod, none doubled, each on its pod's node under the ID the pod names.
func TestBurstsAndFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("places 1,500 pods on 1,213 nodes")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	tr, err := simulate.LoadTrace(simulate.DefaultNodes, simulate.DefaultPods)
	if err != nil {
		t.Fatal(err)
	}
	arrivals, _ := simulate.GPUArrivals(tr, scaleSeed)
	proxy := newSlowProxy(t)
	// Three allocators on etcd, as controller.replicas=3 deploys them.
	pool := startKubePool(t, ctx, kubePoolOptions{Namespaces: []string{scaleNamespace}, AllocatorArgs: []string{"--policy", scalePolicy},
		AllocatorReplicas: 3, SchedulerArgs: []string{"--unbound-lease-timeout", scaleUnboundTimeout.String()}})
	addTraceServers(t, ctx, pool, tr.Servers)
	proxy.to(pool.Allocator.URL)
	next := 0
	// burst creates n pods of the trace at once and waits until each is
	// bound or unschedulable with the pool's reason.
	burst := func(t *testing.T, n int, during func()) []string {
		t.Helper()
		names := make([]string, n)
		start := time.Now()
		var g errgroup.Group
		g.SetLimit(64)
		for i := range n {
			names[i] = podName(next + i)
			p := tracePod(names[i], &arrivals[next+i])
			g.Go(func() error {
				_, err := pool.CP.Client.CoreV1().Pods(scaleNamespace).Create(ctx, p, metav1.CreateOptions{})
				return err
			})
		}
		next += n
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		t.Logf("%d pods created at once in %v", n, time.Since(start).Round(time.Millisecond))
		if during != nil {
			during()
		}
		settled := waitSettled(t, ctx, pool, names, 5*time.Minute)
		t.Logf("%d pods settled (bound, or unschedulable with the pool's reason) %v after the first create", n, settled.Sub(start).Round(time.Millisecond))
		auditLeases(t, ctx, pool)
		return names
	}

	t.Run("1000 pods at once", func(t *testing.T) {
		burst(t, 1000, nil)
	})
	t.Run("500 pods deleted at once", func(t *testing.T) {
		pods, err := pool.CP.Client.CoreV1().Pods(scaleNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		var g errgroup.Group
		g.SetLimit(64)
		for _, p := range pods.Items[:500] {
			g.Go(func() error {
				return pool.CP.Client.CoreV1().Pods(scaleNamespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		gone := map[string]bool{}
		for _, p := range pods.Items[:500] {
			gone[string(p.UID)] = true
		}
		waitForUpTo(t, 2*time.Minute, func() bool {
			leases, err := pool.Admin.Leases(ctx, client.LeaseFilter{Namespace: scaleNamespace})
			if err != nil {
				return false
			}
			for _, l := range leases {
				if gone[l.Owner.UID] {
					return false
				}
			}
			return true
		})
		t.Logf("500 pods deleted at once: every lease of theirs ended %v after the first delete", time.Since(start).Round(time.Millisecond))
		auditLeases(t, ctx, pool)
	})
	t.Run("the leading lease controller killed while 50 pods are deleted", func(t *testing.T) {
		leaderKilledWhilePodsDeleted(t, ctx, pool, 50)
	})
	t.Run("gpupool-kube-scheduler and gpupool-scheduler killed mid-burst", func(t *testing.T) {
		burst(t, 300, func() {
			time.Sleep(time.Second)
			pool.killKubeScheduler()
			pool.killScheduler()
			time.Sleep(3 * time.Second)
			pool.startScheduler(t)
			pool.startKubeScheduler(t, ctx)
		})
	})
	t.Run("allocator slower than the scheduler's timeout", func(t *testing.T) {
		pool.AllocatorForScheduler = proxy.URL
		pool.killKubeScheduler()
		pool.killScheduler()
		pool.startScheduler(t)
		pool.startKubeScheduler(t, ctx)
		proxy.delay.Store(int64(7 * time.Second))
		burst(t, 100, func() {
			time.Sleep(20 * time.Second)
			released := strings.Count(pool.schedulingLog(t), "released the lease of a pod not bound in time")
			t.Logf("while the allocator answered after 7 s, %d leases of pods whose cycle failed were released", released)
			proxy.delay.Store(0)
		})
	})
}

// leaderKilledWhilePodsDeleted runs two more replicas of gpupool-scheduler
// beside the pool's, three as controller.replicas=3 deploys (with the
// pool's three allocators), deletes n
// bound pods and kills the leading lease controller with SIGKILL at once.
// Every lease of theirs ends, the allocator releases exactly n leases (no
// other pod's, none counted twice), and the time until a standby leads is
// reported. The pool's replica, killed or not, runs again after.
func leaderKilledWhilePodsDeleted(t *testing.T, ctx context.Context, pool *kubePool, n int) {
	// The pool's replica led alone before these two started.
	var standbyMetrics []string
	for range 2 {
		metricsAddr, extender := "127.0.0.1:"+freePort(t), ""
		if !pool.plugin {
			extender = "127.0.0.1:" + freePort(t)
		}
		startBinary(t, pool.Logs, "gpupool-scheduler", regexp.MustCompile(`standing by`),
			pool.schedulerFlags(t, extender, metricsAddr)...)
		standbyMetrics = append(standbyMetrics, "http://"+metricsAddr)
	}
	pods, err := pool.CP.Client.CoreV1().Pods(scaleNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var doomed []corev1.Pod
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" && len(doomed) < n {
			doomed = append(doomed, p)
		}
	}
	if len(doomed) < n {
		t.Fatalf("%d bound pods, want %d to delete", len(doomed), n)
	}
	releasedBefore := counter(t, metrics(t, pool.Allocator.URL), "bitfusion_lease_releases_total")

	var g errgroup.Group
	for _, p := range doomed {
		g.Go(func() error {
			return pool.CP.Client.CoreV1().Pods(scaleNamespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		})
	}
	pool.killScheduler()
	killed := time.Now()
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	waitForUpTo(t, time.Minute, func() bool {
		return slices.ContainsFunc(standbyMetrics, func(url string) bool {
			return strings.Contains(metrics(t, url), "\nbitfusion_lease_controller_leader 1\n")
		})
	})
	t.Logf("a standby led %v after the leading lease controller was killed", time.Since(killed).Round(time.Millisecond))

	gone := map[string]bool{}
	for _, p := range doomed {
		gone[string(p.UID)] = true
	}
	waitForUpTo(t, time.Minute, func() bool {
		leases, err := pool.Admin.Leases(ctx, client.LeaseFilter{Namespace: scaleNamespace})
		if err != nil {
			return false
		}
		return !slices.ContainsFunc(leases, func(l api.Lease) bool { return gone[l.Owner.UID] })
	})
	t.Logf("the %d deleted pods' leases all ended %v after the leader was killed", n, time.Since(killed).Round(time.Millisecond))
	// A release is in the pool's leases at once, and counted once it is
	// durable: the count may trail the list by a commit.
	var released float64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if released = counter(t, metrics(t, pool.Allocator.URL), "bitfusion_lease_releases_total") - releasedBefore; released >= float64(n) {
			break
		}
	}
	if released != float64(n) {
		t.Errorf("the allocator released %v leases, want the %d deleted pods'", released, n)
	}
	pool.startScheduler(t)
	auditLeases(t, ctx, pool)
}

// counter is the value of the unlabelled series name in an exposition.
func counter(t *testing.T, exposition, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(exposition, "\n") {
		if value, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return v
		}
	}
	t.Fatalf("no series %s", name)
	return 0
}

// waitSettled waits until each named pod is bound or unschedulable with
// the pool's reason, and returns when that was first true.
func waitSettled(t *testing.T, ctx context.Context, pool *kubePool, names []string, limit time.Duration) time.Time {
	t.Helper()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var stuck []string
	for deadline := time.Now().Add(limit); ; time.Sleep(200 * time.Millisecond) {
		pods, err := pool.CP.Client.CoreV1().Pods(scaleNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		stuck = stuck[:0]
		for i := range pods.Items {
			p := &pods.Items[i]
			if want[p.Name] && p.Spec.NodeName == "" && !refusedByPool(p) {
				stuck = append(stuck, p.Name)
			}
		}
		if len(stuck) == 0 {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pods neither bound nor refused by the pool after %v, such as %v", len(stuck), limit, stuck[:min(5, len(stuck))])
		}
	}
}

// refusedByPool reports whether kube-scheduler last found pod
// unschedulable for the pool's reason.
func refusedByPool(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable && strings.Contains(c.Message, "gpupool allocator: ")
		}
	}
	return false
}

// auditLeases fails unless the allocator's leases are exactly the bound
// pods' leases, waiting for those of failed cycles to end.
func auditLeases(t *testing.T, ctx context.Context, pool *kubePool) {
	t.Helper()
	var a leaseAudit
	for deadline := time.Now().Add(3 * scaleUnboundTimeout); ; time.Sleep(time.Second) {
		if a = recordOf(t, ctx, pool).audit(); a.clean() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the allocator's leases are not the bound pods': %v", a)
		}
	}
}

// slowProxy forwards to the allocator and holds each answer for delay:
// an allocator slower than kube-scheduler waits for its extender.
type slowProxy struct {
	*httptest.Server
	delay  atomic.Int64 // nanoseconds
	target atomic.Pointer[httputil.ReverseProxy]
}

func newSlowProxy(t *testing.T) *slowProxy {
	p := &slowProxy{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		p.target.Load().ServeHTTP(rec, r.WithContext(context.WithoutCancel(r.Context())))
		time.Sleep(time.Duration(p.delay.Load()))
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(p.Close)
	return p
}

func (p *slowProxy) to(target string) {
	u, err := url.Parse(target)
	if err != nil {
		panic(fmt.Sprintf("allocator URL %q: %v", target, err))
	}
	p.target.Store(httputil.NewSingleHostReverseProxy(u))
}
