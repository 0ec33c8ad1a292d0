package service

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
)

// thousandServers is an allocator with 1,000 servers of 8 GPUs holding
// leases of 10%: 10,000 of them is the pool docs/measurements/thousand-servers.md measures with
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

// BenchmarkTenantBesideAFullQueue is one tenant's acquire and release, over
// HTTP with tokens, while none waits and while the queue is full:
// namespaces queue acquisitions of a whole server, which never fit (every
// server holds a lease), up to --max-waiting-per-namespace each and
// --max-waiting in all. Each of the tenant's releases wakes every waiting
// request to try again. It reports the tenant's p50 and p99 in both, and
// their ratio, from the same run.
func BenchmarkTenantBesideAFullQueue(b *testing.B) {
	a := startAllocator(b, b.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, nil)
	ctx := context.Background()
	admin := a.client(b, adminToken)
	for i := range 4 {
		name := fmt.Sprintf("s%d", i)
		if err := admin.RegisterServer(ctx, gpuServer(name, 8)); err != nil {
			b.Fatal(err)
		}
		if _, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "holder", GPUAmount: 1, GPUPercent: 10, Servers: []string{name}}); err != nil {
			b.Fatal(err)
		}
	}
	tenant := a.client(b, teamBToken)
	rounds := func() (p50, p99 time.Duration) { return tenantRounds(b, tenant, 300) }
	idle50, idle99 := rounds()
	before := memInUse()

	waiters, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for ns := range DefaultMaxWaiting / DefaultMaxWaitingPerNamespace {
		for range DefaultMaxWaitingPerNamespace {
			wg.Go(func() {
				_, _ = admin.Acquire(waiters, api.AcquireRequest{Namespace: fmt.Sprint("queue-", ns), GPUAmount: 8, Wait: "1h"})
			})
		}
	}
	for a.svc.pendingCount() < DefaultMaxWaiting {
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "queue-0", GPUAmount: 8, Wait: "1h"}); !client.IsReason(err, api.ReasonTooManyWaiting) {
		b.Fatalf("past the bound: %v, want refused as too many waiting", err)
	}
	perWaiter := float64(memInUse()-before) / DefaultMaxWaiting
	full50, full99 := rounds()
	b.ReportMetric(float64(idle50.Microseconds())/1000, "idle-p50-ms")
	b.ReportMetric(float64(idle99.Microseconds())/1000, "idle-p99-ms")
	b.ReportMetric(float64(full50.Microseconds())/1000, "full-p50-ms")
	b.ReportMetric(float64(full99.Microseconds())/1000, "full-p99-ms")
	b.ReportMetric(float64(full99)/float64(idle99), "p99-full/idle")
	b.ReportMetric(perWaiter/1024, "KiB/waiting")
}

// tenantRounds is n rounds of team-b's acquisition and release of a
// tenth of a GPU: their p50 and p99.
func tenantRounds(b *testing.B, tenant *client.Client, n int) (p50, p99 time.Duration) {
	took := make([]time.Duration, n)
	for i := range took {
		start := time.Now()
		l, err := tenant.Acquire(context.Background(), api.AcquireRequest{Namespace: "team-b", GPUAmount: 1, GPUPercent: 10})
		if err != nil {
			b.Fatal(err)
		}
		if err := tenant.Release(context.Background(), l.ID); err != nil {
			b.Fatal(err)
		}
		took[i] = time.Since(start)
	}
	slices.Sort(took)
	return took[len(took)/2], took[len(took)*99/100]
}

// memInUse is the heap and the goroutine stacks in use, after a GC.
func memInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}

// BenchmarkConsoleView is one read of the console's view at 1,000 servers
// and 10,000 leases, each measured by its daemon: building it under the
// lock (ms-view, with the sorting after it), and its JSON, plain and
// gzip-compressed, as a browser reads it every second (docs/design.md,
// "The console").
func BenchmarkConsoleView(b *testing.B) {
	a, _ := thousandServers(b, 10_000)
	ctx := context.Background()
	for i := range 1000 {
		name := fmt.Sprintf("s%04d", i)
		use := &api.ServerUse{SampledAt: a.clock.Now()}
		for g := range 8 {
			use.GPUs = append(use.GPUs, api.GPUUse{Index: g, Utilization: ratio(0.3), MemoryUsedBytes: 1 << 30})
		}
		for _, l := range a.svc.Leases(LeaseFilter{Server: name}) {
			use.Leases = append(use.Leases, api.LeaseUse{Lease: l.ID, GPU: l.GPUs[0].Index, SMUtilization: ratio(0.05)})
		}
		if err := a.svc.Heartbeat(ctx, name, api.Heartbeat{Use: use}); err != nil {
			b.Fatal(err)
		}
	}
	var plain, zipped int
	var view time.Duration
	b.ResetTimer()
	for range b.N {
		a.clock.Add(consoleMaxAge) // a view no page has read yet
		start := time.Now()
		v := a.svc.Console(Principal{Admin: true})
		view += time.Since(start)
		body, err := json.Marshal(v)
		if err != nil {
			b.Fatal(err)
		}
		var z bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&z, gzip.BestSpeed)
		_, _ = zw.Write(body)
		_ = zw.Close()
		plain, zipped = len(body), z.Len()
	}
	b.ReportMetric(float64(view.Milliseconds())/float64(b.N), "ms-view")
	b.ReportMetric(float64(plain)/1e6, "MB-json")
	b.ReportMetric(float64(zipped)/1e6, "MB-gzip")
}

