package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/internal/etcdtest"
)

func openLeadingEtcd(t *testing.T, endpoint, id string) *Etcd {
	t.Helper()
	e, err := OpenEtcd(context.Background(), []string{endpoint}, "/test", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	if err := e.Campaign(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	return e
}

func leaseChange(id string) []Change {
	return []Change{{Leases: []allocator.Lease{{ID: id, Namespace: "ml", Server: "s1",
		GPUs: []allocator.LeaseGPU{{UUID: "GPU-1", Model: "A100", Share: 500}}}}, NextID: 1}}
}

func storedLeases(t *testing.T, e *Etcd) []string {
	t.Helper()
	st, err := e.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, l := range st.Leases {
		ids = append(ids, l.ID)
	}
	return ids
}

// TestEtcdWriteRetriedOrLateAppliesOnce: a write whose answer was lost is
// retried and counts as done, and an attempt that reaches etcd after later
// writes (a member that was frozen with it) changes nothing: the lease a
// later write ended does not come back.
func TestEtcdWriteRetriedOrLateAppliesOnce(t *testing.T) {
	e := openLeadingEtcd(t, etcdtest.Start(t), "a")
	ctx := context.Background()
	before := e.committed
	if err := e.Apply(ctx, leaseChange("l1")); err != nil {
		t.Fatal(err)
	}
	late := *e
	late.committed = before // an attempt of that write, still in flight
	e.committed = before    // its answer lost: the committer retries
	if err := e.Apply(ctx, leaseChange("l1")); err != nil {
		t.Fatalf("retrying a write that committed: %v", err)
	}
	if err := e.Apply(ctx, []Change{{Ended: []string{"l1"}}}); err != nil {
		t.Fatalf("the write after the retried one: %v", err)
	}
	if err := late.Apply(ctx, leaseChange("l1")); err != nil {
		t.Fatalf("the late attempt: %v", err)
	}
	if ids := storedLeases(t, e); len(ids) != 0 {
		t.Errorf("stored leases %v after the late attempt, want none: it came after l1 ended", ids)
	}
}

// TestEtcdLeadershipComesBack: a replica that stepped down or whose session
// ended writes nothing, and campaigns again in a new session; the other
// takes over meanwhile.
func TestEtcdLeadershipComesBack(t *testing.T) {
	endpoint := etcdtest.Start(t)
	ctx := context.Background()
	a := openLeadingEtcd(t, endpoint, "a")
	b, err := OpenEtcd(ctx, []string{endpoint}, "/test", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	campaign := func(e *Etcd, id string) chan error {
		done := make(chan error, 1)
		go func() { done <- e.Campaign(ctx, id) }()
		return done
	}
	bLeads := campaign(b, "b")
	if err := a.StepDown(); err != nil {
		t.Fatal(err)
	}
	if err := <-bLeads; err != nil {
		t.Fatalf("b campaigning: %v", err)
	}
	if err := a.Apply(ctx, leaseChange("from-a")); !errors.Is(err, ErrNotLeader) {
		t.Errorf("a wrote after stepping down: %v, want ErrNotLeader", err)
	}
	if err := b.Apply(ctx, leaseChange("l1")); err != nil {
		t.Fatalf("b leading: %v", err)
	}
	aLeads := campaign(a, "a")
	if _, err := b.cli.Revoke(ctx, b.session.Lease()); err != nil { // b's session ends
		t.Fatal(err)
	}
	select {
	case <-b.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("Lost() not closed after b's session ended")
	}
	if err := <-aLeads; err != nil {
		t.Fatalf("a campaigning again: %v", err)
	}
	if err := b.Apply(ctx, leaseChange("from-b")); !errors.Is(err, ErrNotLeader) {
		t.Errorf("b wrote after its session ended: %v, want ErrNotLeader", err)
	}
	if err := a.Apply(ctx, []Change{{Ended: []string{"l1"}}}); err != nil {
		t.Fatalf("a leading again: %v", err)
	}
	bAgain := campaign(b, "b")
	if err := a.StepDown(); err != nil {
		t.Fatal(err)
	}
	if err := <-bAgain; err != nil {
		t.Fatalf("b campaigning in a new session: %v", err)
	}
	if err := b.Apply(ctx, leaseChange("l2")); err != nil {
		t.Fatalf("b leading again: %v", err)
	}
	if ids := storedLeases(t, b); len(ids) != 1 || ids[0] != "l2" {
		t.Errorf("stored leases %v, want [l2]: only the leaders' writes", ids)
	}
}
