package gpuserver

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/collector"
	"github.com/gpupool/gpupool/fakegpu"
)

// benchHost is a host of 8 GPUs with 64 leases (8 per GPU, 12.5% each).
func benchHost() (*Daemon, *fakegpu.Source, *collector.Sampler) {
	now := time.Unix(1.8e9, 0)
	var d *Daemon
	sim := &fakegpu.Source{Server: "gpu-a", Seed: 1, Clock: func() time.Time { return now },
		Leases: func() []allocator.Lease { return d.Leases() }}
	for range 8 {
		sim.GPUs = append(sim.GPUs, fakegpu.GPU{Model: "H100", MemoryBytes: 80 << 30})
	}
	sampler := collector.NewSampler(sim, time.Second, 1, sim.Clock)
	d = New(Config{Inventory: sim.Inventory(0, 0, nil), Samplers: []*collector.Sampler{sampler}, LabelAllowlist: []string{"app"}, Clock: sim.Clock})
	for i := range 64 {
		pod := fmt.Sprint("pod-", i)
		d.leases = append(d.leases, allocator.Lease{ID: fmt.Sprintf("lease-%06d", i), Namespace: "ml", Server: "gpu-a",
			Owner: allocator.Owner{Pod: pod, UID: "uid-" + pod, Labels: map[string]string{"app": "tf-training"}},
			GPUs:  []allocator.LeaseGPU{{Index: i % 8, Share: 125, MemoryBytes: 10 << 30}}})
	}
	sampler.Round(context.Background())
	return d, sim, sampler
}

// BenchmarkScrape renders the daemon's whole /metrics for a host with 8
// GPUs and 64 leases, as a scrape does, and reports its p50 and p99.
func BenchmarkScrape(b *testing.B) {
	d, _, _ := benchHost()
	reg := Registry(d)
	lat := make([]time.Duration, 0, b.N)
	var buf bytes.Buffer
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		families, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		buf.Reset()
		for _, f := range families {
			_, _ = expfmt.MetricFamilyToText(&buf, f)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(buf.Len()), "bytes/scrape")
}

// BenchmarkSamplingRound times a daemon's sampling round for that host: the
// source's calls alone (raw), the sampler's round without rendering, and
// the rendering of what scrapes and usage requests then only copy (the
// series, the usage report). It reports the round's cost over the raw calls
// and the CPU a 1 Hz loop costs.
func BenchmarkSamplingRound(b *testing.B) {
	d, sim, sampler := benchHost()
	_ = Registry(d) // sets the sampler's AfterRound, the rendering
	after := sampler.AfterRound
	sampler.AfterRound = nil
	ctx := context.Background()
	var raw, round, render time.Duration
	for i := range b.N {
		t0 := time.Now()
		_, _ = sim.Sample(ctx, i%5 == 0)
		raw += time.Since(t0)
		t0 = time.Now()
		sampler.Round(ctx)
		round += time.Since(t0)
		t0 = time.Now()
		after()
		render += time.Since(t0)
	}
	n := float64(b.N)
	b.ReportMetric(float64(raw.Microseconds())/n, "raw-us")
	b.ReportMetric(float64(round)/float64(raw), "round/raw")
	b.ReportMetric(float64(render.Microseconds())/n, "render-us")
	b.ReportMetric(float64((round+render).Microseconds())/n/1e6, "cpu-s-per-s-at-1Hz")
}
