// Package dashboards defines gpupool's Grafana dashboards as data (what
// each panel shows, and why a query may be empty against the demo, which
// the tests read) and renders them with grafana-foundation-sdk's builders
// as Grafana JSON, plus a kustomization that ships each one as a
// ConfigMap for the Grafana sidecar. `go run ./dashboards/gen` writes the files; `-check` (and `make
// verify-generated`) fails when the committed ones differ.
//
// Queries are PromQL with three placeholders, expanded by a Config:
// `<sel>` in every selector of gpupool's own series and `<ksm>` in every
// selector of kube-state-metrics' series expand to the cluster matcher
// plus the configured selector, so no query hard-codes a job; `<rule>` in
// every selector of a series that alerts/gpupool-rules.yaml records
// expands to the cluster matcher alone: the rules read every series the
// Prometheus holds, as the alerts do, and some aggregate the job away.
package dashboards

import (
	"fmt"
	"strings"
)

// Config adapts the dashboards to how Prometheus scrapes gpupool.
type Config struct {
	// Selector is added to every selector of gpupool's series, e.g.
	// `job=~"gpupool-.*"`; empty selects them wherever they come from.
	Selector string
	// KubeStateMetricsSelector is added to every selector of
	// kube-state-metrics' series, e.g. `job="kube-state-metrics"`.
	KubeStateMetricsSelector string
}

// clusterMatcher selects the dashboard's $cluster. Its "All" is the regex
// `.*`, which also matches series without a cluster label: gpupool's own
// series have none until a multi-cluster Prometheus adds it.
const clusterMatcher = `cluster=~"$cluster"`

// expand replaces the placeholders of a query with the matchers.
func (c Config) expand(query string) string {
	return strings.NewReplacer("<sel>", withCluster(c.Selector), "<ksm>", withCluster(c.KubeStateMetricsSelector),
		"<rule>", clusterMatcher).Replace(query)
}

func withCluster(selector string) string {
	if selector == "" {
		return clusterMatcher
	}
	return clusterMatcher + ", " + selector
}

// Dashboard is one Grafana dashboard. Every dashboard has the datasource
// and cluster variables; Variables are added after them.
type Dashboard struct {
	// Name names the file (Name.json), the ConfigMap and the uid
	// (gpupool-Name), which stays stable so links and bookmarks do.
	Name        string
	Title       string
	Description string
	Variables   []Variable
	Rows        []Row
}

// UID is the dashboard's Grafana uid.
func (d Dashboard) UID() string { return "gpupool-" + d.Name }

// variablesOf returns the dashboard's query variables: cluster first,
// which filters on nothing but the selector, then the dashboard's own.
func (c Config) variablesOf(d Dashboard) []Variable {
	cluster := Variable{Label: "cluster", Series: "bitfusion_gpu_info{" + c.Selector + "}",
		MayBeEmpty: "gpupool's series carry no cluster label; a multi-cluster Prometheus adds it"}
	return append([]Variable{cluster}, d.Variables...)
}

// Variable is a template variable named after Label, whose values are
// the values of Label on the series Series selects (Grafana's
// label_values). It offers "All" (the regex `.*`) and several values at
// once, so queries use it as `label=~"$label"`.
type Variable struct {
	Label  string
	Series string // a series selector, with placeholders
	// MayBeEmpty says why the demo's series may lack Label.
	MayBeEmpty string
}

// Row is a titled row of panels, laid out left to right and wrapped at
// the dashboard's width.
type Row struct {
	Title  string
	Panels []Panel
}

// Kind is a Grafana panel type.
type Kind string

// The panel types the dashboards use.
const (
	Timeseries Kind = "timeseries"
	Stat       Kind = "stat"
	Heatmap    Kind = "heatmap" // targets are histogram buckets by le
	Table      Kind = "table"   // one instant query, a row per series
	BarGauge   Kind = "bargauge"
)

// Panel is one panel.
type Panel struct {
	Kind        Kind
	Title       string
	Description string
	// Unit is a Grafana unit id: percentunit (0..1), bytes, s, celsius,
	// watt, cps (per second), reqps, short.
	Unit string
	// Max bounds the axis or gauge; 0 leaves it to Grafana.
	Max float64
	// Steps colour values from Value up (above green); for stats and
	// gauges.
	Steps   []Step
	Targets []Target
	// Width (of 24) and Height in grid units; 0 takes the kind's default.
	Width, Height int
}

// Step is a threshold: values from Value up take Color.
type Step struct {
	Value float64
	Color string
}

// Target is one query of a panel.
type Target struct {
	Expr string
	// Legend names each series (Grafana's legendFormat, `{{label}}`); in
	// a table it heads the value column.
	Legend string
	// MayBeEmpty says why the query may return nothing against the demo
	// (`gpupool-demo`); empty means it must return data there, which the
	// tests check.
	MayBeEmpty string
}

// Reasons a query may return nothing against the demo.
const (
	needsRDMA = "needs RDMA hardware (/sys/class/infiniband)"
	fromKSM   = "from kube-state-metrics, which the demo does not run"
)

// onlyDuringFault is the reason of a query that has data only while
// something fails.
func onlyDuringFault(what string) string { return fmt.Sprintf("only during a fault: %s", what) }
