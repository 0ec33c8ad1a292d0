package adapter

import (
	"context"
	"encoding/json"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/gpupool/gpupool/allocator"
	allocapi "github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/allocator/service"
	"github.com/gpupool/gpupool/allocator/store"
	"github.com/gpupool/gpupool/collector"
	"github.com/gpupool/gpupool/fakegpu"
	"github.com/gpupool/gpupool/gpuserver"
	"github.com/gpupool/gpupool/gpuserver/api"
)

// testPool is a real allocator and one real GPU-server daemon on simulated
// GPUs, in process: each lease's work keeps its share as busy as its
// owner's "load" label says, in tenths.
type testPool struct {
	client    *client.Client
	allocator *httptest.Server
	daemon    *gpuserver.Daemon
	daemonSrv *httptest.Server
	// handler is the daemon's, swapped when it restarts.
	handler    atomic.Pointer[http.Handler]
	stopDaemon context.CancelFunc
	sampler    *collector.Sampler
	probeAddr  string
}

func newTestPool(t *testing.T, gpus int) *testPool {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "allocator"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	reg := prometheus.NewRegistry()
	svc, err := service.New(ctx, service.Config{Store: st, Policy: "best-fit", DefaultTTL: time.Hour, MaxTTL: time.Hour,
		HeartbeatTimeout: time.Minute, Quotas: map[string]allocator.Share{"ml": allocator.ShareGPUs(8)}, Registry: reg, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	p := &testPool{allocator: httptest.NewServer(service.Handler(svc, nil, reg, quietLog()))}
	t.Cleanup(p.allocator.Close)
	if p.client, err = client.New([]string{p.allocator.URL}, ""); err != nil {
		t.Fatal(err)
	}
	p.client.Retries = 1
	p.daemonSrv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*p.handler.Load()).ServeHTTP(w, r) }))
	t.Cleanup(p.daemonSrv.Close)
	p.startDaemon(t, gpus, 1)
	waitUntil(t, func() bool { s, err := p.client.Pool(ctx); return err == nil && len(s.Servers) == 1 })
	return p
}

