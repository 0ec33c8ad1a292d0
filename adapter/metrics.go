package adapter

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// servedForget is how long a (metric, namespace, selector) nobody asks
// for any more keeps its served-value series.
const servedForget = 10 * time.Minute

// Metrics are the adapter's own metrics: what it was asked, how fast it
// answered, and what it served.
type Metrics struct {
	requests      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	backendErrors *prometheus.CounterVec

	servedValue, servedAge *prometheus.Desc
	mu                     sync.Mutex
	servedByKey            map[servedKey]servedEntry
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
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bitfusion_adapter_requests_total",
			Help: "External-metric requests answered, by metric and outcome (served, stale, no_data, unknown_metric, invalid_selector, backend_error).",
		}, []string{"metric", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "bitfusion_adapter_request_duration_seconds",
			Help:    "Time to answer an external-metric request, backend included, by metric.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"metric"}),
		backendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bitfusion_adapter_backend_errors_total",
			Help: "Backend queries that failed, by backend (direct, prometheus).",
		}, []string{"backend"}),
		servedValue: prometheus.NewDesc("bitfusion_adapter_served_value",
			"The value last served to the HPA, by metric, namespace, selector and the value's own labels (joined).",
			[]string{"metric", "namespace", "selector", "value_labels"}, nil),
		servedAge: prometheus.NewDesc("bitfusion_adapter_served_value_age_seconds",
			"Age of the oldest reading behind the value last served.",
			[]string{"metric", "namespace", "selector", "value_labels"}, nil),
		servedByKey: map[servedKey]servedEntry{},
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
	ch <- m.servedValue
	ch <- m.servedAge
}

// Collect implements prometheus.Collector (for the served values).
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, e := range m.servedByKey {
		ch <- prometheus.MustNewConstMetric(m.servedValue, prometheus.GaugeValue, e.value, k.metric, k.namespace, k.selector, k.labels)
		ch <- prometheus.MustNewConstMetric(m.servedAge, prometheus.GaugeValue, e.age.Seconds(), k.metric, k.namespace, k.selector, k.labels)
	}
}
