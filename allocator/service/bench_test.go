package service

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator/api"
)

// BenchmarkAcquireRelease measures acquire+release round trips through the
// HTTP API on loopback with the embedded store (every grant and release
// fsynced before it is answered), from 16 concurrent clients, and reports
// durable acquisitions per second and the acquire latency's p50 and p99.
func BenchmarkAcquireRelease(b *testing.B) {
	a := startAllocatorB(b)
	ctx := context.Background()
	admin := a.client(b, adminToken)
	for i := range 8 {
		if err := admin.RegisterServer(ctx, gpuServer(fmt.Sprint("s", i), 8)); err != nil {
			b.Fatal(err)
		}
	}
	var mu sync.Mutex
	var latencies []time.Duration
	b.SetParallelism(8) // 8 x GOMAXPROCS clients
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		c := a.client(b, adminToken)
		var mine []time.Duration
		for pb.Next() {
			t0 := time.Now()
			l, err := c.Acquire(ctx, api.AcquireRequest{Namespace: "bench", GPUAmount: 1, GPUPercent: 10})
			if err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(t0))
			if err := c.Release(ctx, l.ID); err != nil {
				b.Error(err)
				return
			}
		}
		mu.Lock()
		latencies = append(latencies, mine...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(latencies)
	if len(latencies) == 0 {
		return
	}
	q := func(p float64) float64 { return float64(latencies[int(p*float64(len(latencies)-1))].Microseconds()) / 1000 }
	b.ReportMetric(float64(len(latencies))/elapsed.Seconds(), "acquisitions/s")
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
}
