package dashboards

// poolOverview is the pool as the allocator sees it: capacity, what is
// leased against what is busy, what can still be placed, and who waits.
func poolOverview() Dashboard {
	return Dashboard{
		Name:  "pool-overview",
		Title: "Pool overview",
		Description: "The GPU pool as the allocator sees it: capacity, share leased against share busy, " +
			"free GPUs by size class, fragmentation, queued requests and quota use.",
		Rows: []Row{{
			Title: "Capacity",
			Panels: []Panel{{
				Kind: Stat, Title: "GPUs", Unit: "short",
				Description: "GPUs registered in the pool.",
				Targets:     []Target{{Expr: `count(bitfusion_gpu_info{<sel>})`}},
			}, {
				Kind: Stat, Title: "Unhealthy GPUs", Unit: "short", Steps: []Step{{1, "red"}},
				Description: "GPUs whose daemon reports them unhealthy: they take no new lease.",
				Targets:     []Target{{Expr: `count(bitfusion_gpu_healthy{<sel>}) - sum(bitfusion_gpu_healthy{<sel>})`}},
			}, {
				Kind: Stat, Title: "Unschedulable servers", Unit: "short", Steps: []Step{{1, "red"}},
				Description: "GPU servers that take no new lease: they stopped heart-beating.",
				Targets:     []Target{{Expr: `count(bitfusion_server_schedulable{<sel>}) - sum(bitfusion_server_schedulable{<sel>})`}},
			}, {
				Kind: Stat, Title: "Leased", Unit: "percentunit", Max: 1, Steps: []Step{{0.9, "orange"}},
				Description: "Share of the pool's GPUs held by leases.",
				Targets:     []Target{{Expr: `sum(bitfusion_gpu_allocated_ratio{<sel>}) / count(bitfusion_gpu_info{<sel>})`}},
			}, {
				Kind: Stat, Title: "Busy", Unit: "percentunit", Max: 1,
				Description: "Share of the pool's GPUs running kernels (the daemons' sampling).",
				Targets:     []Target{{Expr: `avg(bitfusion_gpu_utilization{<sel>})`}},
			}, {
				Kind: Stat, Title: "Queued requests", Unit: "short", Steps: []Step{{1, "orange"}},
				Description: "Lease requests waiting for capacity or quota.",
				Targets:     []Target{{Expr: `sum(bitfusion_lease_pending_requests{<sel>})`}},
			}},
		}, {
			Title: "Leased against used",
			Panels: []Panel{{
				Kind: Timeseries, Title: "GPUs leased and busy", Unit: "short",
				Description: "GPU share held by leases and GPU share running kernels, in GPUs. " +
					"A wide gap is share reserved and left idle.",
				Targets: []Target{
					{Expr: `count(bitfusion_gpu_info{<sel>})`, Legend: "capacity"},
					{Expr: `sum(bitfusion_gpu_allocated_ratio{<sel>})`, Legend: "leased"},
					{Expr: `sum(bitfusion_gpu_utilization{<sel>})`, Legend: "busy"},
				},
			}, {
				Kind: Timeseries, Title: "Leased and busy by model", Unit: "percentunit", Max: 1,
				Description: "Per GPU model: the share of its GPUs held by leases and the share running kernels.",
				Targets: []Target{
					{Expr: `sum by (model) (bitfusion_gpu_allocated_ratio{<sel>}) / count by (model) (bitfusion_gpu_info{<sel>})`, Legend: "{{model}} leased"},
					{Expr: `avg by (model) (bitfusion_gpu_utilization{<sel>})`, Legend: "{{model}} busy"},
				},
			}, {
				Kind: Timeseries, Title: "Multi-GPU leases by link", Unit: "short",
				Description: "Live leases of more than one GPU by the link all their GPUs have: nvlink, pcie-switch (behind one PCIe switch), " +
					"socket (one CPU socket) or any (across sockets, or a server that reports no links). " +
					"A request may require a link with topology (gpupool.io/topology).",
				Targets: []Target{{Expr: `sum by (link) (bitfusion_namespace_multi_gpu_leases{<sel>})`, Legend: "{{link}}"}},
			}},
		}, {
			Title: "What can still be placed",
			Panels: []Panel{{
				Kind: Timeseries, Title: "Free GPUs by size class", Unit: "short",
				Description: "Healthy GPUs on schedulable servers with at least min_free of the GPU unleased: " +
					"how many requests of that size fit now.",
				Targets: []Target{{Expr: `sum by (min_free) (bitfusion_pool_free_gpus{<sel>})`, Legend: "≥ {{min_free}} GPU free"}},
			}, {
				Kind: Timeseries, Title: "Fragmentation", Unit: "percentunit", Max: 1,
				Description: "Share of the free GPU share that the recent workload's requests cannot use (FGD's measure).",
				Targets:     []Target{{Expr: `bitfusion_pool_fragmentation_ratio{<sel>}`, Legend: "fragmentation {{cluster}}"}},
			}},
		}, {
			Title: "Requests and quotas",
			Panels: []Panel{{
				Kind: Timeseries, Title: "Lease requests", Unit: "reqps",
				Description: "Lease requests answered, by outcome and the reason of a rejection.",
				Targets: []Target{{
					Expr:   `sum by (outcome, reason) (rate(bitfusion_lease_acquisitions_total{<sel>}[$__rate_interval]))`,
					Legend: "{{outcome}} {{reason}}",
				}},
			}, {
				Kind: Timeseries, Title: "Queued requests by namespace", Unit: "short",
				Description: "Lease requests queued for capacity or quota (`wait`), by namespace.",
				Targets:     []Target{{Expr: `sum by (namespace) (bitfusion_lease_pending_requests{<sel>})`, Legend: "{{namespace}}"}},
			}, {
				Kind: BarGauge, Title: "Quota use by namespace", Unit: "percentunit", Max: 1,
				Steps:       []Step{{0.8, "orange"}, {1, "red"}},
				Description: "GPU share the namespace's leases hold over its quota (namespaces with a quota); GPUPoolQuotaNearlyExhausted fires above 90%.",
				Targets: []Target{{
					Expr:   `namespace:bitfusion_quota_used:ratio{<rule>}`,
					Legend: "{{namespace}}",
				}},
			}, {
				Kind: Timeseries, Title: "Lease request latency", Unit: "s",
				Description: "Time to answer a lease request, queueing included, and its durable write unless the request asked for the answer before it (the scheduler extender's filter).",
				Targets: []Target{
					{Expr: `histogram_quantile(0.99, sum by (le) (rate(bitfusion_lease_acquisition_duration_seconds_bucket{<sel>}[$__rate_interval])))`, Legend: "p99"},
					{Expr: `histogram_quantile(0.5, sum by (le) (rate(bitfusion_lease_acquisition_duration_seconds_bucket{<sel>}[$__rate_interval])))`, Legend: "p50"},
				},
			}},
		}},
	}
}
