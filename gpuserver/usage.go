package gpuserver

import (
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	allocapi "github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/gpuserver/api"
)

// LatencyWindow is how far back the usage report's latency counts reach,
// and latencyStep how often the window's start moves.
const (
	LatencyWindow = 5 * time.Minute
	latencyStep   = 10 * time.Second
)

// UsageReport is the latest sampling rounds per GPU and per lease (GET
// /v1/usage), what the adapter's direct backend serves to the HPA, as the
// last round rendered it.
func (d *Daemon) UsageReport() api.Usage {
	if rep := d.report.Load(); rep != nil {
		return *rep
	}
	use, _ := d.Usage()
	return d.usageReport(use)
}

// usageReport builds the report from the samplers and the leases' use
// (Daemon.Usage).
func (d *Daemon) usageReport(use map[api.LeaseGPU]*LeaseUse) api.Usage {
	rep := api.Usage{Server: d.cfg.Inventory.Name, GPUs: []api.GPUUsage{}, Leases: []api.LeaseUsage{}}
	for i, s := range d.cfg.Samplers {
		snap := s.Latest()
		if snap.Time.IsZero() {
			rep.SampledAt = time.Time{}
			break
		}
		if i == 0 || snap.Time.Before(rep.SampledAt) {
			rep.SampledAt = snap.Time
		}
		for _, g := range snap.GPUs {
			u := api.GPUUsage{Index: g.Index, UUID: g.UUID, Model: g.Model, Healthy: g.Healthy && g.Err == nil}
			if g.Err == nil {
				// Memory not read stays 0 of 0: no pressure, rather than none used.
				if !math.IsNaN(g.MemoryUsed()) {
					u.MemoryUsedBytes, u.MemoryBytes = g.MemoryUsedBytes, g.MemoryBytes
				}
				if !math.IsNaN(g.Utilization) {
					u.Utilization = &g.Utilization
				}
			}
			rep.GPUs = append(rep.GPUs, u)
		}
	}
	for _, l := range d.Leases() {
		for _, lg := range l.GPUs {
			u := use[api.LeaseGPU{Lease: l.ID, GPU: lg.Index}]
			if u == nil {
				continue // not measured (Usage says when): no data, not idle
			}
			lu := api.LeaseUsage{Lease: l.ID, Namespace: l.Namespace, GPU: lg.Index, Milli: int32(lg.Share), MemoryGrantedBytes: lg.MemoryBytes}
			if u.SMKnown {
				sm := u.SM
				lu.SMUtilization = &sm
			}
			lu.MemoryUsedBytes, lu.Processes = u.Bytes, u.Processes
			rep.Leases = append(rep.Leases, lu)
		}
	}
	rep.Latency = d.window.report(d.now())
	return rep
}

// latencyWindow keeps the latency histogram's cumulative counts every
// latencyStep for LatencyWindow, so that a report can give the counts of
// the last window alone (what rate() over the window gives in PromQL).
type latencyWindow struct {
	hist    *prometheus.HistogramVec
	started time.Time

	mu    sync.Mutex
	marks []latencyMark // oldest first
}

type latencyMark struct {
	at     time.Time
	counts map[string]api.LatencyWindow // by transport
}

// cumulative sums the histogram over servers and client nodes, by transport.
func (w *latencyWindow) cumulative() map[string]api.LatencyWindow {
	ch := make(chan prometheus.Metric, 64)
	go func() { w.hist.Collect(ch); close(ch) }()
	out := map[string]api.LatencyWindow{}
	for m := range ch {
		var pb dto.Metric
		if m.Write(&pb) != nil || pb.Histogram == nil {
			continue
		}
		transport := ""
		for _, lp := range pb.Label {
			if lp.GetName() == "transport" {
				transport = lp.GetValue()
			}
		}
		lw := out[transport]
		lw.Transport = transport
		for i, b := range pb.Histogram.Bucket {
			if i == len(lw.Buckets) {
				lw.Buckets = append(lw.Buckets, api.Bucket{UpperBound: b.GetUpperBound()})
			}
			lw.Buckets[i].Count += b.GetCumulativeCount()
		}
		lw.Count += pb.Histogram.GetSampleCount()
		out[transport] = lw
	}
	return out
}

// mark records the counts now, at most once per latencyStep.
func (w *latencyWindow) mark(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := len(w.marks); n > 0 && now.Sub(w.marks[n-1].at) < latencyStep {
		return
	}
	w.marks = append(w.marks, latencyMark{at: now, counts: w.cumulative()})
	cut := 0
	for cut < len(w.marks)-1 && now.Sub(w.marks[cut+1].at) >= LatencyWindow {
		cut++
	}
	w.marks = slices.Delete(w.marks, 0, cut)
}

// report is the counts since the oldest mark in the window (since the
// daemon started, before it has one).
func (w *latencyWindow) report(now time.Time) []api.LatencyWindow {
	counts := w.cumulative()
	w.mu.Lock()
	base := latencyMark{at: w.started}
	if len(w.marks) > 0 {
		base = w.marks[0]
	}
	w.mu.Unlock()
	var out []api.LatencyWindow
	for transport, lw := range counts {
		lw.Window = now.Sub(base.at).Round(time.Second)
		if prev, ok := base.counts[transport]; ok && len(prev.Buckets) == len(lw.Buckets) {
			for i := range lw.Buckets {
				lw.Buckets[i].Count -= prev.Buckets[i].Count
			}
			lw.Count -= prev.Count
		}
		out = append(out, lw)
	}
	slices.SortFunc(out, func(a, b api.LatencyWindow) int { return strings.Compare(a.Transport, b.Transport) })
	return out
}

// heartbeatUse is the report as a heartbeat carries it to the allocator,
// for its console; nil before the first good round.
func heartbeatUse(rep api.Usage) *allocapi.ServerUse {
	if rep.SampledAt.IsZero() {
		return nil
	}
	u := &allocapi.ServerUse{SampledAt: rep.SampledAt, GPUs: make([]allocapi.GPUUse, 0, len(rep.GPUs))}
	for _, g := range rep.GPUs {
		u.GPUs = append(u.GPUs, allocapi.GPUUse{Index: g.Index, Utilization: fraction(g.Utilization), MemoryUsedBytes: g.MemoryUsedBytes})
	}
	for _, l := range rep.Leases {
		u.Leases = append(u.Leases, allocapi.LeaseUse{Lease: l.Lease, GPU: l.GPU, SMUtilization: fraction(l.SMUtilization), MemoryUsedBytes: l.MemoryUsedBytes})
	}
	return u
}

// fraction is v within 0..1, as the allocator takes it: per-process
// samples of one GPU can add up to a little over all of it.
func fraction(v *float64) *float64 {
	if v == nil {
		return nil
	}
	c := min(max(*v, 0), 1)
	return &c
}
