package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupool/gpupool/adapter/externalscaler"
	"github.com/gpupool/gpupool/allocator/api"
)

// kedaRun is what one trigger's path measured.
type kedaRun struct {
	steps, activations, idleToZero []time.Duration
	// granted: from the demand to the first replica's lease.
	granted []time.Duration
}

// BenchmarkKEDA runs the same load through the real KEDA three ways, each
// on a control plane of its own, with the same KEDA and HPA settings
// (KEDA's default polling, 30 s; the HPA's default sync, 15 s; cooldown
// 5 s): gpupool's external scaler polled (external) and pushing
// (external-push), and KEDA's prometheus trigger on the same metric
// through a real Prometheus scraping every 15 s, what docs/adapter.md
// offered a cluster with KEDA before the scaler. Each path: twice, from
// zero, a notebook of tf-training's team uses a GPU (demand), measured to
// the replica KEDA asks and to its lease granted; four load steps (0.25 ->
// 1.5 -> 0.3 -> 1.5 -> 0.3 GPUs, at four phases of the HPA's sync),
// measured to the first replica change; the
// work stops, measured to zero replicas. On the external-push rig it also
// sends GetMetrics 200 times a second for 10 s, as KEDA's client, and
// reads the adapter's CPU and RSS over it.
//
// The two goals are reported as ratios of external-push's p50 to the
// Prometheus path's: step-to-replica-vs-prometheus and
// activation-vs-prometheus.
func BenchmarkKEDA(b *testing.B) {
	runs := map[string]*kedaRun{}
	for _, path := range []string{"external-push", "external", "prometheus"} {
		b.Run("trigger="+path, func(b *testing.B) {
			o := rigOptions{backend: "direct", keda: path}
			if path == "prometheus" {
				o.backend, o.scrape = "prometheus", 15*time.Second
			}
			r := startHPARig(b, o)
			run := &kedaRun{}
			for range b.N {
				r.waitDeployment(b, 0, 3*time.Minute)
				r.measureActivation(b, run)
				for i, load := range []float64{1.5, 0.3, 1.5, 0.3} {
					// At four phases of the HPA's sync period, as
					// BenchmarkHPAReaction: when the load moves within it
					// is chance.
					time.Sleep(time.Duration(i) * 3750 * time.Millisecond)
					from := r.replicas(b)
					r.setLoad(b, load)
					start := time.Now()
					for r.replicas(b) == from {
						if time.Since(start) > 3*time.Minute {
							b.Fatalf("tf-training still asks %d replicas 3 minutes after the load went to %g", from, load)
						}
						time.Sleep(100 * time.Millisecond)
					}
					run.steps = append(run.steps, time.Since(start))
					b.Logf("load -> %g GPUs: replicas %d -> %d after %v", load, from, r.replicas(b), run.steps[len(run.steps)-1].Round(100*time.Millisecond))
					r.waitDeployment(b, int32(expectedReplicas(load)), 3*time.Minute)
				}
				r.setLoad(b, 0)
				start := time.Now()
				r.waitDeployment(b, 0, 5*time.Minute)
				run.idleToZero = append(run.idleToZero, time.Since(start))
				b.Logf("idle -> 0 replicas after %v", run.idleToZero[len(run.idleToZero)-1].Round(time.Second))
				r.measureActivation(b, run)
			}
			b.StopTimer()
			report(b, "step", run.steps)
			report(b, "activation", run.activations)
			report(b, "granted", run.granted)
			report(b, "idle-to-zero", run.idleToZero)
			if path == "external-push" {
				r.loadGetMetrics(b, 200, 10*time.Second)
			}
			runs[path] = run
		})
	}
	push, prom := runs["external-push"], runs["prometheus"]
	if push == nil || prom == nil {
		return
	}
	// A sub-benchmark of its own: Go prints no result line for a
	// benchmark that has sub-benchmarks.
	b.Run("vs=prometheus", func(b *testing.B) {
		b.ReportMetric(quantileOf(push.steps, 0.5).Seconds()/quantileOf(prom.steps, 0.5).Seconds(), "step-to-replica-vs-prometheus")
		b.ReportMetric(quantileOf(push.activations, 0.5).Seconds()/quantileOf(prom.activations, 0.5).Seconds(), "activation-vs-prometheus")
	})
}

// report reports the p50 and p99 of what, in seconds.
func report(b *testing.B, what string, d []time.Duration) {
	b.ReportMetric(quantileOf(d, 0.5).Seconds(), what+"-p50-s")
	b.ReportMetric(quantileOf(d, 0.99).Seconds(), what+"-p99-s")
}

