package service

import (
	"fmt"
	"slices"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/inventory"
)

// What the daemons measured, kept in memory for the console: it is
// reported again every heartbeat, so nothing of it is stored, and a
// restarted allocator knows it again within one heartbeat.

// serverUse is a server's latest reading: its GPUs' use, and the SM use
// of each lease on it by lease and GPU index.
type serverUse struct {
	sampledAt time.Time
	gpus      []api.GPUUse
	leases    map[string]map[int]float64
}

// history is the console's ring of the pool's shares.
type history struct {
	points [api.HistoryLength]api.HistoryPoint
	n      int
	next   int
	last   time.Time
}

func (h *history) add(p api.HistoryPoint) {
	h.points[h.next] = p
	h.next = (h.next + 1) % api.HistoryLength
	h.n = min(h.n+1, api.HistoryLength)
	h.last = p.At
}

// all is the history, oldest first.
func (h *history) all() []api.HistoryPoint {
	out := make([]api.HistoryPoint, 0, h.n)
	for i := range h.n {
		out = append(out, h.points[(h.next-h.n+i+api.HistoryLength)%api.HistoryLength])
	}
	return out
}

// maxLeaseUsesPerGPU bounds the lease readings of one heartbeat: a GPU
// takes at most 100 leases at 1%.
const maxLeaseUsesPerGPU = 100

// maxUseSkew bounds how far a reading's sampledAt may be from the
// allocator's clock: ahead by a host's clock error, behind by a daemon
// whose sources lag. A reading outside it is refused, not shown as now.
const maxUseSkew = 5 * time.Minute

// checkUse validates a heartbeat's use against the server it is for, at
// now: one reading per GPU index, memory within each GPU's, a sample time
// within maxUseSkew; each error names the field, the value and the limit.
func checkUse(u *api.ServerUse, srv *inventory.Server, now time.Time) error {
	gpus := len(srv.GPUs)
	index := func(field string, i int) error {
		if i < 0 || i >= gpus {
			return &allocator.FieldError{Field: field, Value: fmt.Sprint(i), Limit: fmt.Sprintf("out of range 0..%d", gpus-1)}
		}
		return nil
	}
	ratio := func(field string, v *float64) error {
		if v != nil && (*v < 0 || *v > 1) {
			return &allocator.FieldError{Field: field, Value: fmt.Sprint(*v), Limit: "out of range 0..1"}
		}
		return nil
	}
	// After index: the GPU's memory, where it registered one.
	memory := func(field string, gpu int, v int64) error {
		most := int64(allocator.MaxGPUMemoryBytes)
		if m := srv.GPUs[gpu].MemoryBytes; m > 0 {
			most = m
		}
		if v < 0 || v > most {
			return &allocator.FieldError{Field: field, Value: fmt.Sprint(v), Limit: fmt.Sprintf("out of range 0..%d (GPU %d's memory)", most, gpu)}
		}
		return nil
	}
	switch skew := u.SampledAt.Sub(now); {
	case u.SampledAt.IsZero():
		return &allocator.FieldError{Field: "use.sampledAt", Value: `""`, Limit: "is required: when the daemon read its GPUs"}
	case skew > maxUseSkew || skew < -maxUseSkew:
		return &allocator.FieldError{Field: "use.sampledAt", Value: u.SampledAt.UTC().Format(time.RFC3339),
			Limit: fmt.Sprintf("is %v from the allocator's clock (%s), more than %v", skew.Round(time.Second), now.UTC().Format(time.RFC3339), maxUseSkew)}
	}
	if len(u.GPUs) > gpus {
		return &allocator.FieldError{Field: "use.gpus", Value: fmt.Sprintf("%d readings", len(u.GPUs)), Limit: fmt.Sprintf("at most one per GPU, %d", gpus)}
	}
	if limit := maxLeaseUsesPerGPU * gpus; len(u.Leases) > limit {
		return &allocator.FieldError{Field: "use.leases", Value: fmt.Sprintf("%d readings", len(u.Leases)), Limit: fmt.Sprintf("at most %d", limit)}
	}
	seen := make([]bool, gpus)
	for _, g := range u.GPUs {
		if err := firstError(index("use.gpus.index", g.Index), ratio("use.gpus.utilization", g.Utilization)); err != nil {
			return err
		}
		if seen[g.Index] {
			return &allocator.FieldError{Field: "use.gpus.index", Value: fmt.Sprint(g.Index), Limit: "is read twice: one reading per GPU"}
		}
		seen[g.Index] = true
		if err := memory("use.gpus.memoryUsedBytes", g.Index, g.MemoryUsedBytes); err != nil {
			return err
		}
	}
	type leaseGPU struct {
		lease string
		gpu   int
	}
	read := make(map[leaseGPU]bool, len(u.Leases))
	for _, l := range u.Leases {
		if err := firstError(index("use.leases.gpu", l.GPU), ratio("use.leases.smUtilization", l.SMUtilization)); err != nil {
			return err
		}
		if read[leaseGPU{l.Lease, l.GPU}] {
			return &allocator.FieldError{Field: "use.leases", Value: fmt.Sprintf("%q on GPU %d", l.Lease, l.GPU), Limit: "is read twice: one reading per lease and GPU"}
		}
		read[leaseGPU{l.Lease, l.GPU}] = true
		if err := memory("use.leases.memoryUsedBytes", l.GPU, l.MemoryUsedBytes); err != nil {
			return err
		}
	}
	return nil
}

