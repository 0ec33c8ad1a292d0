package collector

import (
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	gpuLabels = []string{"server", "gpu", "model"}

	descDeviceInfo    = prometheus.NewDesc("bitfusion_gpu_device_info", "GPUs as the host's driver sees them; 1 per GPU.", []string{"server", "gpu", "model", "uuid", "mig"}, nil)
	descDeviceHealthy = prometheus.NewDesc("bitfusion_gpu_device_healthy", "1 when the GPU answers and reports no fatal error (off the bus, uncorrectable ECC).", gpuLabels, nil)
	descUtilization   = prometheus.NewDesc("bitfusion_gpu_utilization", "Share of the last sample period a kernel ran on the GPU (0..1).", gpuLabels, nil)
	descPressure      = prometheus.NewDesc("bitfusion_memory_pressure", "GPU memory used over total (0..1).", gpuLabels, nil)
	descMemoryUsed    = prometheus.NewDesc("bitfusion_gpu_memory_used_bytes", "GPU memory in use.", gpuLabels, nil)
	descTemperature   = prometheus.NewDesc("bitfusion_gpu_temperature_celsius", "GPU temperature.", gpuLabels, nil)
	descPower         = prometheus.NewDesc("bitfusion_gpu_power_watts", "GPU power draw.", gpuLabels, nil)
	descECC           = prometheus.NewDesc("bitfusion_gpu_ecc_errors_total", "ECC errors since the driver loaded, by type (corrected, uncorrected).", append(gpuLabels, "type"), nil)
	descRetired       = prometheus.NewDesc("bitfusion_gpu_retired_pages_total", "Memory pages retired or rows remapped since the driver loaded.", gpuLabels, nil)
	descXid           = prometheus.NewDesc("bitfusion_gpu_xid_errors_total", "Xid errors seen since the daemon started.", gpuLabels, nil)
	descThrottled     = prometheus.NewDesc("bitfusion_gpu_throttled", "1 while the GPU's clocks are held down for this reason.", append(gpuLabels, "reason"), nil)

	descSourceSuccess = prometheus.NewDesc("bitfusion_exporter_source_success", "1 when the source's last sampling round succeeded.", []string{"source"}, nil)
	descSourceTime    = prometheus.NewDesc("bitfusion_exporter_source_duration_seconds", "How long the source's last sampling round took.", []string{"source"}, nil)
	descSourceAge     = prometheus.NewDesc("bitfusion_exporter_snapshot_age_seconds", "Age of the newest good snapshot of the source at scrape time.", []string{"source"}, nil)
	descGPUReadable   = prometheus.NewDesc("bitfusion_exporter_gpu_read_success", "1 when the GPU was read in the source's last round.", append([]string{"source"}, gpuLabels...), nil)
)

// throttleReasons name NVML's clocks-event reason bits worth alerting on.
var throttleReasons = []struct {
	bit  uint64
	name string
}{
	{0x4, "sw_power_cap"}, {0x8, "hw_slowdown"}, {0x20, "sw_thermal_slowdown"},
	{0x40, "hw_thermal_slowdown"}, {0x80, "hw_power_brake"},
}

// GPUCollector exports the latest snapshots of a host's samplers. The
// per-GPU series are rendered once per sampling round (Render, from the
// sampler's AfterRound); a scrape copies them and adds the snapshot ages.
type GPUCollector struct {
	Server   string
	Samplers []*Sampler
	// Fabric, when set, adds the host's RDMA ports.
	Fabric   *Fabric
	Clock    func() time.Time
	rendered atomic.Pointer[[]prometheus.Metric]
}

// Render builds the series of the samplers' latest snapshots.
func (c *GPUCollector) Render() {
	var out []prometheus.Metric
	emit := func(m prometheus.Metric) { out = append(out, m) }
	for _, s := range c.Samplers {
		snap, name := s.Latest(), s.Source().Name()
		emit(prometheus.MustNewConstMetric(descSourceSuccess, prometheus.GaugeValue, boolValue(snap.Err == nil && !snap.Time.IsZero()), name))
		if snap.Round > 0 { // no round, no duration
			emit(prometheus.MustNewConstMetric(descSourceTime, prometheus.GaugeValue, snap.Duration.Seconds(), name))
		}
		for i := range snap.GPUs {
			c.renderGPU(emit, name, &snap.GPUs[i])
		}
	}
	if c.Fabric != nil {
		c.Fabric.render(c.Server, emit)
	}
	c.rendered.Store(&out)
}

// Describe implements prometheus.Collector.
func (c *GPUCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDeviceInfo, descDeviceHealthy, descUtilization, descPressure, descMemoryUsed,
		descTemperature, descPower, descECC, descRetired, descXid, descThrottled, descSourceSuccess, descSourceTime,
		descSourceAge, descGPUReadable} {
		ch <- d
	}
	if c.Fabric != nil {
		c.Fabric.describe(ch)
	}
}

// Collect implements prometheus.Collector from the latest snapshots only.
func (c *GPUCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	if c.Clock != nil {
		now = c.Clock()
	}
	if c.rendered.Load() == nil {
		c.Render()
	}
	for _, m := range *c.rendered.Load() {
		ch <- m
	}
	for _, s := range c.Samplers {
		if snap := s.Latest(); !snap.Time.IsZero() {
			ch <- prometheus.MustNewConstMetric(descSourceAge, prometheus.GaugeValue, now.Sub(snap.Time).Seconds(), s.Source().Name())
		}
	}
	if c.Fabric != nil {
		if age, ok := c.Fabric.age(now); ok {
			ch <- prometheus.MustNewConstMetric(descSourceAge, prometheus.GaugeValue, age, "infiniband")
		}
	}
}

func (c *GPUCollector) renderGPU(emit func(prometheus.Metric), source string, g *GPU) {
	labels := []string{c.Server, strconv.Itoa(g.Index), g.Model}
	gauge := func(d *prometheus.Desc, v float64, extra ...string) {
		if !math.IsNaN(v) {
			emit(prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append(labels, extra...)...))
		}
	}
	counter := func(d *prometheus.Desc, v uint64, extra ...string) {
		emit(prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append(labels, extra...)...))
	}
	emit(prometheus.MustNewConstMetric(descGPUReadable, prometheus.GaugeValue, boolValue(g.Err == nil), append([]string{source}, labels...)...))
	emit(prometheus.MustNewConstMetric(descDeviceInfo, prometheus.GaugeValue, 1, c.Server, strconv.Itoa(g.Index), g.Model, g.UUID, strconv.FormatBool(g.MIG)))
	gauge(descDeviceHealthy, boolValue(g.Healthy))
	if g.Err != nil {
		return
	}
	gauge(descUtilization, g.Utilization)
	gauge(descPressure, g.MemoryPressure())
	gauge(descMemoryUsed, g.MemoryUsed())
	gauge(descTemperature, g.TemperatureCelsius)
	gauge(descPower, g.PowerWatts)
	counter(descECC, g.ECCCorrected, "corrected")
	counter(descECC, g.ECCUncorrected, "uncorrected")
	counter(descRetired, g.RetiredPages)
	counter(descXid, g.XidErrors)
	for _, r := range throttleReasons {
		gauge(descThrottled, boolValue(g.ThrottleReasons&r.bit != 0), r.name)
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
