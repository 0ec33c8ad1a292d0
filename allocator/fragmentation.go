package allocator

import (
	"cmp"
	"slices"
)

// TaskType is one kind of task in the workload a pool expects, with its
// share of all tasks.
type TaskType struct {
	GPUs     int
	PerGPU   Share // share of each GPU
	CPUMilli int64
	Models   ModelSet
	Weight   float64
}

// Workload is the mix of task types fragmentation is measured against.
// Weights sum to 1.
type Workload []TaskType

// minCPUMilli is what a task that asks for no CPU is counted as, as the
// Kubernetes scheduler does for scoring.
const minCPUMilli = 100

// TypicalWorkload groups demands into task types by (CPU, GPU count, share,
// models) and keeps the most frequent types until they cover the given
// fraction of all demands, as the FGD paper does (it uses 0.95), so that
// rare types do not cost every placement decision.
func TypicalWorkload(demands []Demand, coverage float64) Workload {
	counts := map[TaskType]int{}
	for _, d := range demands {
		t := TaskType{GPUs: d.GPUs, PerGPU: d.PerGPU, CPUMilli: max(d.CPUMilli, minCPUMilli), Models: d.Models}
		if d.GPUs == 0 {
			t.PerGPU = 0
		}
		counts[t]++
	}
	types := make(Workload, 0, len(counts))
	for t, n := range counts {
		t.Weight = float64(n)
		types = append(types, t)
	}
	// Most frequent first; larger tasks first among equals, so the cut is
	// the same on every run.
	slices.SortFunc(types, func(a, b TaskType) int {
		return cmp.Or(cmp.Compare(b.Weight, a.Weight), cmp.Compare(b.CPUMilli, a.CPUMilli),
			cmp.Compare(b.PerGPU, a.PerGPU), cmp.Compare(b.GPUs, a.GPUs), cmp.Compare(b.Models, a.Models))
	})
	var kept, total float64
	for i := range types {
		total += types[i].Weight
	}
	for i := range types {
		kept += types[i].Weight
		if kept >= coverage*total {
			types = types[:i+1]
			break
		}
	}
	for i := range types {
		types[i].Weight /= kept
	}
	return types
}

// Fragmentation is FGD's measure of how much of n's free GPU share the
// expected workload cannot use, in milli-GPUs: for each task type, the free
// share of the GPUs that cannot hold one such task, or all of n's free
// share when the task cannot run on n at all (too little CPU, not enough
// GPUs, wrong model, or no GPU asked), weighted by the type's share.
// Host memory is left out, as in the paper.
func (w Workload) Fragmentation(n *Node) float64 {
	free := n.FreeShare()
	if free == 0 {
		return 0
	}
	var f float64
	for i := range w {
		f += w[i].Weight * float64(w[i].fragment(n, free))
	}
	return f
}

// fragment is the free share of n that one task of type t cannot use.
func (t *TaskType) fragment(n *Node, free Share) Share {
	if t.GPUs == 0 || !n.Schedulable || !t.Models.allows(n.Models) ||
		n.CPUCap > 0 && n.CPUFree < t.CPUMilli {
		return free
	}
	fits, stranded := 0, Share(0)
	for i := range n.GPUs {
		g := &n.GPUs[i]
		switch {
		case !g.Healthy:
		case g.Free >= t.PerGPU && t.Models.allows(g.Model):
			fits++
		default:
			stranded += g.Free
		}
	}
	if fits < t.GPUs {
		return free
	}
	return stranded
}

// CPUPerMilli is the CPU (milli-cores) the workload's GPU tasks ask per
// milli-GPU, on average; zero when it has no GPU tasks.
func (w Workload) CPUPerMilli() float64 {
	var cpu, gpu float64
	for i := range w {
		if w[i].GPUs > 0 {
			cpu += w[i].Weight * float64(w[i].CPUMilli)
			gpu += w[i].Weight * float64(w[i].GPUs) * float64(w[i].PerGPU)
		}
	}
	if gpu == 0 {
		return 0
	}
	return cpu / gpu
}

// oneGPUShare is the part of the workload's GPU share that one-GPU tasks
// ask; zero when it has no GPU tasks.
func (w Workload) oneGPUShare() float64 {
	var one, all float64
	for i := range w {
		share := w[i].Weight * float64(w[i].GPUs) * float64(w[i].PerGPU)
		all += share
		if w[i].GPUs == 1 {
			one += share
		}
	}
	if all == 0 {
		return 0
	}
	return one / all
}
