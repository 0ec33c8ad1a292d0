package allocator

// WorkloadEstimate is the workload a live allocator expects, learnt from
// what it grants: the typical task types of its last EstimateWindow
// grants. The FGD-family policies measure fragmentation against it.
//
// It is rebuilt after the 1st, 2nd, 4th, ... grant until the window is
// full, then every estimateEvery grants. Rebuilding only every 1,024
// grants, as the allocator first did, left a fresh allocator placing its
// first thousand pods against no workload at all, which cost the OpenB
// replay 0.11-0.28 points of GPU share on five arrival orders (against
// the trace's own task types); this schedule costs -0.03 to +0.05
// (docs/design.md, "The workload a live allocator expects").
type WorkloadEstimate struct {
	recent  []Demand // ring of the last EstimateWindow grants' shapes
	next    int      // where the next grant goes in recent
	seen    int      // grants recorded in all
	current Workload
}

// EstimateWindow is how many of the latest grants make up the estimate.
const EstimateWindow = 4096

// estimateEvery is how often, in grants, a full window is rebuilt.
const estimateEvery = 1024

// estimateCoverage is the share of grants the kept task types cover, as
// in the FGD paper.
const estimateCoverage = 0.95

// Add records a grant's shape and says whether the estimate was rebuilt,
// so that the policies measuring against it must be too.
func (e *WorkloadEstimate) Add(d Demand) bool {
	e.record(d)
	if due := e.seen <= EstimateWindow && e.seen&(e.seen-1) == 0 || e.seen%estimateEvery == 0; !due {
		return false
	}
	e.current = TypicalWorkload(e.recent, estimateCoverage)
	return true
}

// Seed records grants made before this estimate existed (the leases a
// recovering allocator finds), oldest first, and rebuilds it once; it
// says whether there were any.
func (e *WorkloadEstimate) Seed(ds []Demand) bool {
	for _, d := range ds {
		e.record(d)
	}
	if len(ds) == 0 {
		return false
	}
	e.current = TypicalWorkload(e.recent, estimateCoverage)
	return true
}

func (e *WorkloadEstimate) record(d Demand) {
	shape := Demand{GPUs: d.GPUs, PerGPU: d.PerGPU, CPUMilli: d.CPUMilli, Models: d.Models}
	if len(e.recent) < EstimateWindow {
		e.recent = append(e.recent, shape)
	} else {
		e.recent[e.next] = shape
	}
	e.next = (e.next + 1) % EstimateWindow
	e.seen++
}

// Current is the workload as last rebuilt; nil before any grant. It is
// never changed in place, so it may be read after the estimate moves on.
func (e *WorkloadEstimate) Current() Workload { return e.current }

// GrantedShape is the shape a lease stands for in the estimate: its GPU
// count, the share it got of each (a request by memory counts by the
// share it was given) and its CPU.
func GrantedShape(l *Lease) Demand {
	d := Demand{GPUs: len(l.GPUs), CPUMilli: l.CPUMilli}
	if len(l.GPUs) > 0 {
		d.PerGPU = l.GPUs[0].Share
	}
	return d
}
