package dashboards

// autoscaling is the HPA loop on gpupool's signals: what the
// external-metrics adapter served, how fast and how fresh, and what the
// HPAs did with it.
func autoscaling() Dashboard {
	return Dashboard{
		Name:  "autoscaling",
		Title: "Autoscaling",
		Description: "The external-metrics adapter (gpupool-adapter): the values it served the HPAs and their age, " +
			"its latency and errors, and the HPAs' replicas from kube-state-metrics.",
		Variables: []Variable{{Label: "namespace", Series: `bitfusion_adapter_served_value{<sel>}`}},
		Rows: []Row{{
			Title: "Served to the HPA",
			Panels: []Panel{{
				Kind: Timeseries, Title: "Value served", Unit: "short",
				Description: "The value last served per metric, namespace and selector (kept 10 minutes after the last request).",
				Targets: []Target{{
					Expr:   `bitfusion_adapter_served_value{<sel>, namespace=~"$namespace"}`,
					Legend: "{{metric}} {{namespace}} {{selector}} {{value_labels}}",
				}},
			}, {
				Kind: Timeseries, Title: "Age of the value served", Unit: "s",
				Description: "Age of the oldest reading behind the value served. " +
					"Past the adapter's --max-age (30 s by default) it answers stale and the HPA holds its size.",
				Targets: []Target{{
					Expr:   `bitfusion_adapter_served_value_age_seconds{<sel>, namespace=~"$namespace"}`,
					Legend: "{{metric}} {{namespace}} {{selector}} {{value_labels}}",
				}},
			}},
		}, {
			Title: "Adapter",
			Panels: []Panel{{
				Kind: Timeseries, Title: "Requests by outcome", Unit: "reqps", Width: 8,
				Description: "External-metric requests answered, by metric and outcome (all namespaces).",
				Targets: []Target{{
					Expr:   `sum by (metric, outcome) (rate(bitfusion_adapter_requests_total{<sel>}[$__rate_interval]))`,
					Legend: "{{metric}} {{outcome}}",
				}},
			}, {
				Kind: Timeseries, Title: "Latency", Unit: "s", Width: 8,
				Description: "Time to answer an external-metric request, backend included.",
				Targets: []Target{{
					Expr:   `histogram_quantile(0.99, sum by (le, metric) (rate(bitfusion_adapter_request_duration_seconds_bucket{<sel>}[$__rate_interval])))`,
					Legend: "{{metric}} p99",
				}, {
					Expr:   `histogram_quantile(0.5, sum by (le, metric) (rate(bitfusion_adapter_request_duration_seconds_bucket{<sel>}[$__rate_interval])))`,
					Legend: "{{metric}} p50",
				}},
			}, {
				Kind: Timeseries, Title: "Errors", Unit: "reqps", Width: 8,
				Description: "Requests not served (stale, no_data, unknown_metric, invalid_selector, backend_error) and failed backend queries; " +
					"the HPA holds its size meanwhile. The backend's cause is in the adapter's log.",
				Targets: []Target{{
					Expr:       `sum by (metric, outcome) (rate(bitfusion_adapter_requests_total{<sel>, outcome!="served"}[$__rate_interval]))`,
					Legend:     "{{metric}} {{outcome}}",
					MayBeEmpty: onlyDuringFault("a value too old, a selector matching no lease, an unknown metric or a failed backend"),
				}, {
					Expr:       `sum by (backend) (rate(bitfusion_adapter_backend_errors_total{<sel>}[$__rate_interval]))`,
					Legend:     "{{backend}} backend",
					MayBeEmpty: onlyDuringFault("the allocator, a daemon or Prometheus not answering the adapter"),
				}},
			}},
		}, {
			Title: "HPAs",
			Panels: []Panel{{
				Kind: Timeseries, Title: "Replicas", Unit: "short", Width: 24,
				Description: "Replicas each HPA that scales on a gpupool metric (bitfusion_*) wants and has, and its maximum, from kube-state-metrics.",
				Targets: []Target{{
					Expr: `kube_horizontalpodautoscaler_status_desired_replicas{<ksm>, namespace=~"$namespace"}
  and on (cluster, namespace, horizontalpodautoscaler) kube_horizontalpodautoscaler_spec_target_metric{<ksm>, metric_name=~"bitfusion_.*"}`,
					Legend:     "{{namespace}}/{{horizontalpodautoscaler}} desired",
					MayBeEmpty: fromKSM,
				}, {
					Expr: `kube_horizontalpodautoscaler_status_current_replicas{<ksm>, namespace=~"$namespace"}
  and on (cluster, namespace, horizontalpodautoscaler) kube_horizontalpodautoscaler_spec_target_metric{<ksm>, metric_name=~"bitfusion_.*"}`,
					Legend:     "{{namespace}}/{{horizontalpodautoscaler}} current",
					MayBeEmpty: fromKSM,
				}, {
					Expr: `kube_horizontalpodautoscaler_spec_max_replicas{<ksm>, namespace=~"$namespace"}
  and on (cluster, namespace, horizontalpodautoscaler) kube_horizontalpodautoscaler_spec_target_metric{<ksm>, metric_name=~"bitfusion_.*"}`,
					Legend:     "{{namespace}}/{{horizontalpodautoscaler}} max",
					MayBeEmpty: fromKSM,
				}},
			}},
		}},
	}
}
