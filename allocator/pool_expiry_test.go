package allocator

import (
	"fmt"
	"testing"
	"time"
)

// TestExpiryQueueGrowsWithLeasesNotChurn: leases released or renewed long
// before their time leave entries in the expiry queue, which must not
// grow with the churn, and the leases still live expire when due, each
// once.
func TestExpiryQueueGrowsWithLeasesNotChurn(t *testing.T) {
	pol, err := NewPolicy("best-fit", PolicyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPool(PoolConfig{Policy: pol, DefaultTTL: time.Minute, MaxTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.RegisterServer(testServer("s0", "A100", 8, 80<<30, 96000)); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 0)
	hour := Request{Namespace: "default", GPUs: 1, Percent: 10, TTL: time.Hour}
	var kept []string
	for range 10 {
		l, err := p.Acquire(now, hour)
		if err != nil {
			t.Fatal(err)
		}
		kept = append(kept, l.ID)
	}
	for i := range 5000 {
		now = now.Add(time.Millisecond)
		l, err := p.Acquire(now, hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Release(now, l.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Renew(now, kept[i%len(kept)], 0); err != nil {
			t.Fatal(err)
		}
		if limit := 2*len(p.leases) + 64 + 2; len(p.expiries) > limit {
			t.Fatalf("after %d leases released: %d entries queued for %d live leases, more than %d", i+1, len(p.expiries), len(p.leases), limit)
		}
	}
	expired := p.Expire(now.Add(time.Hour))
	if got := fmt.Sprint(leaseIDs(expired)); got != fmt.Sprint(kept) {
		t.Errorf("an hour on, expired %v, want the kept leases %v, each once", got, kept)
	}
}

func leaseIDs(leases []Lease) []string {
	ids := make([]string, len(leases))
	for i, l := range leases {
		ids[i] = l.ID
	}
	return ids
}
