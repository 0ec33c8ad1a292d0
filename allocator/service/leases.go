package service

import (
	"context"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/store"
)

// Acquire grants a lease, waiting up to wait for capacity or quota, and
// answers once the grant is durable.
func (s *Service) Acquire(ctx context.Context, r allocator.Request, wait time.Duration) (allocator.Lease, error) {
	return s.acquire(ctx, r, wait, true)
}

// AcquireBeforeDurable grants a lease as Acquire does, but answers as soon
// as the grant is made, while its write is still under way. A scheduler
// that decides inside its one scheduling loop asks this way, so that the
// loop does not wait for the store, and makes the grant durable later,
// off the loop, by asking again with the same idempotency key: that
// answer waits for the write. Until then the lease may be lost to a crash
// of the allocator, and the caller must not act on it.
func (s *Service) AcquireBeforeDurable(ctx context.Context, r allocator.Request, wait time.Duration) (allocator.Lease, error) {
	return s.acquire(ctx, r, wait, false)
}

func (s *Service) acquire(ctx context.Context, r allocator.Request, wait time.Duration, answerDurable bool) (allocator.Lease, error) {
	start := time.Now()
	deadline := start.Add(wait)
	if wait > 0 {
		defer s.notWaiting(&r)
	}
	for {
		var l allocator.Lease
		var replay bool
		var wake chan struct{}
		done, err := s.apply(func(now time.Time) (store.Change, error) {
			before := s.pool.NextID()
			var err error
			l, err = s.pool.Acquire(now, r)
			if err != nil {
				if wait > 0 && kindOf(err).waitable {
					wake, err = s.queueLocked(&r, start, err)
				}
				return store.Change{}, err
			}
			// An idempotent retry is written again too: its answer waits
			// until the first grant is durable.
			if replay = s.pool.NextID() == before; !replay {
				s.remember(&l)
			}
			return store.Change{Leases: []allocator.Lease{l}, NextID: s.pool.NextID()}, nil
		})
		if done != nil && answerDurable {
			if derr := durable(ctx, done); derr != nil {
				err = derr
			}
		}
		if err == nil {
			if !replay {
				s.metrics.acquired(start, nil)
			}
			return l, nil
		}
		if !kindOf(err).waitable || !time.Now().Before(deadline) || waitForFreed(ctx, wake, deadline) != nil {
			s.metrics.acquired(start, err)
			return allocator.Lease{}, err
		}
	}
}

// remember learns a granted lease's shape for the expected workload, and
// rebuilds the frag-based policies when the estimate moved.
func (s *Service) remember(l *allocator.Lease) {
	if s.estimate.Add(allocator.GrantedShape(l)) {
		s.refreshPolicyLocked()
	}
}

func (s *Service) refreshPolicyLocked() {
	pol, err := allocator.NewPolicy(s.cfg.Policy, allocator.PolicyOptions{Seed: s.cfg.Seed, Workload: s.estimate.Current()})
	if err == nil {
		s.pool.SetPolicy(pol)
	}
}

// Renew extends a lease.
func (s *Service) Renew(ctx context.Context, p Principal, id string, ttl time.Duration) (allocator.Lease, error) {
	var l allocator.Lease
	err := s.write(ctx, func(now time.Time) (store.Change, error) {
		err := s.mayUseLocked(p, id, now)
		if err == nil {
			l, err = s.pool.Renew(now, id, ttl)
		}
		return store.Change{Leases: []allocator.Lease{l}}, err
	})
	return l, err
}

// Release ends a lease.
func (s *Service) Release(ctx context.Context, p Principal, id string) (allocator.Lease, error) {
	var l allocator.Lease
	err := s.write(ctx, func(now time.Time) (store.Change, error) {
		err := s.mayUseLocked(p, id, now)
		if err == nil {
			l, err = s.pool.Release(now, id)
		}
		if err != nil {
			return store.Change{}, err
		}
		s.wakeLocked()
		return store.Change{Ended: []string{id}}, nil
	})
	if err == nil {
		s.metrics.releases.Inc()
	}
	return l, err
}

// Lease returns one lease.
func (s *Service) Lease(p Principal, id string) (allocator.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.pool.Lease(s.clock(), id)
	if err != nil {
		return l, err
	}
	if !p.mayRead(&l) {
		// Not 403: that would tell which IDs other namespaces hold.
		return allocator.Lease{}, &allocator.LeaseNotFoundError{ID: id}
	}
	return l, nil
}

// mayUseLocked checks that a live lease is one the principal may renew or
// release; another namespace's is not found, as for Lease.
func (s *Service) mayUseLocked(p Principal, id string, now time.Time) error {
	l, err := s.pool.Lease(now, id)
	if err == nil && !p.mayUse(l.Namespace) {
		err = &allocator.LeaseNotFoundError{ID: id}
	}
	return err
}

// LeaseFilter selects leases to list.
type LeaseFilter struct {
	Namespace string
	Server    string
	// OwnerUID selects the leases of one owner (a pod's UID).
	OwnerUID string
	Selector func(labels map[string]string) bool
}

// Leases lists the live leases that match f.
func (s *Service) Leases(f LeaseFilter) []allocator.Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	var leases []allocator.Lease
	if f.Server != "" { // each daemon's every round: its server's, not a copy of the pool's
		leases = s.pool.LeasesOn(now, f.Server)
	} else {
		leases = s.pool.Leases(now)
	}
	var out []allocator.Lease
	for _, l := range leases {
		if f.Namespace != "" && l.Namespace != f.Namespace || f.Server != "" && l.Server != f.Server ||
			f.OwnerUID != "" && l.Owner.UID != f.OwnerUID || f.Selector != nil && !f.Selector(l.Owner.Labels) {
			continue
		}
		out = append(out, l)
	}
	return out
}
