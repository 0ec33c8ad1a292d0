package gpuserver

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/collector"
	"github.com/gpupool/gpupool/fakegpu"
	"github.com/gpupool/gpupool/inventory"
)

// leasesServer is an allocator that answers GET /v1/leases with leases.
func leasesServer(t *testing.T, leases ...allocator.Lease) *client.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		list := api.LeaseList{}
		for _, l := range leases {
			list.Leases = append(list.Leases, api.NewLease(l))
		}
		_ = json.NewEncoder(w).Encode(list)
	}))
	t.Cleanup(srv.Close)
	c, err := client.New([]string{srv.URL}, "")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// seriesValues is the daemon's exposition as name -> values.
func seriesValues(t *testing.T, reg prometheus.Gatherer) map[string][]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			out[f.GetName()] = append(out[f.GetName()], gaugeValue(m))
		}
	}
	return out
}

func gaugeValue(m *dto.Metric) float64 {
	if m.GetGauge() != nil {
		return m.GetGauge().GetValue()
	}
	return math.NaN()
}

// measuredSeries are the series that exist only once something was measured.
var measuredSeries = []string{"bitfusion_gpu_utilization", "bitfusion_memory_pressure", "bitfusion_gpu_memory_used_bytes",
	"bitfusion_lease_gpu_utilization", "bitfusion_lease_memory_used_bytes", "bitfusion_lease_memory_overuse_bytes",
	"bitfusion_lease_processes"}

// TestNoValueBeforeTheFirstRealSample walks a daemon on simulated GPUs
// through its start, as after a restart: before its first round, after a
// round taken before it fetched its leases, and once it has. Until a round
// has measured them, the GPU and lease series are absent and the usage
// report has no value for them; the first round that has gives the real
// values, not a 0 carried from before the leases were known.
func TestNoValueBeforeTheFirstRealSample(t *testing.T) {
	now := time.Unix(1.8e9, 0)
	lease := allocator.Lease{ID: "lease-000001", Namespace: "ml", Server: "gpu-a",
		Owner: allocator.Owner{Pod: "tf-0", UID: "uid-0", Labels: map[string]string{"app": "tf-training"}},
		GPUs:  []allocator.LeaseGPU{{Index: 0, Share: 500, MemoryBytes: 40 << 30}}}
	var d *Daemon
	sim := &fakegpu.Source{Server: "gpu-a", Seed: 7, Clock: func() time.Time { return now },
		GPUs:   []fakegpu.GPU{{Model: "H100", MemoryBytes: 80 << 30}},
		Leases: func() []allocator.Lease { return d.Leases() },
		Demand: func([]allocator.Lease, time.Time) map[string]float64 { return map[string]float64{lease.ID: 0.8} },
	}
	// Processes every 5 rounds, as gpupool-server reads them by default.
	sampler := collector.NewSampler(sim, time.Second, 5, sim.Clock)
	d = New(Config{Inventory: sim.Inventory(0, 0, nil), Client: leasesServer(t, lease),
		Samplers: []*collector.Sampler{sampler}, LabelAllowlist: []string{"app"}, Clock: sim.Clock})
	reg := Registry(d)
	ctx := context.Background()

	nothingMeasured := func(when string) {
		t.Helper()
		got := seriesValues(t, reg)
		for _, name := range measuredSeries {
			if v, ok := got[name]; ok {
				t.Errorf("%s: %s = %v, want no series", when, name, v)
			}
		}
		rep := d.UsageReport()
		for _, g := range rep.GPUs {
			if g.Utilization != nil || g.MemoryUsedBytes != 0 || g.MemoryBytes != 0 {
				t.Errorf("%s: usage report GPU %+v, want no utilization and memory 0 of 0 (not read)", when, g)
			}
		}
		if len(rep.Leases) != 0 {
			t.Errorf("%s: usage report leases %+v, want none", when, rep.Leases)
		}
	}
	nothingMeasured("before the first round")
	if !d.UsageReport().SampledAt.IsZero() {
		t.Error("usage report sampled before the first round")
	}

	sampler.Round(ctx)
	nothingMeasured("after a round before the leases were fetched")

	d.refreshLeases(ctx)
	nothingMeasured("after fetching the leases, before the next round")

	sampler.Round(ctx) // not a process round by the schedule
	got := seriesValues(t, reg)
	if v := got["bitfusion_lease_gpu_utilization"]; len(v) != 1 || math.Abs(v[0]-0.8) > 1e-9 {
		t.Errorf("lease utilization in the round after the leases were fetched = %v, want [0.8]", v)
	}
	if v := got["bitfusion_gpu_utilization"]; len(v) != 1 || v[0] < 0.4 || v[0] > 0.41 {
		t.Errorf("GPU utilization = %v, want [0.4 busy + noise]", v)
	}
	rep := d.UsageReport()
	if len(rep.Leases) != 1 || rep.Leases[0].SMUtilization == nil || math.Abs(*rep.Leases[0].SMUtilization-0.4) > 1e-9 {
		t.Errorf("usage report leases = %+v, want lease-000001 at 0.4 of the GPU", rep.Leases)
	}
}

// gatedSource stands for a source whose processes exist whatever the
// daemon knows (NVML): each Sample says it started, then waits to be let go.
type gatedSource struct {
	started, release chan struct{}
	procs            []collector.Process
}

