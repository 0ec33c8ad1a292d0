package service

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/store"
)

func (s *Service) recover(ctx context.Context) error {
	st, err := s.cfg.Store.Load(ctx)
	if err != nil {
		return fmt.Errorf("loading state from the %s store: %w", s.cfg.Store.Name(), err)
	}
	now := s.clock()
	misfits, expired, err := restore(s.pool, st, now)
	if err != nil {
		return err
	}
	var dropped []string
	for _, m := range misfits {
		s.log.Error("dropping a stored lease that no longer fits", "lease", m.ID, "err", m.Err)
		dropped = append(dropped, m.ID)
	}
	for _, l := range expired {
		dropped = append(dropped, l.ID)
	}
	for _, srv := range st.Servers {
		s.lastSeen[srv.Name] = now
	}
	// The leases still held are the workload so far: a replica that takes
	// over, or an allocator restarted, places against it from the start.
	if s.estimate.Seed(grantedShapes(s.pool.Leases(now))) {
		s.refreshPolicyLocked()
	}
	if len(dropped) > 0 {
		if err := s.cfg.Store.Apply(ctx, []store.Change{{Ended: dropped}}); err != nil {
			return fmt.Errorf("recording leases expired while down: %w", err)
		}
	}
	s.log.Info("recovered state", "store", s.cfg.Store.Name(), "servers", len(st.Servers),
		"leases", len(st.Leases)-len(dropped), "expired_or_dropped", len(dropped))
	return nil
}

// grantedShapes are the leases' shapes, oldest grant first.
func grantedShapes(leases []allocator.Lease) []allocator.Demand {
	slices.SortStableFunc(leases, func(a, b allocator.Lease) int { return a.GrantedAt.Compare(b.GrantedAt) })
	shapes := make([]allocator.Demand, len(leases))
	for i := range leases {
		shapes[i] = allocator.GrantedShape(&leases[i])
	}
	return shapes
}

// Misfit is a stored lease that could not be put back on its GPUs.
type Misfit struct {
	ID  string
	Err error
}

// restore puts stored state into a pool as recovery does: servers
// registered again, leases on the GPUs they were granted, quotas over
// those the pool has. It returns the leases that no longer fit, and those
// expired by now (ended in the pool).
func restore(pool *allocator.Pool, st store.State, now time.Time) (misfits []Misfit, expired []allocator.Lease, err error) {
	for _, srv := range st.Servers {
		if err := pool.RestoreServer(srv); err != nil {
			return nil, nil, fmt.Errorf("restoring server %s: %w", srv.Name, err)
		}
	}
	for _, q := range st.Quotas {
		if err := applyQuota(pool, q); err != nil {
			return nil, nil, fmt.Errorf("restoring the quota of namespace %s: %w", q.Namespace, err)
		}
	}
	for _, l := range st.Leases {
		if err := pool.Restore(l); err != nil {
			misfits = append(misfits, Misfit{ID: l.ID, Err: err})
		}
	}
	pool.SetNextID(st.NextID)
	return misfits, pool.Expire(now), nil
}

// CheckReport is what CheckState found in a store.
type CheckReport struct {
	Servers, Leases int
	// Expired are leases whose time ran out: recovery would end them.
	Expired int
	// Misfits are leases that do not fit their server's GPUs: recovery
	// would drop them, and the store is inconsistent.
	Misfits []Misfit
	NextID  uint64
}

// CheckState restores stored state into a scratch pool, exactly as a
// starting allocator would, and checks the pool's bookkeeping; nothing is
// written anywhere. It backs `gpupool-allocator --check`.
func CheckState(st store.State, now time.Time) (CheckReport, error) {
	pol, err := allocator.NewPolicy("best-fit", allocator.PolicyOptions{})
	if err != nil {
		return CheckReport{}, err
	}
	pool, err := allocator.NewPool(allocator.PoolConfig{Policy: pol, DefaultTTL: time.Minute, MaxTTL: time.Minute})
	if err != nil {
		return CheckReport{}, err
	}
	misfits, expired, err := restore(pool, st, now)
	if err != nil {
		return CheckReport{}, err
	}
	if err := pool.CheckInvariants(); err != nil {
		return CheckReport{}, fmt.Errorf("restored state breaks the pool's invariants: %w", err)
	}
	return CheckReport{Servers: len(st.Servers), Leases: len(st.Leases), Expired: len(expired), Misfits: misfits, NextID: st.NextID}, nil
}
