package app

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/inventory"
)

// gpuModel and gpuMemoryBytes are every simulated GPU's.
const (
	gpuModel       = "H100"
	gpuMemoryBytes = 80 << 30
)

// simServer plays one gpupool-server daemon towards the allocator: it
// registers, heart-beats and lists its leases each round as the daemon
// does, and answers GET /v1/usage from those leases with made-up readings.
type simServer struct {
	inv inventory.Server

	mu     sync.Mutex
	leases []api.Lease
}

func newSimServer(name string, gpus int, daemonURL string) *simServer {
	inv := inventory.Server{Name: name, Labels: map[string]string{gpuapi.LabelDaemonURL: daemonURL}, CPUMilli: 128000, MemoryBytes: 1 << 40}
	for i := range gpus {
		inv.GPUs = append(inv.GPUs, inventory.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", name, i), Model: gpuModel, MemoryBytes: gpuMemoryBytes, Healthy: true})
	}
	return &simServer{inv: inv}
}

// serverStats are the servers' calls to the allocator.
type serverStats struct {
	registered atomic.Int64
	register   latencies
	heartbeat  latencies
	listLeases latencies
	usageReads atomic.Int64
}

// register registers the server and lists its leases.
func (s *simServer) register(ctx context.Context, c *client.Client, st *serverStats, errs *errorCounts) bool {
	t0 := time.Now()
	if err := c.RegisterServer(ctx, api.NewServer(s.inv)); err != nil {
		if ctx.Err() == nil {
			errs.add("register", err)
		}
		return false
	}
	st.register.add(time.Since(t0))
	st.registered.Add(1)
	s.listLeases(ctx, c, st, errs)
	return true
}

// beat heart-beats and lists the server's leases every interval until ctx
// ends, starting at a random point of the first interval so that the
// servers' rounds spread as real daemons' do.
func (s *simServer) beat(ctx context.Context, c *client.Client, interval time.Duration, st *serverStats, errs *errorCounts) {
	if !pause(ctx, rand.N(interval)) {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	hb := api.Heartbeat{GPUs: make([]api.GPUHealth, len(s.inv.GPUs))}
	for i := range hb.GPUs {
		hb.GPUs[i] = api.GPUHealth{Index: i, Healthy: true}
	}
	for {
		t0 := time.Now()
		if err := c.Heartbeat(ctx, s.inv.Name, hb); err != nil {
			if ctx.Err() != nil {
				return
			}
			errs.add("heartbeat", err)
		} else {
			st.heartbeat.add(time.Since(t0))
		}
		s.listLeases(ctx, c, st, errs)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// listLeases fetches the server's leases, as the daemon does after every
// heartbeat to attribute processes and report usage.
func (s *simServer) listLeases(ctx context.Context, c *client.Client, st *serverStats, errs *errorCounts) {
	t0 := time.Now()
	leases, err := c.Leases(ctx, client.LeaseFilter{Server: s.inv.Name})
	if err != nil {
		if ctx.Err() == nil {
			errs.add("list-leases", err)
		}
		return
	}
	st.listLeases.add(time.Since(t0))
	s.mu.Lock()
	s.leases = leases
	s.mu.Unlock()
}

// usage is the server's reading now: every GPU and lease busy at a level
// fixed by its name, so that the adapter's answers are steady.
func (s *simServer) usage(now time.Time) gpuapi.Usage {
	u := gpuapi.Usage{Server: s.inv.Name, SampledAt: now, GPUs: []gpuapi.GPUUsage{}, Leases: []gpuapi.LeaseUsage{}}
	for _, g := range s.inv.GPUs {
		busy := level(g.UUID)
		u.GPUs = append(u.GPUs, gpuapi.GPUUsage{Index: g.Index, UUID: g.UUID, Model: g.Model, Healthy: true,
			Utilization: &busy, MemoryUsedBytes: int64(busy * gpuMemoryBytes), MemoryBytes: gpuMemoryBytes})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.leases {
		for _, g := range l.GPUs {
			share := allocator.SharePercent(g.Percent)
			sm := level(l.ID) * share.GPUs()
			u.Leases = append(u.Leases, gpuapi.LeaseUsage{Lease: l.ID, Namespace: l.Namespace, GPU: g.Index, Milli: int32(share),
				SMUtilization: &sm, MemoryUsedBytes: int64(level(l.ID) * float64(g.MemoryBytes)), MemoryGrantedBytes: g.MemoryBytes, Processes: 1})
		}
	}
	return u
}

// level is a steady made-up utilization in 0.2..0.9 for a name.
func level(name string) float64 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	return 0.2 + 0.7*float64(h.Sum32()%1000)/1000
}

// usageHandler serves every simulated daemon's GET /v1/usage under
// /servers/<name>, the daemon URL each one registers with.
func usageHandler(servers map[string]*simServer, st *serverStats) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /servers/{name}/v1/usage", func(w http.ResponseWriter, r *http.Request) {
		s := servers[r.PathValue("name")]
		if s == nil {
			http.NotFound(w, r)
			return
		}
		st.usageReads.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.usage(time.Now()))
	})
	return mux
}
