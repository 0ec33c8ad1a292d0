package gpuserver

import (
	"maps"
	"math"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/collector"
	"github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/internal/metricdef"
)

// The per-lease table: LeaseCollector builds its series from these rows,
// with the allowlisted pod labels added (label_<name>, as
// kube-state-metrics names them).
var (
	leaseUtilization = leaseGauge("bitfusion_lease_gpu_utilization", "ratio of the share",
		"SM use of the lease's processes on the GPU relative to the share granted (1 = all of its share).")
	leaseMemoryUsed = leaseGauge("bitfusion_lease_memory_used_bytes", "bytes",
		"GPU memory the lease's processes use on the GPU.")
	leaseMemoryGranted = leaseGauge("bitfusion_lease_memory_granted_bytes", "bytes",
		"GPU memory the lease was granted on the GPU.")
	leaseMemoryOveruse = leaseGauge("bitfusion_lease_memory_overuse_bytes", "bytes",
		"GPU memory the lease uses beyond what it was granted (0 when within).")
	leaseProcesses = leaseGauge("bitfusion_lease_processes", "processes",
		"Processes attributed to the lease on the GPU.")
	unattributedProcesses = metricdef.Gauge("bitfusion_gpu_unattributed_processes", "processes", metricdef.Labels{"server", "gpu"},
		"Processes on the GPU that belong to no lease on this server.")
)

// leaseGauge is a per-lease row: a series per lease and GPU, with the
// pod's allowlisted labels.
func leaseGauge(name, unit, help string) *metricdef.Family {
	f := metricdef.Gauge(name, unit, metricdef.Labels{"server", "gpu", "lease", "namespace", "pod"}, help)
	f.LabelPrefix = "label_"
	return f
}

// LeaseCollector exports what each lease on the host really uses, from the
// latest snapshots (it never samples).
//
// Like the GPU series, the per-lease series are rendered once per sampling
// round (Render) and only copied by scrapes.
type LeaseCollector struct {
	d *Daemon
	// The per-lease families with this daemon's allowlisted labels.
	util, used, granted, overuse, procs *metricdef.Family
	rendered                            atomic.Pointer[[]prometheus.Metric]
}

// NewLeaseCollector builds the per-lease collector.
func NewLeaseCollector(d *Daemon) *LeaseCollector {
	labels := make([]string, len(d.cfg.LabelAllowlist))
	for i, l := range d.cfg.LabelAllowlist {
		labels[i] = api.LabelName(l)
	}
	return &LeaseCollector{d: d,
		util: leaseUtilization.WithPrefixed(labels...), used: leaseMemoryUsed.WithPrefixed(labels...),
		granted: leaseMemoryGranted.WithPrefixed(labels...), overuse: leaseMemoryOveruse.WithPrefixed(labels...),
		procs: leaseProcesses.WithPrefixed(labels...),
	}
}

// Describe implements prometheus.Collector.
func (c *LeaseCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range []*metricdef.Family{c.util, c.used, c.granted, c.overuse, c.procs, unattributedProcesses} {
		ch <- f.Desc()
	}
}

// LeaseUse is what a lease's processes use of one GPU.
type LeaseUse struct {
	Lease string
	GPU   int
	// SM is the processes' share of the GPU's SM time (0..1); SMKnown is
	// false when the source does not tell.
	SM        float64
	SMKnown   bool
	Bytes     int64
	Processes int
}

// ShareUtilization is the SM use relative to a share of the GPU.
func (u *LeaseUse) ShareUtilization(share allocator.Share) float64 {
	return u.SM / share.GPUs()
}

