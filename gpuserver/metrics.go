package gpuserver

import (
	"math"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/allocator"
)

// LeaseCollector exports what each lease on the host really uses, from the
// latest snapshots (it never samples).
type LeaseCollector struct {
	d     *Daemon
	descs leaseDescs
}

type leaseDescs struct {
	util, used, granted, overuse, procs, unattributed *prometheus.Desc
}

// NewLeaseCollector builds the per-lease collector; the allowlisted pod
// labels become label_<name> labels, as kube-state-metrics names them.
func NewLeaseCollector(d *Daemon) *LeaseCollector {
	labels := []string{"server", "gpu", "lease", "namespace", "pod"}
	for _, l := range d.cfg.LabelAllowlist {
		labels = append(labels, "label_"+sanitize(l))
	}
	return &LeaseCollector{d: d, descs: leaseDescs{
		util:         prometheus.NewDesc("bitfusion_lease_gpu_utilization", "SM use of the lease's processes on the GPU relative to the share granted (1 = all of its share).", labels, nil),
		used:         prometheus.NewDesc("bitfusion_lease_memory_used_bytes", "GPU memory the lease's processes use on the GPU.", labels, nil),
		granted:      prometheus.NewDesc("bitfusion_lease_memory_granted_bytes", "GPU memory the lease was granted on the GPU.", labels, nil),
		overuse:      prometheus.NewDesc("bitfusion_lease_memory_overuse_bytes", "GPU memory the lease uses beyond what it was granted (0 when within).", labels, nil),
		procs:        prometheus.NewDesc("bitfusion_lease_processes", "Processes attributed to the lease on the GPU.", labels, nil),
		unattributed: prometheus.NewDesc("bitfusion_gpu_unattributed_processes", "Processes on the GPU that belong to no lease on this server.", []string{"server", "gpu"}, nil),
	}}
}

// sanitize makes a pod label key a Prometheus label name.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, s)
}

// Describe implements prometheus.Collector.
func (c *LeaseCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.descs.util, c.descs.used, c.descs.granted, c.descs.overuse, c.descs.procs, c.descs.unattributed} {
		ch <- d
	}
}

type leaseUse struct {
	sm    float64
	smOK  bool
	bytes int64
	procs int
}

// Collect implements prometheus.Collector.
func (c *LeaseCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	d.mu.Lock()
	leases := d.leases
	pids := make(map[int]string, len(d.pids))
	for k, v := range d.pids {
		pids[k] = v
	}
	d.mu.Unlock()

	byPod := map[string]string{}
	for _, l := range leases {
		if l.Owner.UID != "" {
			byPod[l.Owner.UID] = l.ID
		}
	}
	server := d.cfg.Inventory.Name
	type key struct {
		lease string
		gpu   int
	}
	use := map[key]*leaseUse{}
	for _, s := range d.cfg.Samplers {
		for _, g := range s.Latest().GPUs {
			unattributed := 0
			for i := range g.Processes {
				p := &g.Processes[i]
				lease, ok := d.attribute(p, pids, byPod)
				if !ok {
					unattributed++
					continue
				}
				u := use[key{lease, g.Index}]
				if u == nil {
					u = &leaseUse{}
					use[key{lease, g.Index}] = u
				}
				u.procs++
				u.bytes += p.MemoryUsedBytes
				if !math.IsNaN(p.SMUtilization) {
					u.sm += p.SMUtilization
					u.smOK = true
				}
			}
			ch <- prometheus.MustNewConstMetric(c.descs.unattributed, prometheus.GaugeValue, float64(unattributed), server, strconv.Itoa(g.Index))
		}
	}
	for _, l := range leases {
		for _, lg := range l.GPUs {
			labels := c.labels(server, &l, lg.Index)
			u := use[key{l.ID, lg.Index}]
			if u == nil {
				u = &leaseUse{smOK: true}
			}
			gauge := func(desc *prometheus.Desc, v float64) {
				ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
			}
			if u.smOK && lg.Milli > 0 {
				gauge(c.descs.util, u.sm/(float64(lg.Milli)/allocator.MilliPerGPU))
			}
			gauge(c.descs.used, float64(u.bytes))
			gauge(c.descs.granted, float64(lg.MemoryBytes))
			gauge(c.descs.overuse, float64(max(0, u.bytes-lg.MemoryBytes)))
			gauge(c.descs.procs, float64(u.procs))
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