// replicas is how many replicas tf-training's Deployment asks now.
func (r *hpaRig) replicas(b *testing.B) int32 {
	b.Helper()
	dep, err := r.cp.Client.AppsV1().Deployments(hpaNamespace).Get(context.Background(), hpaApp, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return *dep.Spec.Replicas
}

// measureActivation: tf-training at zero, a notebook labelled
// app=tf-training takes half a GPU and uses it; measured until KEDA asks
// one replica, and until that replica's lease is granted. The notebook
// then lets go, its work left to the replica.
func (r *hpaRig) measureActivation(b *testing.B, run *kedaRun) {
	b.Helper()
	ctx := context.Background()
	r.setLoad(b, 0.25)
	start := time.Now()
	notebook, err := r.client.Acquire(ctx, api.AcquireRequest{Namespace: hpaNamespace, GPUAmount: 1, GPUPercent: replicaPercent, TTL: "1h",
		Owner: api.Owner{Pod: "notebook", UID: "notebook-" + strconv.FormatInt(start.UnixNano(), 10), Labels: map[string]string{"app": hpaApp}}})
	if err != nil {
		b.Fatal(err)
	}
	asked := r.waitDeployment(b, 1, 3*time.Minute)
	waitForUpTo(b, time.Minute, func() bool { return len(r.replicaLeases(b)) == 1 })
	run.activations = append(run.activations, asked)
	run.granted = append(run.granted, time.Since(start))
	b.Logf("demand -> 1 replica asked after %v, its lease granted after %v", asked.Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond))
	if err := r.client.Release(ctx, notebook.ID); err != nil {
		b.Fatal(err)
	}
}

// loadGetMetrics sends GetMetrics rate times a second for d, open loop, as
// KEDA's client (its certificate, one connection), and reports the
// latency's p50 and p99 and the adapter's CPU (cores) and RSS over it.
func (r *hpaRig) loadGetMetrics(b *testing.B, rate int, d time.Duration) {
	b.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(r.cp.CA)
	conn, err := grpc.NewClient(r.scaler, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: roots, Certificates: []tls.Certificate{r.kedaCert}, MinVersion: tls.VersionTLS12})))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	scaler := externalscaler.NewExternalScalerClient(conn)
	ref := &externalscaler.ScaledObjectRef{Name: hpaApp, Namespace: hpaNamespace, ScalerMetadata: map[string]string{
		"scalerAddress": r.scaler, "metric": "bitfusion_gpu_utilization", "selector": "app=" + hpaApp, "target": kedaTarget()}}
	req := &externalscaler.GetMetricsRequest{ScaledObjectRef: ref, MetricName: "bitfusion_gpu_utilization"}
	// In the steady state: a replica's lease just granted has no measured
	// use for a round, and while it is the workload's only lease the
	// answer is, rightly, NotFound (no data).
	waitForUpTo(b, time.Minute, func() bool { _, err := scaler.GetMetrics(context.Background(), req); return err == nil })
	cpu0, at0 := processCPU(b, r.adapter.Process.Pid), time.Now()
	var (
		mu        sync.Mutex
		latencies []time.Duration
		failed    = map[codes.Code]int{}
		first     = map[codes.Code]string{} // the first error of each code
		wg        sync.WaitGroup
	)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	for range rate * int(d/time.Second) {
		<-tick.C
		wg.Go(func() {
			start := time.Now()
			_, err := scaler.GetMetrics(context.Background(), req)
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				code := status.Code(err)
				if failed[code]++; failed[code] == 1 {
					first[code] = fmt.Sprintf("%v at %v", err, start.Sub(at0).Round(time.Millisecond))
				}
				return
			}
			latencies = append(latencies, took)
		})
	}
	tick.Stop()
	wg.Wait()
	cores := (processCPU(b, r.adapter.Process.Pid) - cpu0).Seconds() / time.Since(at0).Seconds()
	for code, n := range failed {
		b.Errorf("%d of %d GetMetrics calls failed %v, the first: %s", n, rate*int(d/time.Second), code, first[code])
	}
	b.ReportMetric(float64(quantileOf(latencies, 0.5).Microseconds())/1000, "getmetrics-p50-ms")
	b.ReportMetric(float64(quantileOf(latencies, 0.99).Microseconds())/1000, "getmetrics-p99-ms")
	b.ReportMetric(cores, "adapter-cores")
	b.ReportMetric(float64(processRSS(b, r.adapter.Process.Pid))/(1<<20), "adapter-rss-MiB")
}

// processCPU is the CPU time pid has used (user and system), from
// /proc/<pid>/stat, in clock ticks of 10 ms (Linux's USER_HZ).
func processCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	stat := string(readFile(b, "/proc/"+strconv.Itoa(pid)+"/stat"))
	// The fields after the command, which may hold spaces, in parentheses.
	fields := strings.Fields(stat[strings.LastIndexByte(stat, ')')+2:])
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// processRSS is pid's resident set, in bytes, from /proc/<pid>/status.
func processRSS(b *testing.B, pid int) int64 {
	b.Helper()
	for line := range strings.Lines(string(readFile(b, "/proc/"+strconv.Itoa(pid)+"/status"))) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return kb << 10
		}
	}
	b.Fatal("no VmRSS in /proc/<pid>/status")
	return 0
}