// Usage attributes the latest snapshots' processes to the leases on this
// server, and counts per GPU the processes that belong to no lease holding
// that GPU. GPUs whose processes the source does not report are absent
// from unattributed, and so is every GPU before the daemon first fetched
// its leases: then no process could be attributed, and counting them all
// as nobody's would spike the count (and its alerts) at every restart. A
// lease is in use only where its use was measured:
// with processes attributed to it, or with none in a process list read
// after the daemon learned of the lease, if its processes could have been
// told apart (by its pod, or a process `gpupool run` reported). Anything
// else is unknown, which is not idle.
func (d *Daemon) Usage() (map[api.LeaseGPU]*LeaseUse, map[int]int) {
	d.mu.Lock()
	leases, seen := d.leases, d.seen
	pids := &registered{d: d, pids: maps.Clone(d.pids)}
	reported := map[string]bool{}
	for _, e := range d.pids {
		reported[e.lease] = true
	}
	d.mu.Unlock()
	// holders is which lease of a pod, or with an ID, holds each GPU.
	type holder struct {
		key string // pod UID or lease ID
		gpu int
	}
	holders := map[holder]string{}
	for _, l := range leases {
		for _, g := range l.GPUs {
			holders[holder{l.ID, g.Index}] = l.ID
			if l.Owner.UID != "" {
				holders[holder{l.Owner.UID, g.Index}] = l.ID
			}
		}
	}
	// readIn is, per GPU whose processes are known, the sampler and the
	// round that read them.
	type reading struct{ sampler, round int }
	readIn := map[int]reading{}
	use := map[api.LeaseGPU]*LeaseUse{}
	unattributed := map[int]int{}
	for si, s := range d.cfg.Samplers {
		snap := s.Latest()
		for _, g := range snap.GPUs {
			if g.Processes == nil {
				continue
			}
			readIn[g.Index] = reading{si, snap.ProcessRound}
			if leases == nil {
				continue // not measured: the leases are not known yet
			}
			unattributed[g.Index] += 0
			for i := range g.Processes {
				p := &g.Processes[i]
				key, ok := d.attribute(p, pids)
				lease := holders[holder{key, g.Index}]
				if !ok || lease == "" {
					// Nobody's, or on a GPU its lease was not granted.
					unattributed[g.Index]++
					continue
				}
				k := api.LeaseGPU{Lease: lease, GPU: g.Index}
				u := use[k]
				if u == nil {
					u = &LeaseUse{Lease: lease, GPU: g.Index}
					use[k] = u
				}
				u.Processes++
				u.Bytes += p.MemoryUsedBytes
				if !math.IsNaN(p.SMUtilization) {
					u.SM += p.SMUtilization
					u.SMKnown = true
				}
			}
		}
	}
	for _, l := range leases {
		if l.Owner.UID == "" && !reported[l.ID] {
			continue // its processes, if any, cannot be told from others'
		}
		rounds, ok := seen[l.ID]
		for _, g := range l.GPUs {
			k := api.LeaseGPU{Lease: l.ID, GPU: g.Index}
			r, read := readIn[g.Index]
			if use[k] == nil && read && ok && r.round > rounds[r.sampler] {
				use[k] = &LeaseUse{Lease: l.ID, GPU: g.Index, SMKnown: true} // idle, measured
			}
		}
	}
	return use, unattributed
}

// setLeases stores the leases fetched for this server, never nil once
// fetched, and notes for each lease new to the daemon how many rounds each
// sampler had started (asking it for the processes soon): only a process
// list read by a later round can show the lease idle. d.mu is held.
func (d *Daemon) setLeases(leases []allocator.Lease) {
	seen := make(map[string][]int, len(leases))
	var rounds []int
	for _, l := range leases {
		if r, ok := d.seen[l.ID]; ok {
			seen[l.ID] = r
			continue
		}
		if rounds == nil {
			rounds = make([]int, len(d.cfg.Samplers))
			for i, s := range d.cfg.Samplers {
				rounds[i] = s.RequestProcesses()
			}
		}
		seen[l.ID] = rounds
	}
	if leases == nil {
		leases = []allocator.Lease{}
	}
	d.leases, d.seen = leases, seen
}

