package metricdef

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestWithLeavesTheSharedSetAlone: extending a shared label set twice
// gives two sets, even when the shared one has room to grow in place.
func TestWithLeavesTheSharedSetAlone(t *testing.T) {
	shared := append(make(Labels, 0, 8), "server", "gpu")
	a, b := shared.With("type"), shared.With("reason")
	if !slices.Equal(a, Labels{"server", "gpu", "type"}) || !slices.Equal(b, Labels{"server", "gpu", "reason"}) ||
		!slices.Equal(shared, Labels{"server", "gpu"}) {
		t.Errorf("shared %v extended to %v and %v", shared, a, b)
	}
}

// rowCollector exports fixed series of rows.
type rowCollector []prometheus.Metric

func (c rowCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }
func (c rowCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c {
		ch <- m
	}
}

// TestRowsExportAsDeclared: a row's series carry its name, help, type and
// labels; WithPrefixed adds the labels named at start without changing
// the row.
func TestRowsExportAsDeclared(t *testing.T) {
	errors := Counter("test_errors_total", "errors", GPULabels.With("type"), "Errors by type.")
	lease := Gauge("test_lease_processes", "processes", Labels{"lease"}, "Processes of the lease.")
	lease.LabelPrefix = "label_"
	withApp := lease.WithPrefixed("app")
	if !slices.Equal(lease.Labels, Labels{"lease"}) || lease.LabelPrefix != "label_" {
		t.Errorf("WithPrefixed changed the row: %+v", lease)
	}
	c := rowCollector{
		errors.Metric(3, "gpu-a", "0", "H100", "corrected"),
		withApp.Metric(2, "lease-1", "tf-training"),
	}
	want := `
# HELP test_errors_total Errors by type.
# TYPE test_errors_total counter
test_errors_total{gpu="0",model="H100",server="gpu-a",type="corrected"} 3
# HELP test_lease_processes Processes of the lease.
# TYPE test_lease_processes gauge
test_lease_processes{label_app="tf-training",lease="lease-1"} 2
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// TestVecsFromRows: counters, gauges and histograms updated as things
// happen take their name, help, labels and buckets from the row.
func TestVecsFromRows(t *testing.T) {
	requests := Counter("test_requests_total", "requests", Labels{"outcome"}, "Requests by outcome.").NewCounterVec()
	requests.WithLabelValues("served").Inc()
	latency := Histogram("test_latency_seconds", "seconds", Labels{"transport"}, "Round trips.", []float64{0.1, 1}).NewHistogramVec()
	latency.WithLabelValues("tcp").Observe(0.5)
	leader := Gauge("test_leader", "0/1", nil, "1 while leading.").NewGaugeVec()
	leader.WithLabelValues().Set(1)
	want := `
# HELP test_latency_seconds Round trips.
# TYPE test_latency_seconds histogram
test_latency_seconds_bucket{transport="tcp",le="0.1"} 0
test_latency_seconds_bucket{transport="tcp",le="1"} 1
test_latency_seconds_bucket{transport="tcp",le="+Inf"} 1
test_latency_seconds_sum{transport="tcp"} 0.5
test_latency_seconds_count{transport="tcp"} 1
# HELP test_leader 1 while leading.
# TYPE test_leader gauge
test_leader 1
# HELP test_requests_total Requests by outcome.
# TYPE test_requests_total counter
test_requests_total{outcome="served"} 1
`
	reg := prometheus.NewRegistry()
	reg.MustRegister(requests, latency, leader)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
