package collector

import "github.com/gpupool/gpupool/internal/metricdef"

// The exporter's table: GPUCollector builds every series from a row here,
// and docs/metrics.md's GPU-server section is checked against it.
var (
	sourceLabels = metricdef.Labels{"source"}
	portLabels   = metricdef.Labels{"server", "device", "port"}

	deviceInfo = metricdef.Gauge("bitfusion_gpu_device_info", "1", metricdef.GPULabels.With("uuid", "mig"),
		"GPUs as the host's driver sees them; 1 per GPU.")
	deviceHealthy = metricdef.Gauge("bitfusion_gpu_device_healthy", "0/1", metricdef.GPULabels,
		"1 when the GPU answers and reports no fatal error (off the bus, uncorrectable ECC).")
	utilization = metricdef.Gauge("bitfusion_gpu_utilization", "ratio 0..1", metricdef.GPULabels,
		"Share of the last sample period a kernel ran on the GPU (0..1).")
	memoryPressure = metricdef.Gauge("bitfusion_memory_pressure", "ratio 0..1", metricdef.GPULabels,
		"GPU memory used over total (0..1).")
	memoryUsed = metricdef.Gauge("bitfusion_gpu_memory_used_bytes", "bytes", metricdef.GPULabels,
		"GPU memory in use.")
	temperature = metricdef.Gauge("bitfusion_gpu_temperature_celsius", "°C", metricdef.GPULabels,
		"GPU temperature.")
	power = metricdef.Gauge("bitfusion_gpu_power_watts", "W", metricdef.GPULabels,
		"GPU power draw.")
	eccErrors = metricdef.Counter("bitfusion_gpu_ecc_errors_total", "errors", metricdef.GPULabels.With("type"),
		"ECC errors since the driver loaded, by type (corrected, uncorrected).")
	retiredPages = metricdef.Counter("bitfusion_gpu_retired_pages_total", "pages", metricdef.GPULabels,
		"Memory pages retired or rows remapped since the driver loaded.")
	xidErrors = metricdef.Counter("bitfusion_gpu_xid_errors_total", "errors", metricdef.GPULabels,
		"Xid errors seen since the daemon started.")
	throttled = metricdef.Gauge("bitfusion_gpu_throttled", "0/1", metricdef.GPULabels.With("reason"),
		"1 while the GPU's clocks are held down for this reason.")

	portInfo = metricdef.Gauge("bitfusion_rdma_port_info", "1", portLabels.With("link_layer"),
		"RDMA ports of the host; 1 per port, with its link layer (InfiniBand or Ethernet for RoCE).")
	portUp = metricdef.Gauge("bitfusion_rdma_port_up", "0/1", portLabels,
		"1 while the port's state is ACTIVE.")
	portRate = metricdef.Gauge("bitfusion_rdma_port_rate_bytes_per_second", "bytes/s", portLabels,
		"Negotiated port rate.")

	sourceSuccess = metricdef.Gauge("bitfusion_exporter_source_success", "0/1", sourceLabels,
		"1 when the source's last sampling round succeeded.")
	sourceDuration = metricdef.Gauge("bitfusion_exporter_source_duration_seconds", "seconds", sourceLabels,
		"How long the source's last sampling round took.")
	snapshotAge = metricdef.Gauge("bitfusion_exporter_snapshot_age_seconds", "seconds", sourceLabels,
		"Age of the newest good snapshot of the source at scrape time.")
	gpuLinksKnown = metricdef.Gauge("bitfusion_exporter_gpu_links_known", "0/1", sourceLabels,
		"1 when the source knows how each pair of its GPUs is linked (NVLink, PCIe switch, CPU socket).")
	gpuReadSuccess = metricdef.Gauge("bitfusion_exporter_gpu_read_success", "0/1", sourceLabels.With(metricdef.GPULabels...),
		"1 when the GPU was read in the source's last round.")
)

// portCounters are the counters exported per port.
var portCounters = []struct {
	family *metricdef.Family
	get    func(*Port) *uint64
}{
	{metricdef.Counter("bitfusion_rdma_port_received_bytes_total", "bytes", portLabels, "Data received on the port."),
		func(p *Port) *uint64 { return p.RxBytes }},
	{metricdef.Counter("bitfusion_rdma_port_transmitted_bytes_total", "bytes", portLabels, "Data transmitted on the port."),
		func(p *Port) *uint64 { return p.TxBytes }},
	{metricdef.Counter("bitfusion_rdma_port_received_packets_total", "packets", portLabels, "Packets received on the port."),
		func(p *Port) *uint64 { return p.RxPackets }},
	{metricdef.Counter("bitfusion_rdma_port_transmitted_packets_total", "packets", portLabels, "Packets transmitted on the port."),
		func(p *Port) *uint64 { return p.TxPackets }},
	{metricdef.Counter("bitfusion_rdma_port_receive_errors_total", "packets", portLabels, "Received packets with errors."),
		func(p *Port) *uint64 { return p.RxErrors }},
	{metricdef.Counter("bitfusion_rdma_port_transmit_discards_total", "packets", portLabels, "Outbound packets discarded (congestion, port down)."),
		func(p *Port) *uint64 { return p.TxDiscards }},
	{metricdef.Counter("bitfusion_rdma_port_link_downed_total", "events", portLabels, "Times the link went down."),
		func(p *Port) *uint64 { return p.LinkDowned }},
}

// MetricFamilies is the table of what GPUCollector exports.
var MetricFamilies = func() []*metricdef.Family {
	families := []*metricdef.Family{deviceInfo, deviceHealthy, utilization, memoryPressure, memoryUsed, temperature, power,
		eccErrors, retiredPages, xidErrors, throttled, portInfo, portUp, portRate,
		sourceSuccess, sourceDuration, snapshotAge, gpuLinksKnown, gpuReadSuccess}
	for _, c := range portCounters {
		families = append(families, c.family)
	}
	return families
}()
