package service

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
)

// TestCandidateServers: a request that names its candidate servers, as
// the Kubernetes scheduler extender sends them, lands on one of them; a
// retry with the same key returns the lease while its server is among the
// retry's candidates; a pod's lease is found by the pod's UID.
func TestCandidateServers(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, nil)
	ctx := context.Background()
	admin := a.client(t, adminToken)
	for _, s := range []string{"s1", "s2"} {
		if err := admin.RegisterServer(ctx, gpuServer(s, 2)); err != nil {
			t.Fatal(err)
		}
	}
	pod := api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 50, Servers: []string{"node-0", "s2"},
		Owner: api.Owner{Pod: "train-0", UID: "uid-0"}, IdempotencyKey: "uid-0", UntilReleased: true}
	l, err := admin.Acquire(ctx, pod)
	if err != nil || l.Server != "s2" {
		t.Fatalf("acquired %+v (%v), want a lease on s2, the only registered candidate", l, err)
	}
	bind := pod
	bind.Servers = []string{"s2"}
	if again, err := admin.Acquire(ctx, bind); err != nil || again.ID != l.ID {
		t.Errorf("retry pinned to the lease's server: %s (%v), want %s", again.ID, err, l.ID)
	}
	elsewhere := pod
	elsewhere.Servers = []string{"s1"}
	if _, err := admin.Acquire(ctx, elsewhere); !client.IsReason(err, api.ReasonConflict) || !strings.Contains(err.Error(), "not among the servers asked") {
		t.Errorf("retry whose candidates leave out the lease's server: %v, want a Conflict saying so", err)
	}
	if _, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, Servers: []string{"node-0", "node-1"}}); !client.IsReason(err, api.ReasonNoCapacity) ||
		!strings.Contains(err.Error(), "among the 2 servers asked (2 not registered)") {
		t.Errorf("only unknown candidates: %v, want NoCapacity saying so", err)
	}
	if _, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, Owner: api.Owner{UID: "uid-1"}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*client.Client{admin, a.client(t, teamAToken)} {
		found, err := c.Leases(ctx, client.LeaseFilter{OwnerUID: "uid-0"})
		if err != nil || len(found) != 1 || found[0].ID != l.ID {
			t.Errorf("leases of owner uid-0: %v (%v), want only %s", found, err, l.ID)
		}
	}
}

// TestUntilReleasedLeaseSurvivesRestart: a lease that lives until released
// has no expiry to renew, outlives any TTL and a restart of the allocator,
// and ends when released.
func TestUntilReleasedLeaseSurvivesRestart(t *testing.T) {
	dir, clock := t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}
	a := startAllocator(t, dir, clock, nil)
	ctx := context.Background()
	admin := a.client(t, adminToken)
	if err := admin.RegisterServer(ctx, gpuServer("s1", 1)); err != nil {
		t.Fatal(err)
	}
	pod := api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 40, IdempotencyKey: "uid-0", UntilReleased: true}
	l, err := admin.Acquire(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if !l.UntilReleased || !l.ExpiresAt.IsZero() || l.TTL != 0 {
		t.Fatalf("lease %+v: want untilReleased, without TTL or expiry", l)
	}
	if renewed, err := admin.Renew(ctx, l.ID, time.Minute); err != nil || !renewed.UntilReleased || !renewed.ExpiresAt.IsZero() {
		t.Errorf("renewed: %+v (%v), want it unchanged", renewed, err)
	}
	clock.Add(1000 * time.Hour) // past the max TTL many times over
	a.svc.tick()
	a.close()

	b := startAllocator(t, dir, clock, nil)
	admin = b.client(t, adminToken)
	back, err := admin.Lease(ctx, l.ID)
	if err != nil || !back.UntilReleased || back.Server != l.Server {
		t.Fatalf("after 1000h and a restart: %+v (%v), want %s until released", back, err, l.ID)
	}
	if retry, err := admin.Acquire(ctx, pod); err != nil || retry.ID != l.ID {
		t.Errorf("retry after the restart: %s (%v), want %s", retry.ID, err, l.ID)
	}
	if err := admin.Release(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Lease(ctx, l.ID); !client.IsReason(err, api.ReasonNotFound) {
		t.Errorf("after the release: %v, want NotFound", err)
	}
}
