package app

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
)

// holder plays one client of the pool: it acquires a lease, renews it
// every third of its TTL as `gpupool run` does, acquires again when the
// lease is lost, and releases it at the end unless told to keep it.
type holder struct {
	client    *client.Client
	namespace string
	group     string
	index     int
}

// clientStats are the clients' calls to the allocator.
type clientStats struct {
	live    atomic.Int64
	acquire latencies
	renew   latencies
	release latencies
}

// groupLabel is the owner label whose value names a lease's group: the
// selector of the adapter's query.
const groupLabel = "app"

// retryPause is how long a holder waits after a failed acquisition.
const retryPause = time.Second

// hold runs until ctx ends. acquiring bounds the acquisitions in flight
// across holders, so that the clients ramp up instead of stampeding.
func (h *holder) hold(ctx context.Context, o *Options, acquiring chan struct{}, st *clientStats, errs *errorCounts) {
	req := api.AcquireRequest{Namespace: h.namespace, GPUAmount: 1, GPUPercent: o.Percent, TTL: o.TTL.String(),
		Owner: api.Owner{Pod: fmt.Sprintf("load-%d", h.index), Labels: map[string]string{groupLabel: h.group}}}
	for ctx.Err() == nil {
		id, ok := h.acquire(ctx, req, acquiring, st, errs)
		if !ok {
			pause(ctx, retryPause)
			continue
		}
		st.live.Add(1)
		h.renewUntilLost(ctx, id, o.TTL, st, errs)
		if ctx.Err() == nil { // lost: acquire another
			st.live.Add(-1)
			continue
		}
		if !o.Keep {
			h.release(id, st, errs)
			st.live.Add(-1)
		}
	}
}

func (h *holder) acquire(ctx context.Context, req api.AcquireRequest, acquiring chan struct{}, st *clientStats, errs *errorCounts) (string, bool) {
	select {
	case acquiring <- struct{}{}:
	case <-ctx.Done():
		return "", false
	}
	defer func() { <-acquiring }()
	t0 := time.Now()
	l, err := h.client.Acquire(ctx, req)
	if err != nil {
		if ctx.Err() == nil {
			errs.add("acquire", err)
		}
		return "", false
	}
	st.acquire.add(time.Since(t0))
	return l.ID, true
}

// renewUntilLost renews the lease every third of ttl until ctx ends or the
// allocator no longer has it. The first renewal comes at a random point of
// the first third, as from clients that started at different times: the
// ramp-up acquires every lease within seconds, and renewals that stayed
// as bunched would measure a stampede rather than the steady state.
func (h *holder) renewUntilLost(ctx context.Context, id string, ttl time.Duration, st *clientStats, errs *errorCounts) {
	wait := rand.N(ttl / 3)
	for ; pause(ctx, wait); wait = ttl / 3 {
		t0 := time.Now()
		_, err := h.client.Renew(ctx, id, 0)
		switch {
		case err == nil:
			st.renew.add(time.Since(t0))
		case ctx.Err() != nil:
			return
		default:
			errs.add("renew", err)
			if client.IsReason(err, api.ReasonNotFound) {
				return
			}
		}
	}
}

// release ends the lease after the run's context is over, so with a
// context of its own.
func (h *holder) release(id string, st *clientStats, errs *errorCounts) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := h.client.Release(ctx, id); err != nil {
		errs.add("release", err)
		return
	}
	st.release.add(time.Since(t0))
}

// pause waits d, and reports false when ctx ended first.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
