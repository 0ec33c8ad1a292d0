// Package adapter serves the pool's signals to the HorizontalPodAutoscaler
// as external metrics (external.metrics.k8s.io/v1beta1), on
// sigs.k8s.io/custom-metrics-apiserver.
//
// A Backend answers a Query (metric, namespace, label selector) with
// Values; the Provider checks them before the HPA sees them: a value older
// than the maximum age, or no value at all, is an error to the HPA (which
// then holds its size), never a zero. Two backends exist: Direct reads the
// allocator's leases and the GPU-server daemons' latest rounds (no
// Prometheus needed), Prometheus runs PromQL templates.
package adapter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/labels"
)

// The external metrics served. Each is for a namespace and a label
// selector; see docs/adapter.md for what the selector selects.
const (
	// GPUUtilization is the SM use of the selected leases' GPU shares
	// relative to those shares (0..1): 0.5 = half of what they hold.
	GPUUtilization = "bitfusion_gpu_utilization"
	// MemoryPressure is the GPU memory the selected leases use over what
	// they were granted (above 1 when they overuse it).
	MemoryPressure = "bitfusion_memory_pressure"
	// RDMALatency is the 99th percentile of the round trips measured over
	// the last 5 minutes by the GPU servers that hold the selected leases,
	// one value per transport.
	RDMALatency = "bitfusion_rdma_latency_seconds"
	// PoolUnallocatedGPUs is the free GPU share of healthy GPUs on schedulable
	// servers, one value per GPU model; the selector selects by model.
	PoolUnallocatedGPUs = "bitfusion_pool_unallocated_gpus"
	// PendingRequests is the lease requests of the namespace queued for
	// capacity or quota whose owners carry the selector's labels.
	PendingRequests = "bitfusion_lease_pending_requests"
	// IdleHeldShare is the share of the selected leases' GPUs held by
	// leases the allocator measured idle for their namespace's whole
	// window (0..1; 1 = every selected lease idle). KEDA's external scaler
	// serves it (adapter/kedascaler), and decides activity from it; the
	// external metrics API does not (MetricNames), nor does the Prometheus
	// backend, which holds no idle verdict per lease owner.
	IdleHeldShare = "bitfusion_idle_held_share"
)

// MetricNames lists the metric names served, in documentation order.
var MetricNames = []string{GPUUtilization, MemoryPressure, RDMALatency, PoolUnallocatedGPUs, PendingRequests}

// LatencyQuantile is RDMALatency's quantile, both backends': the tail the
// Bitfusion budget (50 us) is about. Its window is the daemon's
// (gpuserver.LatencyWindow) for the direct backend and a recording rule's
// for the Prometheus one; alerts/alerts_test.go pins that they agree.
const LatencyQuantile = 0.99

// Query asks a backend for one metric.
type Query struct {
	Metric    string
	Namespace string
	// Selector selects the leases by their owner pod's labels (for
	// PoolUnallocatedGPUs: the GPUs by model). Never nil: labels.Everything().
	Selector labels.Selector
}

// Value is one answer to a query.
type Value struct {
	// Labels tell values of one query apart (model, transport).
	Labels map[string]string
	Value  float64
	// Time is when the oldest reading behind the value was taken.
	Time time.Time
}

// Backend answers queries. No data is an empty answer, not an error; an
// error means the backend itself failed.
type Backend interface {
	Name() string
	Query(ctx context.Context, q Query) ([]Value, error)
}

// ErrUnknownMetric is a backend's answer for a metric it does not serve.
var ErrUnknownMetric = errors.New("unknown metric")

// ErrNoData is Provider.Values' answer when the backend has no value:
// nothing is selected, or what is selected was not measured.
var ErrNoData = errors.New("no data")

// StaleError is Provider.Values' answer when a value is older than the
// maximum age, or rests on a source not sampled yet.
type StaleError struct {
	Metric, Namespace, Selector string
	Age, MaxAge                 time.Duration
	// Unsampled: the value rests on a source not sampled yet.
	Unsampled bool
}

func (e *StaleError) Error() string {
	why := fmt.Sprintf("is %s old, more than --max-age=%s", e.Age.Round(time.Second), e.MaxAge)
	if e.Unsampled {
		why = "rests on a source not sampled yet"
	}
	return fmt.Sprintf("%s for namespace %q selector %q %s", e.Metric, e.Namespace, e.Selector, why)
}

// BackendError is Provider.Values' answer when the backend failed. Its
// text is for the client: the cause (Err) is in the adapter's log.
type BackendError struct {
	Backend, Metric string
	Err             error
}

func (e *BackendError) Error() string {
	return fmt.Sprintf("the %s backend failed for %s (the adapter's log says why)", e.Backend, e.Metric)
}

func (e *BackendError) Unwrap() error { return e.Err }

// SelectorError is a backend's answer for a selector it cannot express:
// the caller's mistake, a 400.
type SelectorError struct {
	Selector, Key, Operator, Limit string
}

func (e *SelectorError) Error() string {
	return fmt.Sprintf("labelSelector %q: %s %s %s", e.Selector, e.Key, e.Operator, e.Limit)
}
