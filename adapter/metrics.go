package adapter

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/internal/metricdef"
)

// servedForget is how long a (metric, namespace, selector) nobody asks
// for any more keeps its served-value series.
const servedForget = 10 * time.Minute

// The adapter's table: Metrics builds its series from these rows, and
// docs/metrics.md's adapter section is checked against it.
var (
	servedLabels = metricdef.Labels{"metric", "namespace", "selector", "value_labels"}

	requestsTotal = metricdef.Counter("bitfusion_adapter_requests_total", "requests", metricdef.Labels{"metric", "outcome"},
		"External-metric requests answered, by metric and outcome (served, stale, no_data, unknown_metric, invalid_selector, backend_error).")
	requestDuration = metricdef.Histogram("bitfusion_adapter_request_duration_seconds", "seconds", metricdef.Labels{"metric"},
		"Time to answer an external-metric request, backend included, by metric.",
		prometheus.ExponentialBuckets(0.0001, 2, 16))
	backendErrorsTotal = metricdef.Counter("bitfusion_adapter_backend_errors_total", "queries", metricdef.Labels{"backend"},
		"Backend queries that failed, by backend (direct, prometheus).")
	servedValue = metricdef.Gauge("bitfusion_adapter_served_value", "the metric's", servedLabels,
		"The value last served to the HPA, by metric, namespace, selector and the value's own labels (joined).")
	servedAge = metricdef.Gauge("bitfusion_adapter_served_value_age_seconds", "seconds", servedLabels,
		"Age of the oldest reading behind the value last served.")
)

// MetricFamilies is the table of the adapter's own metrics.
var MetricFamilies = []*metricdef.Family{requestsTotal, requestDuration, backendErrorsTotal, servedValue, servedAge}

// Metrics are the adapter's own metrics: what it was asked, how fast it
// answered, and what it served.
type Metrics struct {
	requests      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	backendErrors *prometheus.CounterVec

	mu          sync.Mutex
	servedByKey map[servedKey]servedEntry
}

type servedKey struct{ metric, namespace, selector, labels string }

type servedEntry struct {
	value float64
	age   time.Duration
	at    time.Time
}

// NewMetrics registers the adapter's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests:      requestsTotal.NewCounterVec(),
		duration:      requestDuration.NewHistogramVec(),
		backendErrors: backendErrorsTotal.NewCounterVec(),
		servedByKey:   map[servedKey]servedEntry{},
	}
	reg.MustRegister(m.requests, m.duration, m.backendErrors, m)
	return m
}

func (m *Metrics) request(start time.Time, metric, outcome string) {
	m.requests.WithLabelValues(metric, outcome).Inc()
	if metric != "" {
		m.duration.WithLabelValues(metric).Observe(time.Since(start).Seconds())
	}
}

func (m *Metrics) served(metric, namespace, selector string, values []Value, oldest time.Duration, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, v := range values {
		k := servedKey{metric, namespace, selector, joinLabels(v.Labels)}
		m.servedByKey[k] = servedEntry{value: v.Value, age: oldest, at: now}
	}
	for k, e := range m.servedByKey {
		if now.Sub(e.at) > servedForget {
			delete(m.servedByKey, k)
		}
	}
}

// Describe implements prometheus.Collector (for the served values).
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- servedValue.Desc()
	ch <- servedAge.Desc()
}

// Collect implements prometheus.Collector (for the served values).
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, e := range m.servedByKey {
		ch <- servedValue.Metric(e.value, k.metric, k.namespace, k.selector, k.labels)
		ch <- servedAge.Metric(e.age.Seconds(), k.metric, k.namespace, k.selector, k.labels)
	}
}