func (*gatedSource) Name() string { return "gated" }
func (g *gatedSource) Sample(_ context.Context, processes bool) (collector.Reading, error) {
	g.started <- struct{}{}
	<-g.release
	gpu := collector.GPU{Index: 0, UUID: "GPU-0", Model: "H100", MemoryBytes: 80 << 30, Utilization: 0.1, Healthy: true,
		TemperatureCelsius: math.NaN(), PowerWatts: math.NaN()}
	if processes {
		gpu.Processes = append([]collector.Process{}, g.procs...)
	}
	return collector.Reading{GPUs: []collector.GPU{gpu}}, nil
}

// TestProcessesReadBeforeALeaseCannotShowItIdle: a process list read by a
// round that started before the daemon learned of a lease says nothing of
// what the lease runs (its pod may have started since), so the lease has no
// data until a later round reads the processes, which the daemon asks for
// at once. A lease whose processes use nothing then reports a measured 0.
func TestProcessesReadBeforeALeaseCannotShowItIdle(t *testing.T) {
	lease := allocator.Lease{ID: "lease-000001", Namespace: "ml", Server: "gpu-a", Owner: allocator.Owner{Pod: "tf-0", UID: "uid-0"},
		GPUs: []allocator.LeaseGPU{{Index: 0, Share: 500, MemoryBytes: 40 << 30}}}
	src := &gatedSource{started: make(chan struct{}), release: make(chan struct{}),
		procs: []collector.Process{{PID: 9000, MemoryUsedBytes: 1 << 30, SMUtilization: 0.1}}} // nobody's
	sampler := collector.NewSampler(src, time.Second, 5, nil)
	d := New(Config{Inventory: inventory.Server{Name: "gpu-a"}, Client: leasesServer(t, lease), Samplers: []*collector.Sampler{sampler}})
	reg := Registry(d)
	ctx := context.Background()

	done := make(chan struct{})
	go func() { sampler.Round(ctx); close(done) }()
	<-src.started
	d.refreshLeases(ctx) // while round 1 reads the processes
	close(src.release)
	<-done
	got := seriesValues(t, reg)
	for _, name := range []string{"bitfusion_lease_gpu_utilization", "bitfusion_lease_processes", "bitfusion_lease_memory_used_bytes"} {
		if v, ok := got[name]; ok {
			t.Errorf("from processes read before the lease was known: %s = %v, want no series", name, v)
		}
	}
	if rep := d.UsageReport(); len(rep.Leases) != 0 {
		t.Errorf("usage report leases = %+v, want none", rep.Leases)
	}

	// The pod's process starts, using no SM time and 2 GiB.
	src.procs = append(src.procs, collector.Process{PID: 9001, PodUID: "uid-0", MemoryUsedBytes: 2 << 30, SMUtilization: 0})
	go func() { <-src.started }()
	sampler.Round(ctx)
	got = seriesValues(t, reg)
	if v := got["bitfusion_lease_gpu_utilization"]; len(v) != 1 || v[0] != 0 {
		t.Errorf("lease utilization once its processes were read = %v, want a measured [0]", v)
	}
	if v := got["bitfusion_lease_processes"]; len(v) != 1 || v[0] != 1 {
		t.Errorf("lease processes = %v, want [1]", v)
	}
	rep := d.UsageReport()
	if len(rep.Leases) != 1 || rep.Leases[0].SMUtilization == nil || *rep.Leases[0].SMUtilization != 0 || rep.Leases[0].MemoryUsedBytes != 2<<30 {
		t.Errorf("usage report leases = %+v, want the lease at a measured 0 using 2 GiB", rep.Leases)
	}
}

// TestLeaseWithoutAttributionHasNoData: a lease with no pod UID is known
// only by the process `gpupool run` reports for it; before that report
// (after a daemon restart, say) its processes cannot be told from others',
// so the lease has no data rather than showing idle.
func TestLeaseWithoutAttributionHasNoData(t *testing.T) {
	lease := allocator.Lease{ID: "lease-000001", Namespace: "ml", Server: "gpu-a",
		GPUs: []allocator.LeaseGPU{{Index: 0, Share: 500, MemoryBytes: 40 << 30}}}
	src := &fixedSource{gpus: []collector.GPU{{Index: 0, UUID: "GPU-0", Model: "H100", MemoryBytes: 80 << 30, Healthy: true,
		Processes: []collector.Process{{PID: 7000, MemoryUsedBytes: 1 << 30, SMUtilization: 0.1}}}}}
	sampler := collector.NewSampler(src, time.Second, 1, nil)
	d := New(Config{Inventory: inventory.Server{Name: "gpu-a"}, Client: leasesServer(t, lease), Samplers: []*collector.Sampler{sampler}})
	reg := Registry(d)
	ctx := context.Background()
	d.refreshLeases(ctx)
	sampler.Round(ctx)
	if v, ok := seriesValues(t, reg)["bitfusion_lease_gpu_utilization"]; ok {
		t.Errorf("lease with no pod and no reported process: utilization %v, want no series", v)
	}
	if rep := d.UsageReport(); len(rep.Leases) != 0 {
		t.Errorf("usage report leases = %+v, want none", rep.Leases)
	}

	if err := d.RegisterPID(7000, lease.ID); err != nil {
		t.Fatal(err)
	}
	sampler.Round(ctx)
	if v := seriesValues(t, reg)["bitfusion_lease_gpu_utilization"]; len(v) != 1 || math.Abs(v[0]-0.2) > 1e-9 {
		t.Errorf("once its process is reported: utilization %v, want [0.2]", v)
	}
}
