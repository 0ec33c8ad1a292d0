package service

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
)

// TestAcquireBeforeDurable: the grant is answered while its write is held;
// the same request asked durably answers the same lease, only once the
// write is done.
func TestAcquireBeforeDurable(t *testing.T) {
	svc, st := newFailingService(t, Config{})
	held := make(chan struct{})
	st.mu.Lock()
	st.held = held
	st.mu.Unlock()
	ctx := context.Background()
	req := allocator.Request{Namespace: "ml", GPUs: 1, IdempotencyKey: "pod-1"}

	earlyCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	early, err := svc.AcquireBeforeDurable(earlyCtx, req, 0)
	if err != nil {
		t.Fatalf("acquire before durable, the store's write held: %v; want the grant at once", err)
	}
	confirmed := make(chan allocator.Lease)
	go func() {
		l, err := svc.Acquire(ctx, req, 0)
		if err != nil {
			t.Errorf("the same request, durable: %v", err)
		}
		confirmed <- l
	}()
	select {
	case l := <-confirmed:
		t.Fatalf("the durable answer (%s) came while the write was held", l.ID)
	case <-time.After(100 * time.Millisecond):
	}
	close(held)
	if l := <-confirmed; l.ID != early.ID {
		t.Errorf("the durable answer is lease %s, want the early grant's %s", l.ID, early.ID)
	}
	if held := svc.Leases(LeaseFilter{Namespace: "ml"}); len(held) != 1 {
		t.Errorf("%d leases held, want the one grant", len(held))
	}
}

// TestAcquireBeforeDurableLostWrite: a grant answered early whose write
// fails is never confirmed: asking durably fails, so no caller acts on a
// lease the store does not hold.
func TestAcquireBeforeDurableLostWrite(t *testing.T) {
	svc, st := newFailingService(t, Config{})
	st.mu.Lock()
	st.failing = true
	st.mu.Unlock()
	ctx := context.Background()
	req := allocator.Request{Namespace: "ml", GPUs: 1, IdempotencyKey: "pod-1"}
	if _, err := svc.AcquireBeforeDurable(ctx, req, 0); err != nil {
		t.Fatalf("acquire before durable: %v, want the grant (its write fails later)", err)
	}
	if l, err := svc.Acquire(ctx, req, 0); !errors.Is(err, errUnavailable) {
		t.Errorf("the same request, durable, after the write failed: lease %q, %v; want unavailable", l.ID, err)
	}
}
