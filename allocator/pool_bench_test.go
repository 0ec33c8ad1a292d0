package allocator

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkAcquireAmongLeases times an acquire and its release in a pool
// as full as the Kubernetes scale test leaves it: 8,000 leases on 1,000
// servers, held until released as pods' leases are. Every call of the
// pool first looks for leases due to expire, which must stay cheap with
// that many live.
func BenchmarkAcquireAmongLeases(b *testing.B) {
	const servers, leases = 1000, 8000
	pol, err := NewPolicy("best-fit", PolicyOptions{})
	if err != nil {
		b.Fatal(err)
	}
	p, err := NewPool(PoolConfig{Policy: pol, DefaultTTL: time.Minute, MaxTTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	for i := range servers {
		if err := p.RegisterServer(testServer(fmt.Sprintf("s%04d", i), "A100", 8, 80<<30, 96000)); err != nil {
			b.Fatal(err)
		}
	}
	now := time.Unix(0, 0)
	tenth := Request{Namespace: "default", GPUs: 1, Percent: 10, CPUMilli: 1000, UntilReleased: true}
	for range leases {
		if _, err := p.Acquire(now, tenth); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		l, err := p.Acquire(now, tenth)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Release(now, l.ID); err != nil {
			b.Fatal(err)
		}
	}
}
