package allocator

import (
	"fmt"
	"maps"
)

// CheckInvariants recomputes what the pool's bookkeeping must equal from
// its live leases and reports the first mismatch: per GPU, leased share at
// most the whole GPU and leased memory at most its capacity, free share and
// memory equal to capacity less the leases, host CPU and memory likewise,
// quota use equal to the sum of the namespace's leases, and idempotency
// keys pointing at live leases. Tests call it after every operation.
func (p *Pool) CheckInvariants() error {
	type gpuUse struct {
		share Share
		bytes int64
	}
	gpus := make([][]gpuUse, len(p.cluster.Nodes))
	cpu := make([]int64, len(p.cluster.Nodes))
	mem := make([]int64, len(p.cluster.Nodes))
	used := map[string]Share{}
	for i := range p.cluster.Nodes {
		gpus[i] = make([]gpuUse, len(p.cluster.Nodes[i].GPUs))
	}
	for id, l := range p.leases {
		i, ok := p.nodeIndex[l.Server]
		if !ok {
			return fmt.Errorf("lease %s is on unknown server %s", id, l.Server)
		}
		for _, g := range l.GPUs {
			gpus[i][g.Index].share += g.Share
			gpus[i][g.Index].bytes += g.MemoryBytes
		}
		cpu[i] += l.CPUMilli
		mem[i] += l.MemoryBytes
		if q := l.Share(); q > 0 {
			used[l.Namespace] += q
		}
		if k := l.Request.IdempotencyKey; k != "" && p.byKey[l.Namespace+"/"+k] != id {
			return fmt.Errorf("lease %s: idempotency key %q is not indexed", id, k)
		}
	}
	for i := range p.cluster.Nodes {
		n := &p.cluster.Nodes[i]
		for gi := range n.GPUs {
			g, u := &n.GPUs[gi], gpus[i][gi]
			switch {
			case u.share > WholeGPU:
				return fmt.Errorf("server %s gpu %d: leased %s, more than the whole GPU", n.Name, gi, u.share)
			case g.MemoryBytes > 0 && u.bytes > g.MemoryBytes:
				return fmt.Errorf("server %s gpu %d: leased %d bytes of %d", n.Name, gi, u.bytes, g.MemoryBytes)
			case g.Free != WholeGPU-u.share:
				return fmt.Errorf("server %s gpu %d: free %s, leases leave %s", n.Name, gi, g.Free, WholeGPU-u.share)
			case g.FreeBytes != g.MemoryBytes-u.bytes:
				return fmt.Errorf("server %s gpu %d: free %d bytes, leases leave %d", n.Name, gi, g.FreeBytes, g.MemoryBytes-u.bytes)
			}
		}
		if n.CPUFree != n.CPUCap-cpu[i] || n.MemFree != n.MemCap-mem[i] {
			return fmt.Errorf("server %s: free CPU %d and memory %d, leases leave %d and %d",
				n.Name, n.CPUFree, n.MemFree, n.CPUCap-cpu[i], n.MemCap-mem[i])
		}
	}
	// Namespaces appear in p.used while they hold GPU share, and only then.
	if !maps.Equal(used, p.used) {
		return fmt.Errorf("quota use per namespace %v, leases sum to %v", p.used, used)
	}
	for key, id := range p.byKey {
		if _, ok := p.leases[id]; !ok {
			return fmt.Errorf("idempotency key %s points at ended lease %s", key, id)
		}
	}
	return nil
}
