package allocator

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// poolDriver turns a stream of bytes into pool operations, so the same
// driver serves the seeded property test and the fuzzer.
type poolDriver struct {
	t    *testing.T
	pool *Pool
	now  time.Time
	ids  []string
	// granted and expired count what the stream made happen, so a test can
	// tell that it exercised the pool.
	granted, expired int
}

func newPoolDriver(t *testing.T, policy string, seed uint64) *poolDriver {
	pol, err := NewPolicy(policy, PolicyOptions{Seed: seed, Workload: Workload{
		{GPUs: 1, Milli: 1000, CPUMilli: 8000, Weight: 0.5},
		{GPUs: 1, Milli: 500, CPUMilli: 4000, Weight: 0.3},
		{GPUs: 2, Milli: 1000, CPUMilli: 16000, Weight: 0.1},
		{CPUMilli: 2000, Weight: 0.1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPool(PoolConfig{Policy: pol, DefaultTTL: time.Minute, MaxTTL: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	d := &poolDriver{t: t, pool: p, now: time.Unix(0, 0)}
	for i, model := range []string{"A100", "A100", "T4", "V100"} {
		gpus := []GPU{}
		for g := range 2 + 2*(i%2) {
			gpus = append(gpus, GPU{Index: g, UUID: fmt.Sprintf("GPU-%d-%d", i, g), Model: model, MemoryBytes: 16 << 30, Healthy: true})
		}
		d.must(p.RegisterServer(Server{Name: fmt.Sprintf("s%d", i), CPUMilli: 64000, MemoryBytes: 256 << 30, GPUs: gpus}))
	}
	return d
}

func (d *poolDriver) must(err error) {
	d.t.Helper()
	if err != nil {
		d.t.Fatal(err)
	}
}

// step applies the operation that op and arg select and checks the
// invariants; expected rejections (no capacity, quota) are fine.
func (d *poolDriver) step(op, arg byte) {
	d.t.Helper()
	var err error
	switch op % 8 {
	case 0, 1, 2:
		r := Request{Namespace: []string{"a", "b", "c"}[arg%3], GPUs: int(arg>>2) % 4, CPUMilli: int64(arg%5) * 4000,
			MemoryBytes: int64(arg%3) << 30, TTL: time.Duration(arg%4) * 30 * time.Second}
		switch {
		case r.GPUs == 0:
			r.CPUMilli += 1000
		case arg%2 == 0:
			r.Percent = int(arg)%100 + 1
		case arg%3 == 0:
			r.GPUMemoryBytes = int64(arg) << 26
		}
		if arg%7 == 0 {
			r.Models = []string{"T4"}
		}
		if arg%5 == 0 {
			r.IdempotencyKey = fmt.Sprint("k", arg%4)
		}
		var l Lease
		l, err = d.pool.Acquire(d.now, r)
		if err == nil {
			d.ids = append(d.ids, l.ID)
			d.granted++
		}
	case 3:
		if len(d.ids) > 0 {
			_, err = d.pool.Release(d.now, d.ids[int(arg)%len(d.ids)])
		}
	case 4:
		if len(d.ids) > 0 {
			_, err = d.pool.Renew(d.now, d.ids[int(arg)%len(d.ids)], time.Duration(arg%3)*time.Minute)
		}
	case 5:
		d.now = d.now.Add(time.Duration(arg) * time.Second)
		d.expired += len(d.pool.Expire(d.now))
	case 6:
		d.must(d.pool.SetQuota([]string{"a", "b", "c"}[arg%3], int64(arg)*4))
	case 7:
		server := fmt.Sprintf("s%d", arg%4)
		if arg&0x10 != 0 {
			d.must(d.pool.SetSchedulable(server, arg&0x20 != 0))
		} else {
			s := d.pool.Servers()[arg%4]
			s.GPUs[0].Healthy = arg&0x20 != 0
			d.must(d.pool.RegisterServer(s))
		}
	}
	var field *FieldError
	var quota *QuotaExceededError
	var capacity *NoCapacityError
	var notFound *LeaseNotFoundError
	var conflict *IdempotencyConflictError
	if err != nil && !errors.As(err, &field) && !errors.As(err, &quota) && !errors.As(err, &capacity) &&
		!errors.As(err, &notFound) && !errors.As(err, &conflict) {
		d.t.Fatalf("op %d arg %d: untyped error %v", op%8, arg, err)
	}
	if err := d.pool.CheckInvariants(); err != nil {
		d.t.Fatalf("op %d arg %d: %v", op%8, arg, err)
	}
}

// finish releases everything and checks that nothing leaked.
func (d *poolDriver) finish() {
	d.t.Helper()
	for _, l := range d.pool.Leases() {
		if _, err := d.pool.Release(d.now, l.ID); err != nil {
			d.t.Fatal(err)
		}
	}
	c := d.pool.Cluster()
	for i := range c.Nodes {
		n := &c.Nodes[i]
		for gi := range n.GPUs {
			if g := &n.GPUs[gi]; g.Free != MilliPerGPU || g.FreeBytes != g.MemoryBytes {
				d.t.Fatalf("server %s gpu %d leaks after all leases ended: free %d milli, %d of %d bytes",
					n.Name, gi, g.Free, g.FreeBytes, g.MemoryBytes)
			}
		}
		if n.CPUFree != n.CPUCap || n.MemFree != n.MemCap {
			d.t.Fatalf("server %s leaks host resources after all leases ended", n.Name)
		}
	}
	for _, q := range d.pool.Quotas() {
		if q.Used != 0 {
			d.t.Fatalf("namespace %s still uses %v%% after all leases ended", q.Namespace, q.Used)
		}
	}
}

// TestPoolProperties runs long seeded random operation sequences against
// every policy and checks the invariants after each operation.
func TestPoolProperties(t *testing.T) {
	for _, policy := range PolicyNames() {
		t.Run(policy, func(t *testing.T) {
			for seed := range uint64(5) {
				rng := rand.New(rand.NewPCG(seed, 7))
				d := newPoolDriver(t, policy, seed)
				for range 3000 {
					d.step(byte(rng.IntN(256)), byte(rng.IntN(256)))
				}
				if d.granted < 100 || d.expired < 10 {
					t.Fatalf("seed %d: the stream granted %d leases and expired %d: too few to test anything", seed, d.granted, d.expired)
				}
				d.finish()
			}
		})
	}
}

// FuzzPool drives the pool with arbitrary operation streams.
// Run with: go test ./allocator -fuzz FuzzPool
func FuzzPool(f *testing.F) {
	f.Add([]byte{0, 10, 0, 200, 3, 0, 5, 90, 0, 7})
	f.Add([]byte{6, 10, 0, 40, 0, 41, 0, 42, 4, 1, 5, 255, 7, 0x31})
	f.Fuzz(func(t *testing.T, ops []byte) {
		d := newPoolDriver(t, PolicyNames()[len(ops)%len(PolicyNames())], uint64(len(ops)))
		for i := 0; i+1 < len(ops); i += 2 {
			d.step(ops[i], ops[i+1])
		}
		d.finish()
	})
}
