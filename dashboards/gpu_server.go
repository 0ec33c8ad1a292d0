package dashboards

// gpuServer is one or more GPU servers as their daemons see them: each
// GPU's load and health, the data path, and whether the daemon's
// telemetry sources still read the hardware.
func gpuServer() Dashboard {
	return Dashboard{
		Name:  "gpu-server",
		Title: "GPU server",
		Description: "GPU servers as their daemons (gpupool-server) sample them: per-GPU utilization, memory, " +
			"temperature, power, errors and health, the data path's latency and RDMA ports, the telemetry sources.",
		Variables: []Variable{{Label: "server", Series: `bitfusion_gpu_device_info{<sel>}`}},
		Rows: []Row{{
			Title: "Load",
			Panels: []Panel{{
				Kind: Timeseries, Title: "Utilization per GPU", Unit: "percentunit", Max: 1,
				Description: "Share of the last sample period a kernel ran.",
				Targets:     []Target{{Expr: `bitfusion_gpu_utilization{<sel>, server=~"$server"}`, Legend: "{{server}}/{{gpu}} {{model}}"}},
			}, {
				Kind: Timeseries, Title: "Memory pressure per GPU", Unit: "percentunit", Max: 1,
				Description: "GPU memory used over total.",
				Targets:     []Target{{Expr: `bitfusion_memory_pressure{<sel>, server=~"$server"}`, Legend: "{{server}}/{{gpu}} {{model}}"}},
			}, {
				Kind: Timeseries, Title: "Temperature", Unit: "celsius",
				Description: "GPU temperature (absent where the source cannot read it).",
				Targets:     []Target{{Expr: `bitfusion_gpu_temperature_celsius{<sel>, server=~"$server"}`, Legend: "{{server}}/{{gpu}}"}},
			}, {
				Kind: Timeseries, Title: "Power", Unit: "watt",
				Description: "Power draw (absent where the source cannot read it).",
				Targets:     []Target{{Expr: `bitfusion_gpu_power_watts{<sel>, server=~"$server"}`, Legend: "{{server}}/{{gpu}}"}},
			}},
		}, {
			Title: "Health",
			Panels: []Panel{{
				Kind: Stat, Title: "Unhealthy GPUs", Unit: "short", Steps: []Step{{1, "red"}}, Width: 6, Height: 8,
				Description: "GPUs with a fatal error (off the bus, uncorrectable ECC, row-remap failure), by server.",
				Targets:     []Target{{Expr: `sum by (server) (1 - bitfusion_gpu_device_healthy{<sel>, server=~"$server"})`, Legend: "{{server}}"}},
			}, {
				Kind: Timeseries, Title: "ECC errors", Unit: "cps", Width: 6,
				Description: "ECC errors per second, corrected and uncorrected (0 where the GPU has no ECC).",
				Targets: []Target{{
					Expr:   `sum by (server, gpu, type) (rate(bitfusion_gpu_ecc_errors_total{<sel>, server=~"$server"}[$__rate_interval]))`,
					Legend: "{{server}}/{{gpu}} {{type}}",
				}},
			}, {
				Kind: Timeseries, Title: "Xid errors", Unit: "short", Width: 6,
				Description: "Xid errors the driver reported (0 where the driver offers no events).",
				Targets: []Target{{
					Expr:   `sum by (server, gpu) (increase(bitfusion_gpu_xid_errors_total{<sel>, server=~"$server"}[$__rate_interval]))`,
					Legend: "{{server}}/{{gpu}}",
				}},
			}, {
				Kind: Timeseries, Title: "Throttled GPUs", Unit: "short", Width: 6,
				Description: "GPUs whose clocks are held down, by reason.",
				Targets: []Target{{
					Expr:   `sum by (server, reason) (bitfusion_gpu_throttled{<sel>, server=~"$server"})`,
					Legend: "{{server}} {{reason}}",
				}},
			}},
		}, {
			Title: "Data path",
			Panels: []Panel{{
				Kind: Heatmap, Title: "Round-trip latency", Unit: "s",
				Description: "Round trips between clients (`gpupool run`) and the servers on the data path, " +
					"as the servers measure them. Bitfusion asks for 50 us on RDMA.",
				Targets: []Target{{
					Expr:   `sum by (le) (rate(bitfusion_rdma_latency_seconds_bucket{<sel>, server=~"$server"}[$__rate_interval]))`,
					Legend: "{{le}}",
				}},
			}, {
				Kind: Timeseries, Title: "p99 round trip by server and transport", Unit: "s",
				Description: "The 99th percentile of the last 5 minutes' round trips, which GPUPoolRDMALatencyHigh holds to the budget " +
					"(50 us on RDMA, 1 ms on TCP); the autoscaling adapter serves it as bitfusion_rdma_latency_seconds " +
					"over the servers of an app's leases.",
				Targets: []Target{{
					Expr:   `server_transport:bitfusion_rdma_latency_seconds:p99_5m{<rule>, server=~"$server"}`,
					Legend: "{{server}} {{transport}}",
				}},
			}, {
				Kind: Timeseries, Title: "RDMA port traffic", Unit: "Bps",
				Description: "Bytes per second received and transmitted per port.",
				Targets: []Target{{
					Expr:       `rate(bitfusion_rdma_port_received_bytes_total{<sel>, server=~"$server"}[$__rate_interval])`,
					Legend:     "{{server}} {{device}}/{{port}} received",
					MayBeEmpty: needsRDMA,
				}, {
					Expr:       `rate(bitfusion_rdma_port_transmitted_bytes_total{<sel>, server=~"$server"}[$__rate_interval])`,
					Legend:     "{{server}} {{device}}/{{port}} transmitted",
					MayBeEmpty: needsRDMA,
				}},
			}, {
				Kind: Timeseries, Title: "RDMA port errors", Unit: "cps",
				Description: "Received packets with errors, outbound packets discarded and link-downs, per second.",
				Targets: []Target{{
					Expr:       `rate(bitfusion_rdma_port_receive_errors_total{<sel>, server=~"$server"}[$__rate_interval])`,
					Legend:     "{{server}} {{device}}/{{port}} receive errors",
					MayBeEmpty: needsRDMA,
				}, {
					Expr:       `rate(bitfusion_rdma_port_transmit_discards_total{<sel>, server=~"$server"}[$__rate_interval])`,
					Legend:     "{{server}} {{device}}/{{port}} transmit discards",
					MayBeEmpty: needsRDMA,
				}, {
					Expr:       `rate(bitfusion_rdma_port_link_downed_total{<sel>, server=~"$server"}[$__rate_interval])`,
					Legend:     "{{server}} {{device}}/{{port}} link downed",
					MayBeEmpty: needsRDMA,
				}},
			}, {
				Kind: Stat, Title: "RDMA ports down", Unit: "short", Steps: []Step{{1, "red"}}, Width: 24,
				Description: "RDMA ports whose state is not ACTIVE, by server.",
				Targets: []Target{{
					Expr:       `sum by (server) (1 - bitfusion_rdma_port_up{<sel>, server=~"$server"})`,
					Legend:     "{{server}}",
					MayBeEmpty: needsRDMA,
				}},
			}},
		}, {
			Title: "Telemetry sources",
			Panels: []Panel{{
				Kind: Timeseries, Title: "Source success", Unit: "short", Max: 1,
				Description: "1 while the source's last sampling round succeeded (nvml, dcgm, simulated, infiniband). " +
					"The daemon's series carry no server label: they are joined to the server by scrape target; " +
					"a daemon that never read a GPU shows by instance, whatever $server is.",
				Targets: []Target{{
					Expr: `bitfusion_exporter_source_success{<sel>}
  * on (cluster, instance) group_left (server) group by (cluster, instance, server) (bitfusion_gpu_device_info{<sel>, server=~"$server"})
or
bitfusion_exporter_source_success{<sel>} unless on (cluster, instance) bitfusion_gpu_device_info{<sel>}`,
					Legend: "{{server}} {{source}} ({{instance}})",
				}},
			}, {
				Kind: Timeseries, Title: "Snapshot age", Unit: "s",
				Description: "Age of the newest good snapshot at scrape time: it grows while a source fails, " +
					"and what the daemon exports is that old.",
				Targets: []Target{{
					Expr: `bitfusion_exporter_snapshot_age_seconds{<sel>}
  * on (cluster, instance) group_left (server) group by (cluster, instance, server) (bitfusion_gpu_device_info{<sel>, server=~"$server"})`,
					Legend: "{{server}} {{source}}",
				}},
			}},
		}},
	}
}