// startDaemon starts a new daemon at the pool's daemon URL (stopping the
// one before, as a restart does) that reads processes every processEvery
// rounds, and has it sample a round before it fetches its leases, as a
// daemon may on start. Rounds are then the test's to take.
func (p *testPool) startDaemon(t *testing.T, gpus, processEvery int) {
	t.Helper()
	if p.stopDaemon != nil {
		p.stopDaemon()
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p.stopDaemon = cancel
	sim := &fakegpu.Source{Server: "gpu-0", Seed: 1, GPUs: make([]fakegpu.GPU, gpus),
		Demand: func(leases []allocator.Lease, _ time.Time) map[string]float64 {
			out := map[string]float64{}
			for _, l := range leases {
				if d := l.Owner.Labels["load"]; len(d) == 1 {
					out[l.ID] = float64(d[0]-'0') / 10
				}
			}
			return out
		}}
	for i := range sim.GPUs {
		sim.GPUs[i] = fakegpu.GPU{Model: "H100", MemoryBytes: 80 << 30}
	}
	inv := sim.Inventory(0, 0, map[string]string{api.LabelDaemonURL: p.daemonSrv.URL})
	host, err := gpuserver.NewHost(gpuserver.HostConfig{
		Config: gpuserver.Config{Inventory: inv, Client: p.client, Heartbeat: 50 * time.Millisecond,
			LabelAllowlist: []string{"app"}, Log: quietLog()},
		Source: sim, Interval: time.Hour, ProcessEvery: processEvery,
	})
	if err != nil {
		t.Fatal(err)
	}
	d := host.Daemon
	p.daemon, p.sampler = d, host.Sampler
	p.handler.Store(&host.Handler)
	p.sampler.Round(ctx) // the daemon vouches for GPUs it has read
	go d.Run(ctx)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.probeAddr = ln.Addr().String()
	go d.ServeProbes(ctx, ln, 10*time.Millisecond)
}

// follows waits until the daemon follows the lease.
func (p *testPool) follows(t *testing.T, l allocator.Lease) {
	t.Helper()
	waitUntil(t, func() bool {
		for _, held := range p.daemon.Leases() {
			if held.ID == l.ID {
				return true
			}
		}
		return false
	})
}

// acquire takes a lease for a pod and waits until the daemon follows it,
// then samples a round.
func (p *testPool) acquire(t *testing.T, pod, app string, load, percent int) allocator.Lease {
	t.Helper()
	granted, err := p.client.Acquire(context.Background(), allocapi.AcquireRequest{Namespace: "ml", GPUAmount: 1, GPUPercent: percent,
		Owner: allocapi.Owner{Pod: pod, UID: "uid-" + pod, Labels: map[string]string{"app": app, "load": string(rune('0' + load))}}})
	if err != nil {
		t.Fatal(err)
	}
	l := granted.Core()
	p.follows(t, l)
	p.sampler.Round(context.Background())
	return l
}

func waitUntil(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

func query(t *testing.T, b Backend, metric, selector string) []Value {
	t.Helper()
	sel, err := labels.Parse(selector)
	if err != nil {
		t.Fatal(err)
	}
	v, err := b.Query(context.Background(), Query{Metric: metric, Namespace: "ml", Selector: sel})
	if err != nil {
		t.Fatalf("%s{%s}: %v", metric, selector, err)
	}
	return v
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

// TestDirectBackend: the direct backend joins the allocator's leases (by
// their owners' labels) with the daemon's latest round.
func TestDirectBackend(t *testing.T) {
	p := newTestPool(t, 2)
	p.acquire(t, "tf-0", "tf-training", 6, 50)
	p.acquire(t, "tf-1", "tf-training", 8, 50)
	p.acquire(t, "web-0", "web", 2, 25)
	d := NewDirect(p.client, 0, quietLog())

	// (0.5*0.6 + 0.5*0.8) / (0.5 + 0.5): busy share over held share.
	if v := query(t, d, GPUUtilization, "app=tf-training"); len(v) != 1 || !near(v[0].Value, 0.7) {
		t.Errorf("utilization of tf-training = %+v, want 0.7", v)
	}
	if v := query(t, d, GPUUtilization, "app=web"); len(v) != 1 || !near(v[0].Value, 0.2) {
		t.Errorf("utilization of web = %+v, want 0.2", v)
	}
	if v := query(t, d, GPUUtilization, "app=nobody"); len(v) != 0 {
		t.Errorf("utilization of no leases = %+v, want no data", v)
	}
	// The simulated leases use 50-90% of their grant, one in twenty 120%.
	if v := query(t, d, MemoryPressure, "app=tf-training"); len(v) != 1 || v[0].Value < 0.5 || v[0].Value > 1.2 {
		t.Errorf("memory pressure = %+v, want 0.5..1.2", v)
	}
	if v := query(t, d, PoolUnallocatedGPUs, ""); len(v) != 1 || !near(v[0].Value, 2-1.25) || v[0].Labels["model"] != "H100" {
		t.Errorf("unallocated = %+v, want 0.75 of H100", v)
	}
	if v := query(t, d, PoolUnallocatedGPUs, "model=A100"); len(v) != 0 {
		t.Errorf("unallocated A100 = %+v, want no data", v)
	}
	if v := query(t, d, PendingRequests, ""); len(v) != 1 || v[0].Value != 0 {
		t.Errorf("pending = %+v, want 0", v)
	}
	if v := query(t, d, RDMALatency, "app=tf-training"); len(v) != 0 {
		t.Errorf("latency before any probe = %+v, want no data", v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_ = api.DialProbe(ctx, p.probeAddr, "client-0", 10*time.Millisecond, func(time.Duration) {})
	cancel()
	p.sampler.Round(context.Background()) // the daemon reports as of its last round
	v := query(t, d, RDMALatency, "app=tf-training")
	if len(v) != 1 || v[0].Labels["transport"] != "" && v[0].Labels["transport"] != api.TransportTCP || v[0].Value <= 0 || v[0].Value > 0.08 {
		t.Errorf("latency after probing = %+v, want one tcp p99 in (0, 80ms]", v)
	}

	// The daemon stops answering: its leases have no reading, so no data.
	p.daemonSrv.Close()
	if v := query(t, d, GPUUtilization, "app=tf-training"); len(v) != 0 {
		t.Errorf("utilization with the daemon gone = %+v, want no data", v)
	}
}

// TestDirectBackendLeavesNewLeasesOut: a lease the daemon has not reported
// yet, or reports before it has measured it, is left out of the answer
// while it is new, not counted as idle, and does not make it no data.
func TestDirectBackendLeavesNewLeasesOut(t *testing.T) {
	p := newTestPool(t, 1)
	p.acquire(t, "tf-0", "tf-training", 6, 50)
	d := NewDirect(p.client, 0, quietLog())
	// Leases granted straight at the allocator, unknown to the daemon's
	// last round: the view is as if the daemon had not caught up.
	unreported, err := p.client.Acquire(context.Background(), allocapi.AcquireRequest{Namespace: "ml", GPUAmount: 1, GPUPercent: 50,
		Owner: allocapi.Owner{Pod: "tf-1", UID: "uid-tf-1", Labels: map[string]string{"app": "tf-training", "load": "2"}}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := d.current(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sel := labels.SelectorFromSet(labels.Set{"app": "tf-training"})
	q := Query{Metric: GPUUtilization, Namespace: "ml", Selector: sel}
	for name, reported := range map[string]func(*api.LeaseUsage) bool{
		"unreported": func(*api.LeaseUsage) bool { return false },
		// Followed by the daemon a heartbeat before a round measures it.
		"unmeasured": func(r *api.LeaseUsage) bool { r.SMUtilization = nil; return true },
	} {
		view := *v
		view.readings = maps.Clone(v.readings)
		for _, g := range unreported.GPUs { // as reported before the second lease
			key := api.LeaseGPU{Lease: unreported.ID, GPU: g.Index}
			r := api.LeaseUsage{Lease: unreported.ID, Namespace: "ml", GPU: g.Index, Milli: int32(allocator.WholeGPU / 2)}
			if reported(&r) {
				view.readings[key] = &r
			} else {
				delete(view.readings, key)
			}
		}
		if got := view.leaseRatio(q, time.Now()); len(got) != 1 || !near(got[0].Value, 0.6) {
			t.Errorf("with a new %s lease = %+v, want 0.6 from the measured one", name, got)
		}
		if got := view.leaseRatio(q, time.Now().Add(time.Minute)); len(got) != 0 {
			t.Errorf("with a lease %s for a minute = %+v, want no data", name, got)
		}
	}
}

// TestDirectBackendLeaseReleasedWhileReading: a lease released while the
// backend reads the pool, after the allocator's read and before the
// daemon's, which has dropped it, leaves the workload's answer its other
// leases', not no data (for a refresh, 100 of BenchmarkKEDA's 200
// GetMetrics a second failed so).
func TestDirectBackendLeaseReleasedWhileReading(t *testing.T) {
	p := newTestPool(t, 1)
	p.acquire(t, "tf-0", "tf-training", 6, 50)
	released := p.acquire(t, "tf-1", "tf-training", 8, 50)
	daemon := *p.handler.Load()
	var once atomic.Bool
	var racing http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/usage" && once.CompareAndSwap(false, true) {
			if err := p.client.Release(r.Context(), released.ID); err != nil {
				t.Error(err)
			}
			waitUntil(t, func() bool { return len(p.daemon.Leases()) == 1 })
			p.sampler.Round(r.Context())
		}
		daemon.ServeHTTP(w, r)
	})
	p.handler.Store(&racing)
	d := NewDirect(p.client, 0, quietLog())
	d.clock = func() time.Time { return time.Now().Add(time.Minute) } // past the new leases' grace
	if v := query(t, d, GPUUtilization, "app=tf-training"); len(v) != 1 || !near(v[0].Value, 0.6) {
		t.Errorf("utilization with a lease released while reading = %+v, want 0.6 from the other", v)
	}
	if !once.Load() {
		t.Error("the daemon was not read")
	}
}

// TestDirectBackendAfterDaemonRestart: a restarted daemon has measured
// nothing of the leases it holds until a round reads their processes after
// it has fetched them; until then the answer is no data, never 0, and then
// the real value.
func TestDirectBackendAfterDaemonRestart(t *testing.T) {
	p := newTestPool(t, 1)
	l := p.acquire(t, "tf-0", "tf-training", 6, 50)
	d := NewDirect(p.client, 0, quietLog())
	if v := query(t, d, GPUUtilization, "app=tf-training"); len(v) != 1 || !near(v[0].Value, 0.6) {
		t.Fatalf("utilization before the restart = %+v, want 0.6", v)
	}

	p.startDaemon(t, 1, 5) // processes every 5 rounds, as gpupool-server reads them
	for _, metric := range []string{GPUUtilization, MemoryPressure} {
		if v := query(t, d, metric, "app=tf-training"); len(v) != 0 {
			t.Errorf("%s after the restart, before the daemon fetched its leases = %+v, want no data", metric, v)
		}
	}
	if err := askAsTheHPA(d); !apierrors.IsNotFound(err) {
		t.Errorf("the HPA's answer after the restart: %v, want 404 NotFound", err)
	}
	p.follows(t, l)
	p.sampler.Round(context.Background()) // not a process round by the schedule
	if v := query(t, d, GPUUtilization, "app=tf-training"); len(v) != 1 || !near(v[0].Value, 0.6) {
		t.Errorf("utilization once the restarted daemon follows the lease = %+v, want 0.6, never 0", v)
	}
}

// TestDirectBackendUnsampledDaemonHasNoReadings: what a daemon reports
// before its first sampling round (dated zero) is no reading: the answer is
// no data, whatever the report holds.
func TestDirectBackendUnsampledDaemonHasNoReadings(t *testing.T) {
	p := newTestPool(t, 1)
	l := p.acquire(t, "tf-0", "tf-training", 6, 50)
	zero := 0.0
	var unsampled http.Handler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(api.Usage{Server: "gpu-0", Leases: []api.LeaseUsage{
			{Lease: l.ID, Namespace: "ml", GPU: l.GPUs[0].Index, Milli: int32(l.GPUs[0].Share), SMUtilization: &zero, MemoryGrantedBytes: l.GPUs[0].MemoryBytes}}})
	})
	p.handler.Store(&unsampled)
	d := NewDirect(p.client, 0, quietLog())
	for _, metric := range []string{GPUUtilization, MemoryPressure} {
		if v := query(t, d, metric, "app=tf-training"); len(v) != 0 {
			t.Errorf("%s from a daemon that has not sampled = %+v, want no data", metric, v)
		}
	}
}

// TestDirectBackendDatesByTheOldestReading: a value resting on a report
// dated zero (a daemon that has not sampled yet) stays dated zero, so the
// freshness guard refuses it, whatever the other daemons' dates.
func TestDirectBackendDatesByTheOldestReading(t *testing.T) {
	now := time.Now()
	owner := allocator.Owner{Labels: map[string]string{"app": "a"}}
	window := []api.LatencyWindow{{Transport: "tcp", Buckets: []api.Bucket{{UpperBound: 1e-4, Count: 10}}, Count: 10}}
	v := &poolView{at: now, leases: []allocator.Lease{ // the unsampled daemon's first: its zero date is not "none yet"
		{ID: "lease-2", Namespace: "ml", Server: "unsampled", Owner: owner, GPUs: []allocator.LeaseGPU{{Index: 0, Share: 500}}},
		{ID: "lease-1", Namespace: "ml", Server: "fresh", Owner: owner, GPUs: []allocator.LeaseGPU{{Index: 0, Share: 500}}},
	}, usage: map[string]*api.Usage{
		"unsampled": {Server: "unsampled", Latency: window},
		"fresh":     {Server: "fresh", SampledAt: now, Latency: window},
	}}
	sel := labels.SelectorFromSet(labels.Set{"app": "a"})
	if got := v.latency(Query{Metric: RDMALatency, Namespace: "ml", Selector: sel}); len(got) != 1 || !got[0].Time.IsZero() {
		t.Errorf("latency resting on an unsampled daemon = %+v, want it dated zero (stale)", got)
	}
}
