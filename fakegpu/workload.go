package fakegpu

import (
	"fmt"
	"os"
	"sync"
	"time"

	klabels "k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/gpupool/gpupool/allocator"
)

// Workload is work that spreads evenly over the leases of its owners, the
// way a data-parallel training job's fixed work spreads over its replicas:
// add a replica and each one is less busy. It drives simulated GPUs so
// that autoscaling closes the loop as it would on real ones.
type Workload struct {
	Namespace string `json:"namespace"`
	// Selector picks the leases by their owner pod's labels (app=tf-training).
	Selector string `json:"selector"`
	// GPUs is how many GPUs the work keeps busy in all (1.5 = one and a half).
	GPUs float64 `json:"gpus"`
}

// WorkloadFile reads workloads from a YAML list in a file, again whenever
// the file changes, so a test or an operator can step the load.
type WorkloadFile struct {
	Path string

	mu        sync.Mutex
	modified  time.Time
	workloads []Workload
	selectors []klabels.Selector
}

// Demand implements Source.Demand: each matching lease's share is kept
// busy by its part of its workload's GPUs (at most all of it); a lease no
// workload matches is left to the default. A server sees only its own
// leases, so a workload spread over several servers puts its whole work on
// each: give each simulated server its own file then.
func (f *WorkloadFile) Demand(leases []allocator.Lease, _ time.Time) map[string]float64 {
	f.reload()
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]float64{}
	for wi, w := range f.workloads {
		var held float64 // GPUs the workload's leases hold
		var matched []*allocator.Lease
		for i := range leases {
			l := &leases[i]
			if l.Namespace == w.Namespace && f.selectors[wi].Matches(klabels.Set(l.Owner.Labels)) {
				matched = append(matched, l)
				held += l.Share().GPUs()
			}
		}
		for _, l := range matched {
			out[l.ID] = w.GPUs / held
		}
	}
	return out
}

// reload rereads the file when it changed; a bad file keeps the last good
// workloads and says why on stderr once per change.
func (f *WorkloadFile) reload() {
	st, err := os.Stat(f.Path)
	if err != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if st.ModTime().Equal(f.modified) {
		return
	}
	f.modified = st.ModTime()
	ws, sels, err := ReadWorkloads(f.Path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	f.workloads, f.selectors = ws, sels
}

// ReadWorkloads parses a workload file.
func ReadWorkloads(path string) ([]Workload, []klabels.Selector, error) {
	b, err := os.ReadFile(path) //nolint:gosec // the operator names the workload file
	if err != nil {
		return nil, nil, err
	}
	var ws []Workload
	if err := yaml.UnmarshalStrict(b, &ws); err != nil {
		return nil, nil, fmt.Errorf("workload file %s: %w", path, err)
	}
	sels := make([]klabels.Selector, len(ws))
	for i, w := range ws {
		if sels[i], err = klabels.Parse(w.Selector); err != nil {
			return nil, nil, fmt.Errorf("workload file %s: [%d].selector %q: %w", path, i, w.Selector, err)
		}
		if w.GPUs < 0 || w.GPUs > 1e6 {
			return nil, nil, fmt.Errorf("workload file %s: [%d].gpus %v out of range 0..1e6", path, i, w.GPUs)
		}
	}
	return ws, sels, nil
}
