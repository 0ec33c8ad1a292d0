package dashboards

// tenants is the pool by namespace and app: what their leases hold, what
// they use of it, and the leases themselves.
func tenants() Dashboard {
	return Dashboard{
		Name:  "tenants",
		Title: "Tenants and leases",
		Description: "The pool by namespace and app (the owner pod's app label, which the daemon copies as label_app): " +
			"GPU share held against share busy, quota, memory beyond the grant, and the live leases.",
		Variables: []Variable{{Label: "namespace", Series: `bitfusion_namespace_allocated_gpus{<sel>}`}},
		Rows: []Row{{
			Title: "Share held and used",
			Panels: []Panel{{
				Kind: Timeseries, Title: "GPUs held and busy by app", Unit: "short",
				Description: "GPU share the app's leases hold, and the part of it running the leases' kernels, in GPUs. " +
					"Busy over held is what the autoscaling adapter serves as bitfusion_gpu_utilization. " +
					"A lease counts once its daemon has measured its use: leases whose kernels the daemon cannot attribute are left out of both.",
				Targets: []Target{{
					Expr:   `sum by (namespace, label_app) (lease:bitfusion_lease_held_gpus{<rule>, namespace=~"$namespace"})`,
					Legend: "{{namespace}}/{{label_app}} held",
				}, {
					Expr:   `sum by (namespace, label_app) (lease:bitfusion_lease_busy_gpus{<rule>, namespace=~"$namespace"})`,
					Legend: "{{namespace}}/{{label_app}} busy",
				}},
			}, {
				Kind: Timeseries, Title: "GPUs held by namespace and quota", Unit: "short",
				Description: "GPU share the namespace's leases hold, and its quota (requests.bitfusion.io/gpu / 100).",
				Targets: []Target{{
					Expr:   `sum by (namespace) (bitfusion_lease_allocated_gpus{<sel>, namespace=~"$namespace"})`,
					Legend: "{{namespace}} held",
				}, {
					Expr:   `sum by (namespace) (bitfusion_namespace_quota_gpus{<sel>, namespace=~"$namespace"})`,
					Legend: "{{namespace}} quota",
				}},
			}},
		}, {
			Title: "GPU memory",
			Panels: []Panel{{
				Kind: Timeseries, Title: "Memory beyond the grant, by pod", Unit: "bytes",
				Description: "GPU memory each pod's leases use beyond what they were granted: above 0 they squeeze their neighbours.",
				Targets: []Target{{
					Expr:   `sum by (namespace, pod) (bitfusion_lease_memory_overuse_bytes{<sel>, namespace=~"$namespace"})`,
					Legend: "{{namespace}}/{{pod}}",
				}},
			}, {
				Kind: Timeseries, Title: "Memory used and granted by app", Unit: "bytes",
				Description: "GPU memory the app's leases use and what they were granted.",
				Targets: []Target{{
					Expr:   `sum by (namespace, label_app) (bitfusion_lease_memory_used_bytes{<sel>, namespace=~"$namespace"})`,
					Legend: "{{namespace}}/{{label_app}} used",
				}, {
					Expr:   `sum by (namespace, label_app) (bitfusion_lease_memory_granted_bytes{<sel>, namespace=~"$namespace"})`,
					Legend: "{{namespace}}/{{label_app}} granted",
				}},
			}},
		}, {
			Title: "Leases",
			Panels: []Panel{{
				Kind: Table, Title: "Live leases", Unit: "short", Width: 16, Height: 10,
				Description: "Every live lease with its owner pod, its server and the GPU share it holds.",
				Targets: []Target{{
					Expr: `sum by (cluster, namespace, pod, lease, server) (
  bitfusion_lease_allocated_gpus{<sel>, namespace=~"$namespace"}
  * on (cluster, lease) group_left (pod) bitfusion_lease_info{<sel>}
)`,
					Legend: "GPUs held",
				}},
			}, {
				Kind: Timeseries, Title: "Leases ended", Unit: "cps", Width: 8, Height: 10,
				Description: "Leases released by their holders, and leases that expired because their holder stopped renewing " +
					"(all namespaces: these counters have no namespace label).",
				Targets: []Target{{
					Expr:   `sum(rate(bitfusion_lease_releases_total{<sel>}[$__rate_interval]))`,
					Legend: "released",
				}, {
					Expr:   `sum(rate(bitfusion_lease_expirations_total{<sel>}[$__rate_interval]))`,
					Legend: "expired",
				}},
			}},
		}},
	}
}
