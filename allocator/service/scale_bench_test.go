package service

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
)

// thousandServers is an allocator with 1,000 servers of 8 GPUs holding
// 10,000 leases of 10%, the pool docs/design.md measures with gpupool-load.
func thousandServers(b *testing.B) *testAllocator {
	b.Helper()
	a := startAllocator(b, b.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, nil)
	ctx := context.Background()
	for i := range 1000 {
		if err := a.svc.RegisterServer(ctx, gpuServer(fmt.Sprintf("s%04d", i), 8).Core()); err != nil {
			b.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for w := range 100 {
		wg.Go(func() {
			for i := range 100 {
				r := allocator.Request{Namespace: "team-a", GPUs: 1, Percent: 10, Owner: allocator.Owner{Pod: fmt.Sprintf("p%d-%d", w, i)}}
				if _, err := a.svc.Acquire(ctx, r, 0); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return a
}

// BenchmarkServerRound is one GPU server's round at 1,000 servers and
// 10,000 leases: a heartbeat, then the listing of its leases.
func BenchmarkServerRound(b *testing.B) {
	a := thousandServers(b)
	hb := api.Heartbeat{GPUs: make([]api.GPUHealth, 8)}
	for i := range hb.GPUs {
		hb.GPUs[i] = api.GPUHealth{Index: i, Healthy: true}
	}
	b.ResetTimer()
	for i := range b.N {
		name := fmt.Sprintf("s%04d", i%1000)
		if err := a.svc.Heartbeat(context.Background(), name, hb); err != nil {
			b.Fatal(err)
		}
		a.svc.Leases(LeaseFilter{Server: name})
	}
}

// BenchmarkCollect is one scrape's collection at 1,000 servers and 10,000
// leases.
func BenchmarkCollect(b *testing.B) {
	a := thousandServers(b)
	b.ResetTimer()
	for range b.N {
		if _, err := a.reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}
