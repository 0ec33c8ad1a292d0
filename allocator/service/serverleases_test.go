package service

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
)

// TestServerLeasesFollowThePool acquires, renews, releases and lets expire
// leases at random on three servers, with a restart in the middle, and
// checks after each step that each server's leases (what its daemon lists,
// and the count its status shows) are the pool's leases on that server.
func TestServerLeasesFollowThePool(t *testing.T) {
	dir, clock := t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}
	a := startAllocator(t, dir, clock, nil)
	ctx := context.Background()
	servers := []string{"s1", "s2", "s3"}
	for _, name := range servers {
		if err := a.svc.RegisterServer(ctx, gpuServer(name, 4).Core()); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var held []string
	for step := range 300 {
		if step == 150 {
			a.close()
			a = startAllocator(t, dir, clock, nil)
		}
		switch op := rng.IntN(10); {
		case op < 4 || len(held) == 0:
			r := allocator.Request{Namespace: "team-a", GPUs: 1, Percent: 10, Servers: []string{servers[rng.IntN(len(servers))]},
				TTL: time.Duration(1+rng.IntN(20)) * time.Second, UntilReleased: op == 3}
			if r.UntilReleased {
				r.TTL = 0
			}
			if l, err := a.svc.Acquire(ctx, r, 0); err == nil {
				held = append(held, l.ID)
			}
		case op < 6:
			_, _ = a.svc.Renew(ctx, Principal{Admin: true}, held[rng.IntN(len(held))], 0)
		case op < 8:
			i := rng.IntN(len(held))
			_, _ = a.svc.Release(ctx, Principal{Admin: true}, held[i])
			held = slices.Delete(held, i, i+1)
		default:
			clock.Add(time.Duration(rng.IntN(3000)) * time.Millisecond) // some run out, to be ended by a later write
		}
		all := a.svc.Leases(LeaseFilter{})
		for _, name := range servers {
			var want []string
			for _, l := range all {
				if l.Server == name {
					want = append(want, l.ID+"@"+l.ExpiresAt.String())
				}
			}
			var got []string
			for _, l := range a.svc.Leases(LeaseFilter{Server: name}) {
				got = append(got, l.ID+"@"+l.ExpiresAt.String())
			}
			status, err := a.svc.Server(name)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(want) || status.Leases != len(want) {
				t.Fatalf("step %d: server %s lists %v and counts %d; the pool holds %v there", step, name, got, status.Leases, want)
			}
		}
	}
}
