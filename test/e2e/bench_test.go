package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/etcdtest"
)

// BenchmarkAcquireRelease measures acquire+release round trips through the
// allocator binary's HTTP API on loopback, from 16 concurrent clients, with
// each store (etcd with one member and with three): every grant and
// release is durable before it is answered.
// Tokens are on, as deployed: each client holds the namespace's token.
// It reports durable acquisitions per second and the acquire latency's p50
// and p99, and, to tell where the time goes, how many requests each store
// write carries (group commit) and the share of the time a store write
// was under way (the committer writes one batch at a time: near 100%, the
// store's write latency bounds the rate).
func BenchmarkAcquireRelease(b *testing.B) {
	b.Run("store=bolt", func(b *testing.B) {
		benchAcquireRelease(b, "--data-dir", b.TempDir())
	})
	b.Run("store=etcd", func(b *testing.B) {
		benchAcquireRelease(b, "--store", "etcd", "--etcd-endpoints", etcdtest.Start(b))
	})
	// Three members, as deployed for high availability: a write commits
	// once two of them have it.
	b.Run("store=etcd-3", func(b *testing.B) {
		benchAcquireRelease(b, "--store", "etcd", "--etcd-endpoints", etcdtest.Endpoints(etcdtest.StartCluster(b, 3)))
	})
}

func benchAcquireRelease(b *testing.B, args ...string) {
	config := writePoolConfig(b, map[string]int64{"bench": noQuota})
	a := startAllocator(b, append(args, "--config", config.Path)...)
	ctx := context.Background()
	servers := newClient(b, a.URL, config.Servers)
	for i := range 8 {
		register(b, servers, gpuServer(fmt.Sprint("s", i), 8))
	}
	var mu sync.Mutex
	var latencies []time.Duration
	b.SetParallelism(8) // 8 x GOMAXPROCS (2 here) clients
	writesBefore, writeSecondsBefore := storeWrites(b, a.URL)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		c, _ := client.New([]string{a.URL}, config.Tenant["bench"])
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
	if len(latencies) == 0 {
		return
	}
	writes, writeSeconds := storeWrites(b, a.URL)
	b.ReportMetric(float64(2*len(latencies))/float64(writes-writesBefore), "requests/write")
	b.ReportMetric(100*(writeSeconds-writeSecondsBefore)/elapsed.Seconds(), "store-busy-%")
	slices.Sort(latencies)
	q := func(p float64) float64 {
		return float64(latencies[int(p*float64(len(latencies)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(float64(len(latencies))/elapsed.Seconds(), "acquisitions/s")
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
}

// storeWrites reads from the allocator's metrics how many batches it has
// written to its store and how many seconds those writes took in all.
func storeWrites(b *testing.B, url string) (count uint64, seconds float64) {
	b.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(metrics(b, url)))
	if err != nil {
		b.Fatal(err)
	}
	for _, m := range families["bitfusion_store_apply_duration_seconds"].GetMetric() {
		count += m.GetHistogram().GetSampleCount()
		seconds += m.GetHistogram().GetSampleSum()
	}
	return count, seconds
}
