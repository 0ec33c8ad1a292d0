package service

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/store"
	"github.com/gpupool/gpupool/inventory"
)

// RegisterServer adds or updates a GPU server; it counts as a heartbeat.
func (s *Service) RegisterServer(ctx context.Context, srv inventory.Server) error {
	return s.write(ctx, func(now time.Time) (store.Change, error) {
		if err := s.pool.RegisterServer(srv); err != nil {
			return store.Change{}, err
		}
		s.lastSeen[srv.Name] = now
		_, _ = s.pool.SetSchedulable(srv.Name, true)
		s.wakeLocked()
		return store.Change{Servers: []inventory.Server{srv}}, nil
	})
}

// Heartbeat records that a server is alive and updates its GPUs' health.
func (s *Service) Heartbeat(ctx context.Context, name string, hb api.Heartbeat) error {
	return s.write(ctx, func(now time.Time) (store.Change, error) {
		srv, known := s.pool.Server(name)
		if !known {
			return store.Change{}, &allocator.ServerNotFoundError{Name: name}
		}
		if hb.Use != nil {
			if err := checkUse(hb.Use, &srv, now); err != nil {
				return store.Change{}, err
			}
		}
		changed := false
		for _, g := range hb.GPUs {
			if g.Index < 0 || g.Index >= len(srv.GPUs) {
				limit := fmt.Sprintf("out of range 0..%d", len(srv.GPUs)-1)
				if len(srv.GPUs) == 0 {
					limit = "names a GPU, but server " + srv.Name + " registered none"
				}
				return store.Change{}, &allocator.FieldError{Field: "gpus.index", Value: fmt.Sprint(g.Index), Limit: limit}
			}
			if srv.GPUs[g.Index].Healthy != g.Healthy {
				srv.GPUs[g.Index].Healthy, changed = g.Healthy, true
			}
		}
		s.lastSeen[name] = now
		if hb.Use != nil {
			s.recordUse(now, name, hb.Use)
		} else {
			delete(s.use, name) // a heartbeat with no reading: its source failed, or refused one
			s.endRunsNotIdle(now, s.pool.LeasesOn(now, name))
		}
		if back, _ := s.pool.SetSchedulable(name, true); back {
			s.wakeLocked() // back after silence: queued requests may fit now
		}
		if !changed {
			return store.Change{}, nil
		}
		for i, g := range srv.GPUs {
			if err := s.pool.SetGPUHealth(name, i, g.Healthy); err != nil {
				return store.Change{}, err
			}
		}
		s.wakeLocked()
		return store.Change{Servers: []inventory.Server{srv}}, nil
	})
}

// Run expires leases and marks silent servers until ctx ends.
func (s *Service) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.tick()
		}
	}
}

// Tick does once what Run does every period: another package's test on
// a clock of its own calls it after moving the clock, and then sees the
// lease use sampled (adapter/kedascaler's idle workloads).
func (s *Service) Tick() { s.tick() }

// tick marks the servers silent for longer than the heartbeat timeout;
// the write ends the leases whose time ran out.
func (s *Service) tick() {
	_ = s.write(context.Background(), func(now time.Time) (store.Change, error) {
		for name, seen := range s.lastSeen {
			if now.Sub(seen) > s.cfg.HeartbeatTimeout {
				_, _ = s.pool.SetSchedulable(name, false)
				delete(s.use, name) // a silent daemon's last reading is no reading
			}
		}
		s.sampleUse(now)
		return store.Change{}, nil
	})
}

// Status reports the pool for `gpupool pool status`.
func (s *Service) Status() api.PoolStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	leases := map[string]int{}
	for _, l := range s.pool.Leases(s.clock()) {
		leases[l.Server]++
	}
	var st api.PoolStatus
	for _, state := range s.pool.ServerStates() {
		st.Servers = append(st.Servers, s.serverStatus(&state, leases[state.Server.Name]))
	}
	for r, w := range s.waiting {
		st.Pending = append(st.Pending, api.PendingRequest{Namespace: r.Namespace, Owner: api.NewOwner(r.Owner), GPUs: r.GPUs,
			Percent: r.Percent, GPUMemoryBytes: r.GPUMemoryBytes, Since: w.since})
	}
	slices.SortFunc(st.Pending, func(a, b api.PendingRequest) int { return a.Since.Compare(b.Since) })
	return st
}

// Server reports one server as Status does: what the node side of a
// GPU server polls, which would be the whole pool's status times the
// number of servers if it read Status.
func (s *Service) Server(name string) (api.ServerStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	state, known := s.pool.ServerState(name)
	if !known {
		return api.ServerStatus{}, &allocator.ServerNotFoundError{Name: name}
	}
	return s.serverStatus(&state, len(s.pool.LeasesOn(s.clock(), name))), nil
}

// serverStatus is one server and what is leased on it; s.mu is held.
func (s *Service) serverStatus(state *allocator.ServerState, leases int) api.ServerStatus {
	srv, n := &state.Server, &state.Node
	ss := api.ServerStatus{
		Name: srv.Name, Labels: srv.Labels, Schedulable: n.Schedulable, LastHeartbeat: s.lastSeen[srv.Name],
		CPUMilli: n.CPUCap, CPUFreeMilli: n.CPUFree, Leases: leases,
	}
	for gi, g := range srv.GPUs {
		ng := &n.GPUs[gi]
		ss.GPUs = append(ss.GPUs, api.GPUStatus{
			Index: g.Index, UUID: g.UUID, Model: g.Model, MemoryBytes: g.MemoryBytes, Healthy: ng.Healthy, Links: g.Links,
			AllocatedPercent: (allocator.WholeGPU - ng.Free).Percent(), AllocatedBytes: ng.MemoryBytes - ng.FreeBytes,
		})
	}
	return ss
}
