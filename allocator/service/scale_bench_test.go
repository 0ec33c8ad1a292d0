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
// leases of 10%: 10,000 of them is the pool docs/design.md measures with
// gpupool-load.
func thousandServers(b *testing.B, leases int) (*testAllocator, []string) {
	b.Helper()
	a := startAllocator(b, b.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, nil)
	ctx := context.Background()
	for i := range 1000 {
		if err := a.svc.RegisterServer(ctx, gpuServer(fmt.Sprintf("s%04d", i), 8).Core()); err != nil {
			b.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ids []string
	for w := range 100 {
		wg.Go(func() {
			for i := range leases / 100 {
				r := allocator.Request{Namespace: "team-a", GPUs: 1, Percent: 10, Owner: allocator.Owner{Pod: fmt.Sprintf("p%d-%d", w, i)}}
				l, err := a.svc.Acquire(ctx, r, 0)
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				ids = append(ids, l.ID)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return a, ids
}

// BenchmarkServerRound is one GPU server's round at 1,000 servers with
// 1,000 and with 10,000 leases: a heartbeat, then the listing of its
// leases. It costs the leases on that server, not the pool's: the
// heartbeat's write ends the leases due off the pool's expiry heap, and
// the listing reads the pool's leases by server (docs/design.md, "A
// thousand GPU servers").
func BenchmarkServerRound(b *testing.B) {
	hb := api.Heartbeat{GPUs: make([]api.GPUHealth, 8)}
	for i := range hb.GPUs {
		hb.GPUs[i] = api.GPUHealth{Index: i, Healthy: true}
	}
	for _, leases := range []int{1000, 10_000} {
		b.Run(fmt.Sprintf("leases=%d", leases), func(b *testing.B) {
			a, _ := thousandServers(b, leases)
			b.ResetTimer()
			for i := range b.N {
				name := fmt.Sprintf("s%04d", i%1000)
				if err := a.svc.Heartbeat(context.Background(), name, hb); err != nil {
					b.Fatal(err)
				}
				a.svc.Leases(LeaseFilter{Server: name})
			}
		})
	}
}

// BenchmarkCollect is one scrape's collection at 1,000 servers and 10,000
// leases.
func BenchmarkCollect(b *testing.B) {
	a, _ := thousandServers(b, 10_000)
	b.ResetTimer()
	for range b.N {
		if _, err := a.reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}
