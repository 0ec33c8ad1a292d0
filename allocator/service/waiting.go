package service

import (
	"context"
	"strings"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/inventory"
)

// waiter is a request queued for capacity or quota.
type waiter struct {
	since time.Time
	// shape is what decides whether the request fits: requests of one
	// shape fit or not together, so one try answers for all of them.
	shape shape
	// wake is sent to when the request fits now; it holds one wake-up, so
	// that none sent between its try and its wait is lost.
	wake chan struct{}
}

// shape is a request's demand and namespace (its quota), without its
// owner, key or lifetime. A request that names candidate servers is a
// shape of its own: the list may be a cluster's every node.
type shape struct {
	namespace                    string
	gpus, percent                int
	gpuBytes, cpuMilli, memBytes int64
	models                       string
	link                         inventory.Link
	own                          *allocator.Request
}

func shapeOf(r *allocator.Request) shape {
	sh := shape{namespace: r.Namespace, gpus: r.GPUs, percent: r.Percent, gpuBytes: r.GPUMemoryBytes, cpuMilli: r.CPUMilli,
		memBytes: r.MemoryBytes, models: strings.Join(r.Models, ","), link: r.Topology}
	if len(r.Servers) > 0 {
		sh.own = r
	}
	return sh
}

// wakeLocked wakes the waiting requests that fit now, after share or
// quota freed up: one try of the pool's a shape, where waking every
// waiting request would have each try again, and all but a few fail,
// under the lock every other request needs.
func (s *Service) wakeLocked() {
	fits := map[shape]bool{}
	for r, w := range s.waiting {
		ok, tried := fits[w.shape]
		if !tried {
			ok = s.pool.Fits(*r) == nil
			fits[w.shape] = ok
		}
		if ok {
			select {
			case w.wake <- struct{}{}:
			default: // woken already
			}
		}
	}
}

// waitForFreed waits until wake says the request fits, the deadline
// passes or ctx ends.
func waitForFreed(ctx context.Context, wake chan struct{}, deadline time.Time) error {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-wake:
		return nil
	case <-t.C:
		return context.DeadlineExceeded
	case <-ctx.Done():
		return ctx.Err()
	}
}

// queueLocked queues r, refused for refusal, to wait for capacity or
// quota, unless it is queued already, and returns what wakes it; past the
// bounds it returns why r is not queued instead of refusal.
func (s *Service) queueLocked(r *allocator.Request, since time.Time, refusal error) (wake chan struct{}, err error) {
	if w, queued := s.waiting[r]; queued {
		return w.wake, refusal
	}
	switch {
	case s.waitingIn[r.Namespace] >= s.cfg.MaxWaitingPerNamespace:
		return nil, &TooManyWaitingError{Refusal: refusal, Namespace: r.Namespace, Limit: "max-waiting-per-namespace", Waiting: s.waitingIn[r.Namespace]}
	case len(s.waiting) >= s.cfg.MaxWaiting:
		return nil, &TooManyWaitingError{Refusal: refusal, Limit: "max-waiting", Waiting: len(s.waiting)}
	}
	w := &waiter{since: since, shape: shapeOf(r), wake: make(chan struct{}, 1)}
	s.waiting[r] = w
	s.waitingIn[r.Namespace]++
	return w.wake, refusal
}

// notWaiting takes a request off the queue that Status shows.
func (s *Service) notWaiting(r *allocator.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, queued := s.waiting[r]; !queued {
		return
	}
	delete(s.waiting, r)
	if s.waitingIn[r.Namespace]--; s.waitingIn[r.Namespace] == 0 {
		delete(s.waitingIn, r.Namespace)
	}
}

func (s *Service) pendingCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}