// Collect implements prometheus.Collector.
func (c *LeaseCollector) Collect(ch chan<- prometheus.Metric) {
	if c.rendered.Load() == nil {
		c.Render()
	}
	for _, m := range *c.rendered.Load() {
		ch <- m
	}
}

// Render attributes the latest snapshots to the leases and builds the series.
func (c *LeaseCollector) Render() { c.renderFrom(c.d.Usage()) }

// renderFrom builds the series from an attribution (Daemon.Usage).
func (c *LeaseCollector) renderFrom(use map[api.LeaseGPU]*LeaseUse, unattributed map[int]int) {
	var out []prometheus.Metric
	c.render(use, unattributed, func(m prometheus.Metric) { out = append(out, m) })
	c.rendered.Store(&out)
}

func (c *LeaseCollector) render(use map[api.LeaseGPU]*LeaseUse, unattributed map[int]int, emit func(prometheus.Metric)) {
	d := c.d
	server := d.cfg.Inventory.Name
	for gpu, n := range unattributed {
		emit(unattributedProcesses.Metric(float64(n), server, strconv.Itoa(gpu)))
	}
	for _, l := range d.Leases() {
		for _, lg := range l.GPUs {
			labels := c.labels(server, &l, lg.Index)
			gauge := func(f *metricdef.Family, v float64) { emit(f.Metric(v, labels...)) }
			gauge(c.granted, float64(lg.MemoryBytes))
			u := use[api.LeaseGPU{Lease: l.ID, GPU: lg.Index}]
			if u == nil {
				continue // not measured: no series rather than a made-up 0
			}
			if u.SMKnown && lg.Share > 0 {
				gauge(c.util, u.ShareUtilization(lg.Share))
			}
			gauge(c.used, float64(u.Bytes))
			gauge(c.overuse, float64(max(0, u.Bytes-lg.MemoryBytes)))
			gauge(c.procs, float64(u.Processes))
		}
	}
}

func (c *LeaseCollector) labels(server string, l *allocator.Lease, gpu int) []string {
	labels := []string{server, strconv.Itoa(gpu), l.ID, l.Namespace, l.Owner.Pod}
	for _, k := range c.d.cfg.LabelAllowlist {
		labels = append(labels, l.Owner.Labels[k])
	}
	return labels
}

// MetricFamilies is the table of the daemon's whole exposition: the
// collector's per-GPU, per-port and per-source series, the per-lease ones
// and the probes' round trips.
var MetricFamilies = slices.Concat(collector.MetricFamilies, []*metricdef.Family{
	leaseUtilization, leaseMemoryUsed, leaseMemoryGranted, leaseMemoryOveruse, leaseProcesses, unattributedProcesses, api.LatencyFamily})

// Registry is the daemon's whole exposition: per-GPU telemetry, source
// health and RDMA ports from the samplers, per-lease use, and the probes'
// round trips.
func Registry(d *Daemon) *prometheus.Registry {
	samplers := d.cfg.Samplers
	if d.cfg.Fabric != nil {
		samplers = slices.Concat(samplers, []*collector.Sampler{d.cfg.Fabric})
	}
	gpus := &collector.GPUCollector{Server: d.cfg.Inventory.Name, Samplers: samplers, Clock: d.cfg.Clock}
	leases := NewLeaseCollector(d)
	for _, s := range d.cfg.Samplers {
		// Each round attributes once; the series and the usage report
		// (GET /v1/usage) are built from it, and requests only copy them.
		s.AfterRound = func() {
			gpus.Render(s)
			use, unattributed := d.Usage()
			leases.renderFrom(use, unattributed)
			d.window.mark(d.now())
			rep := d.usageReport(use)
			d.report.Store(&rep)
		}
	}
	if d.cfg.Fabric != nil {
		d.cfg.Fabric.AfterRound = func() { gpus.Render(d.cfg.Fabric) }
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(gpus, leases, d.latency)
	return reg
}
