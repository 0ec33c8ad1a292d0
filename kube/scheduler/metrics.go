package scheduler

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/internal/metricdef"
)

// The placer's table: it builds its series from these rows, and
// docs/metrics.md's extender section is checked against them. The names
// keep "extender", which dashboards and alerts query, though the plugin
// counts its calls in them too.
var (
	requestsTotal = metricdef.Counter("bitfusion_extender_requests_total", "requests", metricdef.Labels{"verb", "result"},
		"kube-scheduler's calls answered, by verb (filter, bind) and result (placed, unschedulable, bound, error).")
	requestDuration = metricdef.Histogram("bitfusion_extender_request_duration_seconds", "seconds", metricdef.Labels{"verb"},
		"Time to answer a kube-scheduler call, the allocator's and kube-apiserver's answers included, by verb.",
		prometheus.ExponentialBuckets(0.0005, 2, 14))
	unboundReleasedTotal = metricdef.Counter("bitfusion_extender_unbound_leases_released_total", "leases", nil,
		"Leases a filter took that were released because their pod was not bound within --unbound-lease-timeout: kube-scheduler's cycle failed after the filter.")
	unboundWaiting = metricdef.Gauge("bitfusion_extender_leases_awaiting_bind", "leases", nil,
		"Pods holding a lease from a filter whose bind has not come yet.")
)

// MetricFamilies is the table of the placer's metrics.
var MetricFamilies = []*metricdef.Family{requestsTotal, requestDuration, unboundReleasedTotal, unboundWaiting}

// result is how a call ended, as bitfusion_extender_requests_total counts it.
type result string

const (
	// resultPlaced is a filter that answered the lease's node.
	resultPlaced result = "placed"
	// resultUnschedulable is a filter that failed every node with the
	// pool's reason: no capacity, quota, a request it refuses, or no
	// request.
	resultUnschedulable result = "unschedulable"
	// resultBound is a bind that bound the pod.
	resultBound result = "bound"
	// resultError is a call answered with an error: the allocator or
	// kube-apiserver did not answer, or the call was malformed.
	resultError result = "error"
)

// The verbs, as kube-scheduler's extender configuration names them
// (filterVerb, bindVerb) and the paths the extender serves; the plugin's
// acquisitions count as filters.
const (
	VerbFilter = "filter"
	VerbBind   = "bind"
)

// verbResults are the results each verb can end with; their series exist
// from the start, so that a rate over them is never missing.
var verbResults = map[string][]result{
	VerbFilter: {resultPlaced, resultUnschedulable, resultError},
	VerbBind:   {resultBound, resultError},
}

type metrics struct {
	requests        *prometheus.CounterVec
	duration        *prometheus.HistogramVec
	unboundReleased prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, waiting func() int) *metrics {
	released := unboundReleasedTotal.NewCounterVec()
	m := &metrics{requests: requestsTotal.NewCounterVec(), duration: requestDuration.NewHistogramVec(), unboundReleased: released.WithLabelValues()}
	for verb, results := range verbResults {
		for _, r := range results {
			m.requests.WithLabelValues(verb, string(r))
		}
		m.duration.WithLabelValues(verb)
	}
	reg.MustRegister(m.requests, m.duration, released, waitingCollector(waiting))
	return m
}

// CountUnreadable counts a call to verb, begun at start, that a front end
// answered with an error before it reached the placer: a body it could
// not read, or arguments kube-scheduler was configured wrongly for.
func (p *Placer) CountUnreadable(verb string, start time.Time) {
	p.metrics.answered(verb, resultError, start)
}

func (m *metrics) answered(verb string, r result, start time.Time) {
	m.requests.WithLabelValues(verb, string(r)).Inc()
	m.duration.WithLabelValues(verb).Observe(time.Since(start).Seconds())
}

// waitingCollector reports bitfusion_extender_leases_awaiting_bind.
type waitingCollector func() int

func (w waitingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- unboundWaiting.Desc() }

func (w waitingCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- unboundWaiting.Metric(float64(w()))
}