func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// recordUse keeps a heartbeat's use; s.mu is held. Readings of leases
// that are not on the server (ended since the daemon sampled, or never
// placed there), or of a GPU the lease does not hold, are dropped: a
// daemon speaks for its own server's leases only.
func (s *Service) recordUse(now time.Time, name string, u *api.ServerUse) {
	on := map[string]*allocator.Lease{}
	leases := s.pool.LeasesOn(now, name)
	for i := range leases {
		on[leases[i].ID] = &leases[i]
	}
	su := &serverUse{sampledAt: u.SampledAt, gpus: u.GPUs, leases: map[string]map[int]float64{}}
	for _, l := range u.Leases {
		lease := on[l.Lease]
		if lease == nil || l.SMUtilization == nil || !slices.ContainsFunc(lease.GPUs, func(g allocator.LeaseGPU) bool { return g.Index == l.GPU }) {
			continue
		}
		if su.leases[l.Lease] == nil {
			su.leases[l.Lease] = map[int]float64{}
		}
		su.leases[l.Lease][l.GPU] = *l.SMUtilization
	}
	s.use[name] = su
	s.endRunsNotIdle(now, leases)
}

// maxUseAge is how old a reading may be and still say what a lease uses
// now: a daemon samples every few seconds and heart-beats every 5 s, so
// older is a source that stopped, whose last reading says nothing of now.
const maxUseAge = 30 * time.Second

// useOf is a lease's measured SM use over its share at now, and whether
// it is known: not when its server's reading is missing or older than
// maxUseAge, nor when a GPU of the lease is not in it; s.mu is held.
func (s *Service) useOf(l *allocator.Lease, now time.Time) (float64, bool) {
	su := s.use[l.Server]
	if su == nil || now.Sub(su.sampledAt) > maxUseAge {
		return 0, false
	}
	share := l.Share().GPUs()
	if share == 0 {
		return 0, false
	}
	var sm float64
	for _, g := range l.GPUs {
		v, ok := su.leases[l.ID][g.Index]
		if !ok { // a GPU of the lease unreported: its use is not known
			return 0, false
		}
		sm += v
	}
	return sm / share, true
}

// sampleUse adds a point to the history and a sample of each lease's use
// to its idle run, once every api.HistoryInterval; s.mu is held.
func (s *Service) sampleUse(now time.Time) {
	if now.Sub(s.history.last) < api.HistoryInterval {
		return
	}
	p := api.HistoryPoint{At: now}
	for _, st := range s.pool.ServerStates() {
		for gi := range st.Node.GPUs {
			g := &st.Node.GPUs[gi]
			p.GPUs++
			p.LeasedGPUs += (allocator.WholeGPU - g.Free).GPUs()
		}
		if su := s.use[st.Server.Name]; su != nil {
			for _, g := range su.gpus {
				if g.Utilization != nil {
					p.UsedGPUs += *g.Utilization
				}
			}
		}
	}
	s.history.add(p)
	live := map[string]bool{}
	s.pool.EachLease(now, func(l *allocator.Lease) {
		live[l.ID] = true
		use, known := s.useOf(l, now)
		s.sampleIdle(l, use, known, now)
	})
	for id := range s.idleRuns {
		if !live[id] {
			delete(s.idleRuns, id)
		}
	}
	for id := range s.notIdleAt {
		if !live[id] {
			delete(s.notIdleAt, id)
		}
	}
}
