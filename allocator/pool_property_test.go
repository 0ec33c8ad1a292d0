package allocator

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/gpupool/gpupool/inventory"
)

// poolDriver turns a stream of bytes into pool operations, so the same
// driver serves the seeded property test and the fuzzer.
type poolDriver struct {
	t      *testing.T
	pool   *Pool
	policy Policy
	opts   PolicyOptions
	now    time.Time
	ids    []string
	// granted and expired count what the stream made happen, so a test can
	// tell that it exercised the pool.
	granted, expired int
}

// poolStart is the pool a stream starts on: the test cluster, or one of
// the pools a new or failing install has (no server, no healthy GPU, no
// server with a heartbeat), from which the stream's own registrations and
// heartbeats must bring it back.
type poolStart int

const (
	startServers poolStart = iota
	startEmpty
	startUnhealthy
	startSilent
	poolStarts
)

func (s poolStart) String() string {
	return [...]string{"servers", "empty", "unhealthy", "silent"}[s]
}

func newPoolDriver(t *testing.T, policy string, seed uint64, start poolStart) *poolDriver {
	opts := PolicyOptions{Seed: seed, Workload: Workload{
		{GPUs: 1, PerGPU: WholeGPU, CPUMilli: 8000, Weight: 0.5},
		{GPUs: 1, PerGPU: WholeGPU / 2, CPUMilli: 4000, Weight: 0.3},
		{GPUs: 2, PerGPU: WholeGPU, CPUMilli: 16000, Weight: 0.1},
		{CPUMilli: 2000, Weight: 0.1},
	}}
	pol, err := NewPolicy(policy, opts)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPool(PoolConfig{Policy: pol, DefaultTTL: time.Minute, MaxTTL: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	d := &poolDriver{t: t, pool: p, policy: pol, opts: opts, now: time.Unix(0, 0)}
	if start == startEmpty {
		return d
	}
	for i, model := range []string{"A100", "A100", "T4", "V100"} {
		srv := testServer(fmt.Sprintf("s%d", i), model, 2+2*(i%2), int64(16+8*i)<<30, 64000)
		switch model {
		case "A100": // s1's two PCIe switches, s0's one
			srv.SetTopology(inventory.PCIeTopology(len(srv.GPUs), 2, 1))
		case "V100":
			srv.SetTopology(inventory.NVSwitchTopology(len(srv.GPUs)))
		}
		for g := range srv.GPUs {
			srv.GPUs[g].Healthy = start != startUnhealthy
		}
		d.must(p.RegisterServer(srv))
		if start == startSilent {
			_, err := p.SetSchedulable(srv.Name, false)
			d.must(err)
		}
	}
	return d
}

func testServer(name, model string, gpus int, gpuMemory, cpu int64) inventory.Server {
	s := inventory.Server{Name: name, CPUMilli: cpu, MemoryBytes: 256 << 30}
	for g := range gpus {
		s.GPUs = append(s.GPUs, inventory.GPU{Index: g, UUID: fmt.Sprintf("GPU-%s-%d", name, g), Model: model, MemoryBytes: gpuMemory, Healthy: true})
	}
	return s
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
		if arg%11 == 0 {
			r.Servers = []string{"s1", "s3", "unknown"}
		}
		if arg%13 == 0 {
			r.UntilReleased, r.TTL = true, 0
		}
		if arg%17 == 0 {
			r.Topology = inventory.Link(arg/17) % (inventory.LinkNVLink + 1)
		}
		fits := d.pool.Fits(r)
		var l Lease
		l, err = d.pool.Acquire(d.now, r)
		var conflict *IdempotencyConflictError
		var field *FieldError
		// random draws another node for each; a memory request's quota
		// share depends on the GPU it lands on.
		if (fits == nil) != (err == nil) && d.policy.Name() != "random" && !errors.As(err, &conflict) && (!errors.As(err, &field) || field.Field != "ttl") {
			d.t.Fatalf("op %d arg %d: Fits says %v, Acquire %v", op%8, arg, fits, err)
		}
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
		d.must(d.pool.SetQuota([]string{"a", "b", "c"}[arg%3], SharePercent(float64(arg)*4)))
	case 7:
		servers := d.pool.Servers()
		var s inventory.Server
		if len(servers) > 0 {
			s = servers[int(arg)%len(servers)]
		}
		switch {
		case len(servers) == 0 || arg&0xc0 == 0xc0 && len(servers) < 12:
			// A new, larger server moves the fit policies' scale.
			// Its GPUs are on two sockets of two PCIe switches.
			srv := testServer(fmt.Sprint("n", len(servers)), "H100", 8, 80<<30, int64(64000+8000*len(servers)))
			srv.SetTopology(inventory.PCIeTopology(8, 2, 2))
			d.must(d.pool.RegisterServer(srv))
		case arg&0xc0 == 0x80:
			// New devices: refused while leases hold shares on the server.
			s.GPUs = append(s.GPUs, inventory.GPU{Index: len(s.GPUs), UUID: fmt.Sprint("GPU-new-", arg), Model: "T4", MemoryBytes: 16 << 30, Healthy: true})
			err = d.pool.RegisterServer(s)
		case arg&0x10 != 0:
			_, err = d.pool.SetSchedulable(s.Name, arg&0x20 != 0)
			d.must(err)
		default:
			// Heals or breaks every GPU (a heartbeat) or GPU 0 alone.
			for g := range s.GPUs {
				if g == 0 || arg&0x08 != 0 {
					s.GPUs[g].Healthy = arg&0x20 != 0
				}
			}
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
	d.checkCache(op, arg)
}

// checkCache compares the long-lived policy, with its cached ratings, to a
// fresh one with the same seed: a stale cache would place differently.
func (d *poolDriver) checkCache(op, arg byte) {
	d.t.Helper()
	if d.policy.Name() == "random" { // draws from its source on every call
		return
	}
	fresh, err := NewPolicy(d.policy.Name(), d.opts)
	if err != nil {
		d.t.Fatal(err)
	}
	c := d.pool.cluster
	some := &NodeSet{}
	some.add(1)
	some.add(2)
	t4, _ := c.ModelSetOf([]string{"T4"})
	t4OrV100, _ := c.ModelSetOf([]string{"T4", "V100"})
	for _, probe := range []Demand{{GPUs: 1, PerGPU: WholeGPU / 2, CPUMilli: 4000}, {GPUs: 2, PerGPU: WholeGPU}, {CPUMilli: 8000},
		{GPUs: 2, PerGPU: WholeGPU / 2, Link: inventory.LinkPCIeSwitch}, {GPUs: 3, PerGPU: WholeGPU, Link: inventory.LinkSocket},
		{GPUs: 1, PerGPU: WholeGPU / 2, CPUMilli: 4000, Nodes: some}, {GPUs: 1, PerGPU: WholeGPU / 2, CPUMilli: 4000, Models: t4},
		{GPUs: 1, PerGPU: WholeGPU, Models: t4OrV100}} {
		warmAt, warmOK := d.policy.Place(c, &probe)
		freshAt, freshOK := fresh.Place(c, &probe)
		if warmOK != freshOK || !reflect.DeepEqual(warmAt, freshAt) {
			d.t.Fatalf("op %d arg %d: %s with cached ratings places %+v at %v (%v), a fresh one at %v (%v)",
				op%8, arg, d.policy.Name(), probe, warmAt, warmOK, freshAt, freshOK)
		}
	}
}

// finish checks that the state restores into a new pool, then releases
// everything and checks that nothing leaked.
func (d *poolDriver) finish() {
	d.t.Helper()
	d.checkRestore()
	for _, l := range d.pool.Leases(d.now) {
		if _, err := d.pool.Release(d.now, l.ID); err != nil {
			d.t.Fatal(err)
		}
	}
	for _, st := range d.pool.ServerStates() {
		n := &st.Node
		for gi := range n.GPUs {
			if g := &n.GPUs[gi]; g.Free != WholeGPU || g.FreeBytes != g.MemoryBytes {
				d.t.Fatalf("server %s gpu %d leaks after all leases ended: free %s, %d of %d bytes",
					n.Name, gi, g.Free, g.FreeBytes, g.MemoryBytes)
			}
		}
		if n.CPUFree != n.CPUCap || n.MemFree != n.MemCap {
			d.t.Fatalf("server %s leaks host resources after all leases ended", n.Name)
		}
	}
	for _, q := range d.pool.Quotas(d.now) {
		if q.Used != 0 {
			d.t.Fatalf("namespace %s still uses %s after all leases ended", q.Namespace, q.Used)
		}
	}
}

// checkRestore rebuilds the pool from what a store keeps (servers, leases,
// the ID counter) and expects the same leases, quotas and free shares.
func (d *poolDriver) checkRestore() {
	d.t.Helper()
	p, err := NewPool(d.pool.cfg)
	d.must(err)
	for _, st := range d.pool.ServerStates() {
		d.must(p.RegisterServer(st.Server))
		_, err := p.SetSchedulable(st.Server.Name, st.Node.Schedulable)
		d.must(err)
	}
	for _, q := range d.pool.Quotas(d.now) {
		if q.Limited { // quotas come from the config file, not the store
			d.must(p.SetQuota(q.Namespace, q.Hard))
		}
	}
	leases := d.pool.Leases(d.now)
	for _, l := range leases {
		d.must(p.Restore(l))
	}
	p.SetNextID(d.pool.NextID())
	d.must(p.CheckInvariants())
	if !reflect.DeepEqual(p.Leases(d.now), d.pool.Leases(d.now)) || !reflect.DeepEqual(p.Quotas(d.now), d.pool.Quotas(d.now)) {
		d.t.Fatal("restored pool differs in leases or quotas")
	}
	for i := range p.cluster.Nodes {
		a, b := p.cluster.Nodes[i], d.pool.cluster.Nodes[i]
		a.Version, b.Version = 0, 0
		if !reflect.DeepEqual(a, b) {
			d.t.Fatalf("restored node %s = %+v, want %+v", a.Name, a, b)
		}
	}
	if len(leases) > 0 && p.Restore(leases[0]) == nil {
		d.t.Fatal("restoring a lease twice was accepted")
	}
}

// TestPoolProperties runs long seeded random operation sequences against
// every policy, from every start, and checks the invariants after each
// operation.
func TestPoolProperties(t *testing.T) {
	for _, policy := range PolicyNames() {
		for start := range poolStarts {
			t.Run(policy+"/"+start.String(), func(t *testing.T) {
				for seed := range uint64(5) {
					rng := rand.New(rand.NewPCG(seed, 7))
					d := newPoolDriver(t, policy, seed, start)
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
}

// FuzzPool drives the pool with arbitrary operation streams.
// Run with: go test ./allocator -fuzz FuzzPool
func FuzzPool(f *testing.F) {
	f.Add([]byte{0, 10, 0, 200, 3, 0, 5, 90, 0, 7})
	f.Add([]byte{6, 10, 0, 40, 0, 41, 0, 42, 4, 1, 5, 255, 7, 0x31})
	// Every policy from every start, each stream a first refusal.
	for i := range len(PolicyNames()) * int(poolStarts) {
		f.Add(append(make([]byte, i), 0, 1))
	}
	f.Fuzz(func(t *testing.T, ops []byte) {
		policies := len(PolicyNames())
		d := newPoolDriver(t, PolicyNames()[len(ops)%policies], uint64(len(ops)), poolStart(len(ops)/policies)%poolStarts)
		for i := 0; i+1 < len(ops); i += 2 {
			d.step(ops[i], ops[i+1])
		}
		d.finish()
	})
}
