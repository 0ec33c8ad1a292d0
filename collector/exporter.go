package collector

import (
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/internal/metricdef"
)

// throttleReasons name NVML's clocks-event reason bits worth alerting on.
var throttleReasons = []struct {
	bit  uint64
	name string
}{
	{0x4, "sw_power_cap"}, {0x8, "hw_slowdown"}, {0x20, "sw_thermal_slowdown"},
	{0x40, "hw_thermal_slowdown"}, {0x80, "hw_power_brake"},
}

// GPUCollector exports the latest snapshots of a host's samplers: each
// source's health, and the GPUs or ports it read. Each sampler's series are
// rendered once per round of that sampler (Render, from its AfterRound),
// apart from the others', so that samplers on their own loops neither
// render each other's series nor overwrite a newer part with an older one;
// a scrape copies the parts and adds the snapshot ages.
type GPUCollector struct {
	Server   string
	Samplers []*Sampler
	Clock    func() time.Time

	mu       sync.Mutex
	rendered map[*Sampler][]prometheus.Metric
}

// Render builds the series of s's latest snapshot.
func (c *GPUCollector) Render(s *Sampler) {
	out := c.render(s)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rendered == nil {
		c.rendered = map[*Sampler][]prometheus.Metric{}
	}
	c.rendered[s] = out
}

func (c *GPUCollector) render(s *Sampler) []prometheus.Metric {
	var out []prometheus.Metric
	emit := func(m prometheus.Metric) { out = append(out, m) }
	snap, name := s.Latest(), s.Source().Name()
	emit(sourceSuccess.Metric(boolValue(snap.Err == nil && !snap.Time.IsZero()), name))
	if snap.Round > 0 { // no round, no duration
		emit(sourceDuration.Metric(snap.Duration.Seconds(), name))
	}
	if len(snap.GPUs) > 0 {
		emit(gpuLinksKnown.Metric(boolValue(linksKnown(snap.GPUs)), name))
	}
	for i := range snap.GPUs {
		c.renderGPU(emit, name, &snap.GPUs[i])
	}
	for i := range snap.Ports {
		c.renderPort(emit, &snap.Ports[i])
	}
	return out
}

// Describe implements prometheus.Collector.
func (c *GPUCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range MetricFamilies {
		ch <- f.Desc()
	}
}

// Collect implements prometheus.Collector from the latest snapshots only.
func (c *GPUCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	if c.Clock != nil {
		now = c.Clock()
	}
	for _, s := range c.Samplers {
		c.mu.Lock()
		part, ok := c.rendered[s]
		c.mu.Unlock()
		if !ok { // scraped before the sampler's first round ended
			part = c.render(s)
		}
		for _, m := range part {
			ch <- m
		}
		if snap := s.Latest(); !snap.Time.IsZero() {
			ch <- snapshotAge.Metric(now.Sub(snap.Time).Seconds(), s.Source().Name())
		}
	}
}

func (c *GPUCollector) renderGPU(emit func(prometheus.Metric), source string, g *GPU) {
	labels := []string{c.Server, strconv.Itoa(g.Index), g.Model}
	series := func(f *metricdef.Family, v float64, extra ...string) {
		if !math.IsNaN(v) {
			emit(f.Metric(v, append(labels, extra...)...))
		}
	}
	emit(gpuReadSuccess.Metric(boolValue(g.Err == nil), append([]string{source}, labels...)...))
	emit(deviceInfo.Metric(1, append(labels, g.UUID, strconv.FormatBool(g.MIG))...))
	series(deviceHealthy, boolValue(g.Healthy))
	if g.Err != nil {
		return
	}
	series(utilization, g.Utilization)
	series(memoryPressure, g.MemoryPressure())
	series(memoryUsed, g.MemoryUsed())
	series(temperature, g.TemperatureCelsius)
	series(power, g.PowerWatts)
	series(eccErrors, float64(g.ECCCorrected), "corrected")
	series(eccErrors, float64(g.ECCUncorrected), "uncorrected")
	series(retiredPages, float64(g.RetiredPages))
	series(xidErrors, float64(g.XidErrors))
	for _, r := range throttleReasons {
		series(throttled, boolValue(g.ThrottleReasons&r.bit != 0), r.name)
	}
}

func (c *GPUCollector) renderPort(emit func(prometheus.Metric), p *Port) {
	labels := []string{c.Server, p.Device, strconv.FormatUint(uint64(p.Port), 10)}
	emit(portInfo.Metric(1, append(labels, p.LinkLayer)...))
	emit(portUp.Metric(boolValue(p.Up), labels...))
	emit(portRate.Metric(float64(p.RateBytes), labels...))
	for _, pc := range portCounters {
		if v := pc.get(p); v != nil {
			emit(pc.family.Metric(float64(*v), labels...))
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
