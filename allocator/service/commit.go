package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpupool/gpupool/allocator/store"
)

// committer writes changes in the order they were made, all that are
// waiting per sync (group commit). After a failed write it writes nothing
// more: a later change may depend on one that was lost.
func (s *Service) committer() {
	defer close(s.committerDone)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-s.closing; cancel() }()
	var changes []store.Change
	for {
		select {
		case <-s.kick:
		case <-s.closing:
			s.answerQueued(errUnavailable)
			return
		}
		batch := s.takeQueued()
		if len(batch) == 0 {
			continue
		}
		if s.broken.Load() {
			answer(batch, errUnavailable)
			continue
		}
		changes = changes[:0]
		for _, c := range batch {
			changes = append(changes, c.change)
		}
		// Not a request's context: a batch serves many requests and must
		// finish even when the one that queued first gave up.
		err := s.applyRetrying(ctx, changes)
		if err != nil {
			s.fail(fmt.Errorf("%s store: %w", s.cfg.Store.Name(), err))
		}
		answer(batch, err)
	}
}

// applyRetrying applies a batch, again while the store says the error may
// pass, for up to StoreRetry. Applying it again is safe: a batch is whole
// records put and deleted, and nothing else is written meanwhile.
func (s *Service) applyRetrying(ctx context.Context, changes []store.Change) error {
	giveUp := time.Now().Add(s.cfg.StoreRetry)
	backoff := 50 * time.Millisecond
	for {
		start := time.Now()
		err := s.cfg.Store.Apply(ctx, changes)
		s.metrics.storeApply.Observe(time.Since(start).Seconds())
		if err == nil {
			return nil
		}
		s.metrics.storeErrors.Inc()
		if !errors.Is(err, store.ErrUnavailable) || time.Now().Add(backoff).After(giveUp) {
			return err
		}
		s.log.Warn("store unavailable; retrying the batch", "err", err, "retry_in", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return ctx.Err()
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

func (s *Service) takeQueued() []commit {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	batch := s.queued
	s.queued = nil
	return batch
}

func (s *Service) answerQueued(err error) { answer(s.takeQueued(), err) }

func answer(batch []commit, err error) {
	for _, c := range batch {
		c.done <- err
	}
}

// fail marks the service broken; it takes no lock, so the committer can
// call it whatever the request paths hold.
func (s *Service) fail(err error) {
	s.failOnce.Do(func() {
		s.broken.Store(true)
		s.log.Error("this allocator serves no more until it recovers from the store", "err", err)
		close(s.failed)
	})
}

// queue hands a change to the committer; it must be called with s.mu held
// so that changes reach the store in the order they were made. It never
// blocks.
func (s *Service) queue(c store.Change) chan error {
	done := make(chan error, 1)
	s.qmu.Lock()
	s.queued = append(s.queued, commit{change: c, done: done})
	s.qmu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default: // the committer is already due to look
	}
	return done
}

// durable waits for a queued change to be written.
func durable(ctx context.Context, done chan error) error {
	select {
	case err := <-done:
		if err != nil {
			return errUnavailable
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
