package adapter

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/metrics/pkg/apis/external_metrics"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"
)

// externalGroup names the API in not-found errors.
var externalGroup = schema.GroupResource{Group: external_metrics.GroupName}

// Provider is the external-metrics provider: it asks the backend and
// guards what the HPA gets.
type Provider struct {
	backend Backend
	maxAge  time.Duration
	clock   func() time.Time
	log     *slog.Logger
	metrics *Metrics
}

// NewProvider serves backend's values no older than maxAge; clock is
// time.Now when nil.
func NewProvider(backend Backend, maxAge time.Duration, m *Metrics, clock func() time.Time, log *slog.Logger) *Provider {
	if clock == nil {
		clock = time.Now
	}
	return &Provider{backend: backend, maxAge: maxAge, clock: clock, log: log, metrics: m}
}

// Outcomes of a request, as counted in bitfusion_adapter_requests_total.
const (
	outcomeServed       = "served"
	outcomeStale        = "stale"
	outcomeNoData       = "no_data"
	outcomeUnknown      = "unknown_metric"
	outcomeInvalid      = "invalid_selector"
	outcomeBackendError = "backend_error"
)

// GetExternalMetric implements provider.ExternalMetricsProvider.
func (p *Provider) GetExternalMetric(ctx context.Context, namespace string, selector labels.Selector, info provider.ExternalMetricInfo) (*external_metrics.ExternalMetricValueList, error) {
	start := time.Now()
	name := info.Metric
	if !slices.Contains(MetricNames, name) {
		p.metrics.request(start, "", outcomeUnknown)
		return nil, provider.NewMetricNotFoundError(externalGroup, name)
	}
	if selector == nil {
		selector = labels.Everything()
	}
	values, err := p.Values(ctx, Query{Metric: name, Namespace: namespace, Selector: selector})
	var (
		invalid *SelectorError
		stale   *StaleError
		failed  *BackendError
	)
	switch {
	case errors.As(err, &invalid):
		p.metrics.request(start, name, outcomeInvalid)
		return nil, apierrors.NewBadRequest(invalid.Error())
	case errors.Is(err, ErrUnknownMetric): // the backend's queries leave it out
		p.metrics.request(start, name, outcomeUnknown)
		return nil, provider.NewMetricNotFoundError(externalGroup, name)
	case errors.As(err, &failed):
		p.metrics.request(start, name, outcomeBackendError)
		return nil, apierrors.NewInternalError(failed)
	case errors.Is(err, ErrNoData):
		p.metrics.request(start, name, outcomeNoData)
		return nil, provider.NewMetricNotFoundForSelectorError(externalGroup, name, namespace, selector)
	case errors.As(err, &stale):
		p.metrics.request(start, name, outcomeStale)
		return nil, apierrors.NewServiceUnavailable(stale.Error())
	case err != nil:
		return nil, err // Values answers with the errors above alone
	}
	now := p.clock()
	list := &external_metrics.ExternalMetricValueList{}
	oldest := time.Duration(0)
	for _, v := range values {
		oldest = max(oldest, now.Sub(v.Time))
		list.Items = append(list.Items, external_metrics.ExternalMetricValue{
			MetricName:   name,
			MetricLabels: v.Labels,
			Timestamp:    metav1.NewTime(v.Time),
			Value:        *quantity(v.Value),
		})
	}
	p.metrics.request(start, name, outcomeServed)
	p.metrics.served(name, namespace, selector.String(), values, oldest, now)
	return list, nil
}

// Values asks the backend for q and returns its values if every one is
// there and no older than the maximum age; the external metrics API and
// KEDA's external scaler (adapter/kedascaler) both serve through it. Its
// errors say why not, each a case of its own for the caller to map to its
// protocol: *SelectorError (a selector the backend cannot express: the
// caller's), ErrUnknownMetric (a metric the backend does not serve),
// *BackendError (the backend failed: counted and logged here), ErrNoData,
// *StaleError.
func (p *Provider) Values(ctx context.Context, q Query) ([]Value, error) {
	values, err := p.backend.Query(ctx, q)
	var invalid *SelectorError
	switch {
	case errors.As(err, &invalid), errors.Is(err, ErrUnknownMetric):
		return nil, err
	case err != nil:
		p.metrics.backendErrors.WithLabelValues(p.backend.Name()).Inc()
		p.log.Error("backend failed", "backend", p.backend.Name(), "metric", q.Metric, "namespace", q.Namespace, "selector", q.Selector.String(), "err", err)
		return nil, &BackendError{Backend: p.backend.Name(), Metric: q.Metric, Err: err}
	case len(values) == 0:
		// Often the steady state, not a fault: a workload KEDA scaled to
		// zero has no lease, and KEDA asks about it every second.
		p.log.Debug("no data", "metric", q.Metric, "namespace", q.Namespace, "selector", q.Selector.String())
		return nil, ErrNoData
	}
	now := p.clock()
	for _, v := range values {
		if age := now.Sub(v.Time); age > p.maxAge {
			p.log.Warn("stale value refused", "metric", q.Metric, "namespace", q.Namespace, "selector", q.Selector.String(),
				"age", age.Round(time.Millisecond), "max_age", p.maxAge)
			return nil, &StaleError{Metric: q.Metric, Namespace: q.Namespace, Selector: q.Selector.String(), Age: age, MaxAge: p.maxAge, Unsampled: v.Time.IsZero()}
		}
	}
	return values, nil
}

// quantity writes v with at least three significant digits, in the
// coarsest of units, milli, micro or nano that holds them: 0.7346 ->
// "735m", 31.2 us -> "31200n" (the HPA compares at the milli, too coarse
// for a latency in seconds).
func quantity(v float64) *resource.Quantity {
	for _, scale := range []resource.Scale{0, resource.Milli, resource.Micro} {
		if scaled := math.Abs(v) / math.Pow10(int(scale)); scaled >= 100 {
			return resource.NewScaledQuantity(int64(math.Round(v/math.Pow10(int(scale)))), scale)
		}
	}
	return resource.NewScaledQuantity(int64(math.Round(v*1e9)), resource.Nano)
}

// ListAllExternalMetrics implements provider.ExternalMetricsProvider.
func (p *Provider) ListAllExternalMetrics() []provider.ExternalMetricInfo {
	out := make([]provider.ExternalMetricInfo, len(MetricNames))
	for i, m := range MetricNames {
		out[i] = provider.ExternalMetricInfo{Metric: m}
	}
	return out
}
