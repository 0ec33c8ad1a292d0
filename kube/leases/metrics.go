package leases

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/internal/metricdef"
)

// The controller's table: its series are built from these rows, and
// docs/metrics.md's lease controller section is checked against them.
var (
	reconcilesTotal = metricdef.Counter("bitfusion_lease_controller_reconciles_total", "reconciles", metricdef.Labels{"kind", "result"},
		"Items reconciled, by kind (pod, node, quota, resync, idle) and result (success, error: retried with backoff).")
	releasesTotal = metricdef.Counter("bitfusion_lease_controller_releases_total", "leases", metricdef.Labels{"reason"},
		"Pod leases released, by reason (pod_deleted, pod_succeeded, pod_failed, node_deleted, pod_unbound: a lease the scheduler took for a pod never bound).")
	reacquisitionsTotal = metricdef.Counter("bitfusion_lease_controller_reacquisitions_total", "leases", metricdef.Labels{"outcome"},
		"Bound pods whose lease was gone, by outcome of acquiring it again on their node (granted, refused).")
	leader = metricdef.Gauge("bitfusion_lease_controller_leader", "", nil,
		"1 while this replica reconciles (the leader, or the only replica without --leader-elect), 0 while it stands by: one replica of the controller's should say 1.")
)

// MetricFamilies is the table of the controller's metrics.
var MetricFamilies = []*metricdef.Family{reconcilesTotal, releasesTotal, reacquisitionsTotal, leader}

// Results and outcomes, as the metrics label them.
const (
	resultSuccess  = "success"
	resultError    = "error"
	outcomeGranted = "granted"
	outcomeRefused = "refused"
)

type metrics struct {
	reconciles     *prometheus.CounterVec
	releases       *prometheus.CounterVec
	reacquisitions *prometheus.CounterVec
	leader         prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		reconciles:     reconcilesTotal.NewCounterVec(),
		releases:       releasesTotal.NewCounterVec(),
		reacquisitions: reacquisitionsTotal.NewCounterVec(),
		leader:         prometheus.NewGauge(prometheus.GaugeOpts{Name: leader.Name, Help: leader.Help}),
	}
	for _, c := range []prometheus.Collector{m.reconciles, m.releases, m.reacquisitions, m.leader} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// reconciled counts one reconcile of an item of kind.
func (m *metrics) reconciled(kind itemKind, err error) {
	result := resultSuccess
	if err != nil {
		result = resultError
	}
	m.reconciles.WithLabelValues(string(kind), result).Inc()
}