// BenchmarkConsoleBesideTenant is 200 clients reading the console's view
// at once, in plain JSON, as fast as they can, for at least 20 s, at 1,000 servers
// and 10,000 leases, beside another tenant's acquisitions: the tenant's
// p99 against its own p99 before the readers came, and the allocator's
// resident memory above what it was then (the readers read into
// io.Discard). A read past its token's bound is answered 429; the readers
// either retry at once, as a probe does, or wait the Retry-After second,
// as the console's page does. Once for the admin's view and once for a
// namespace token reading its own.
func BenchmarkConsoleBesideTenant(b *testing.B) {
	a, _ := thousandServers(b, 10_000)
	// The views rebuild once a second, as on a real clock.
	ticking, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		t := time.NewTicker(consoleMaxAge)
		defer t.Stop()
		for {
			select {
			case <-ticking.Done():
				return
			case <-t.C:
				a.clock.Add(consoleMaxAge)
			}
		}
	}()
	for _, tc := range []struct {
		name, token string
		backOff     bool
	}{{"admin/retry-at-once", adminToken, false}, {"admin/retry-after", adminToken, true}, {"namespace/retry-at-once", teamAToken, false}} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				consoleBesideTenant(b, a, tc.token, tc.backOff)
			}
		})
	}
}

func consoleBesideTenant(b *testing.B, a *testAllocator, token string, backOff bool) {
	ctx := context.Background()
	tenant := a.client(b, teamBToken)
	_, idle99 := tenantRounds(b, tenant, 300)
	idleRSS := rss(b)

	reading, stop := context.WithCancel(ctx)
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	var bytesRead int64
	// Plain JSON: no transparent gzip.
	hc := &http.Client{Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 200}}
	for range 200 {
		wg.Go(func() {
			for reading.Err() == nil {
				req, _ := http.NewRequestWithContext(reading, http.MethodGet, a.url+"/v1/console", nil)
				req.Header.Set("Authorization", "Bearer "+token)
				resp, err := hc.Do(req)
				if err != nil {
					continue
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				mu.Lock()
				codes[resp.StatusCode]++
				bytesRead += n
				mu.Unlock()
				if resp.StatusCode == http.StatusTooManyRequests && backOff {
					select {
					case <-reading.Done():
					case <-time.After(time.Second):
					}
				}
			}
		})
	}
	var peakRSS int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for reading.Err() == nil {
			peakRSS = max(peakRSS, rss(b))
			time.Sleep(100 * time.Millisecond)
		}
	}()
	time.Sleep(2 * time.Second) // the readers at full pace
	_, busy99 := tenantRounds(b, tenant, 300)
	time.Sleep(time.Until(start.Add(20 * time.Second)))
	stop()
	wg.Wait()
	<-sampled
	hc.CloseIdleConnections()
	b.ReportMetric(float64(idle99.Microseconds())/1000, "idle-p99-ms")
	b.ReportMetric(float64(busy99.Microseconds())/1000, "busy-p99-ms")
	b.ReportMetric(float64(busy99)/float64(idle99), "p99-busy/idle")
	b.ReportMetric(float64(peakRSS-idleRSS)/(1<<20), "MiB-RSS-above-idle")
	b.ReportMetric(float64(codes[http.StatusOK]), "reads-200")
	b.ReportMetric(float64(codes[http.StatusTooManyRequests]), "reads-429")
	b.ReportMetric(float64(bytesRead)/1e6, "MB-read")
}

// rss is this process's resident memory, from /proc.
func rss(b *testing.B) int64 {
	f, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Skip("no /proc/self/status: ", err)
	}
	for line := range strings.SplitSeq(string(f), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	b.Fatal("/proc/self/status has no VmRSS")
	return 0
}
