package adapter

import (
	"context"
	"errors"
	"fmt"
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
	q := Query{Metric: name, Namespace: namespace, Selector: selector}
	values, err := p.backend.Query(ctx, q)
	var invalid *SelectorError
	switch {
	case errors.As(err, &invalid):
		p.metrics.request(start, name, outcomeInvalid)
		return nil, apierrors.NewBadRequest(invalid.Error())
	case errors.Is(err, errUnknownMetric): // the backend's queries leave it out
		p.metrics.request(start, name, outcomeUnknown)
		return nil, provider.NewMetricNotFoundError(externalGroup, name)
	case err != nil:
		p.metrics.request(start, name, outcomeBackendError)
		p.metrics.backendErrors.WithLabelValues(p.backend.Name()).Inc()
		p.log.Error("backend failed", "backend", p.backend.Name(), "metric", name, "namespace", namespace, "selector", selector.String(), "err", err)
		return nil, apierrors.NewInternalError(fmt.Errorf("the %s backend failed for %s (the adapter's log says why)", p.backend.Name(), name))
	}
	if len(values) == 0 {
		p.metrics.request(start, name, outcomeNoData)
		p.log.Warn("no data", "metric", name, "namespace", namespace, "selector", selector.String())
		return nil, provider.NewMetricNotFoundForSelectorError(externalGroup, name, namespace, selector)
	}
	now := p.clock()
	list := &external_metrics.ExternalMetricValueList{}
	oldest := time.Duration(0)
	for _, v := range values {
		age := now.Sub(v.Time)
		oldest = max(oldest, age)
		if age > p.maxAge {
			p.metrics.request(start, name, outcomeStale)
			p.log.Warn("stale value refused", "metric", name, "namespace", namespace, "selector", selector.String(),
				"age", age.Round(time.Millisecond), "max_age", p.maxAge)
			why := fmt.Sprintf("is %s old, more than --max-age=%s", age.Round(time.Second), p.maxAge)
			if v.Time.IsZero() {
				why = "rests on a source not sampled yet"
			}
			return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("%s for namespace %q selector %q %s", name, namespace, selector.String(), why))
		}
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
