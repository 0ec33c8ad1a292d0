package service

import (
	"context"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/store"
)

// Quotas lists quota and use per namespace.
func (s *Service) Quotas() []allocator.QuotaStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pool.Quotas(s.clock())
}

// SetQuota sets the GPU share a namespace's leases may hold in all, and
// returns the namespace's quota and use. A quota below what the namespace
// holds keeps its leases and admits no new ones; a raised one wakes the
// requests that wait. The store keeps it, over the config file's.
func (s *Service) SetQuota(ctx context.Context, namespace string, hard allocator.Share) (allocator.QuotaStatus, error) {
	return s.putQuota(ctx, store.Quota{Namespace: namespace, Limited: true, Hard: hard})
}

// DeleteQuota removes a namespace's quota: it is unlimited from then on,
// across restarts too, whatever the config file says.
func (s *Service) DeleteQuota(ctx context.Context, namespace string) (allocator.QuotaStatus, error) {
	return s.putQuota(ctx, store.Quota{Namespace: namespace})
}

func (s *Service) putQuota(ctx context.Context, q store.Quota) (allocator.QuotaStatus, error) {
	var after allocator.QuotaStatus
	err := s.write(ctx, func(now time.Time) (store.Change, error) {
		before := s.pool.Quota(now, q.Namespace)
		if err := applyQuota(s.pool, q); err != nil {
			return store.Change{}, err
		}
		if before.Limited && (!q.Limited || q.Hard > before.Hard) {
			s.wakeLocked()
		}
		after = s.pool.Quota(now, q.Namespace)
		return store.Change{Quotas: []store.Quota{q}}, nil
	})
	return after, err
}

// applyQuota sets or removes a namespace's quota as q says.
func applyQuota(pool *allocator.Pool, q store.Quota) error {
	if q.Limited {
		return pool.SetQuota(q.Namespace, q.Hard)
	}
	return pool.RemoveQuota(q.Namespace)
}
