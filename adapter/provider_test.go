package adapter

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"

	"github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/internal/metricstest"
)

// fakeBackend answers every query with the same values or error.
type fakeBackend struct {
	values []Value
	err    error
	asked  Query
}

func (*fakeBackend) Name() string { return "fake" }
func (f *fakeBackend) Query(_ context.Context, q Query) ([]Value, error) {
	f.asked = q
	return f.values, f.err
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// askAsTheHPA asks a provider over backend for tf-training's GPU
// utilization in namespace ml, with the 30 s age limit the adapter runs
// with, as the HPA would, and returns its error.
func askAsTheHPA(backend Backend) error {
	p := NewProvider(backend, 30*time.Second, NewMetrics(prometheus.NewRegistry()), nil, quietLog())
	_, err := p.GetExternalMetric(context.Background(), "ml", labels.SelectorFromSet(labels.Set{"app": "tf-training"}),
		provider.ExternalMetricInfo{Metric: GPUUtilization})
	return err
}

// TestProviderNeverServesMadeUpValues: a value is served only when it is
// there and fresh; otherwise the HPA gets an error that says why, with
// the status it acts on, and the outcome is counted.
func TestProviderNeverServesMadeUpValues(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	sel := labels.SelectorFromSet(labels.Set{"app": "tf-training"})
	for _, tc := range []struct {
		name    string
		metric  string
		backend fakeBackend
		status  int // 0: served
		outcome string
		value   string
	}{
		{"fresh", GPUUtilization, fakeBackend{values: []Value{{Value: 0.7346, Time: now.Add(-2 * time.Second)}}}, 0, outcomeServed, "735m"},
		{"at the limit", GPUUtilization, fakeBackend{values: []Value{{Value: 1, Time: now.Add(-30 * time.Second)}}}, 0, outcomeServed, "1"},
		{"stale", GPUUtilization, fakeBackend{values: []Value{{Value: 0.5, Time: now.Add(-31 * time.Second)}}}, http.StatusServiceUnavailable, outcomeStale, ""},
		{"one of several stale", PoolUnallocatedGPUs, fakeBackend{values: []Value{{Value: 2, Time: now}, {Value: 1, Time: now.Add(-time.Minute)}}}, http.StatusServiceUnavailable, outcomeStale, ""},
		{"no data", MemoryPressure, fakeBackend{}, http.StatusNotFound, outcomeNoData, ""},
		{"backend down", RDMALatency, fakeBackend{err: errors.New("connection refused")}, http.StatusInternalServerError, outcomeBackendError, ""},
		{"unknown metric", "bitfusion_gpu_util", fakeBackend{}, http.StatusNotFound, outcomeUnknown, ""},
		{"metric the backend leaves out", PendingRequests, fakeBackend{err: ErrUnknownMetric}, http.StatusNotFound, outcomeUnknown, ""},
		{"selector the backend cannot express", GPUUtilization, fakeBackend{err: &SelectorError{Selector: "gpus>2", Key: "gpus", Operator: ">", Limit: "has no PromQL label matcher"}},
			http.StatusBadRequest, outcomeInvalid, ""},
		{"latency in seconds", RDMALatency, fakeBackend{values: []Value{{Value: 31.2e-6, Time: now}}}, 0, outcomeServed, "31200n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMetrics(prometheus.NewRegistry())
			p := NewProvider(&tc.backend, 30*time.Second, m, func() time.Time { return now }, quietLog())
			list, err := p.GetExternalMetric(context.Background(), "ml", sel, provider.ExternalMetricInfo{Metric: tc.metric})
			countedAs := tc.metric
			if !slices.Contains(MetricNames, tc.metric) {
				countedAs = "" // names the adapter does not serve are not labels
			}
			counted := testutil.ToFloat64(m.requests.WithLabelValues(countedAs, tc.outcome))
			if counted != 1 {
				t.Errorf("requests_total{outcome=%q} = %v, want 1", tc.outcome, counted)
			}
			if tc.status != 0 {
				var status apierrors.APIStatus
				if !errors.As(err, &status) || int(status.Status().Code) != tc.status {
					t.Fatalf("err = %v, want an API status %d", err, tc.status)
				}
				if list != nil {
					t.Errorf("served %v along with the error", list)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Items) == 0 || list.Items[0].Value.String() != tc.value {
				t.Fatalf("served %+v, want value %s", list.Items, tc.value)
			}
			if tc.backend.asked.Namespace != "ml" || tc.backend.asked.Selector.String() != "app=tf-training" {
				t.Errorf("backend asked %+v", tc.backend.asked)
			}
		})
	}
}

func TestQuantityKeepsThreeDigits(t *testing.T) {
	for v, want := range map[float64]string{
		0.7346: "735m", 0: "0", 1: "1", 2.5: "2500m", 7: "7", 123.4: "123", 4.2e-5: "42u", 3.1e-7: "310n", 0.0123: "12300u",
	} {
		if got := quantity(v).String(); got != want {
			t.Errorf("quantity(%v) = %s, want %s", v, got, want)
		}
	}
}

// TestBucketQuantile follows histogram_quantile: linear within the
// bucket, from 0 in the first, the top finite bound beyond it.
func TestBucketQuantile(t *testing.T) {
	b := []api.Bucket{{UpperBound: 0.01, Count: 50}, {UpperBound: 0.02, Count: 90}, {UpperBound: 0.04, Count: 100}}
	for _, tc := range []struct {
		q     float64
		total uint64
		want  float64
	}{
		{0.5, 100, 0.01},
		{0.25, 100, 0.005},
		{0.7, 100, 0.015},
		{0.99, 100, 0.038},
		{0.99, 200, 0.04}, // half the observations are above the top bucket
	} {
		if got := bucketQuantile(tc.q, b, tc.total); got < tc.want-1e-12 || got > tc.want+1e-12 {
			t.Errorf("q%v of %d = %v, want %v", tc.q, tc.total, got, tc.want)
		}
	}
}

func TestSelectorAsPromQLMatchers(t *testing.T) {
	for sel, want := range map[string]string{
		"":                          `namespace="ml"`,
		"app=tf-training":           `namespace="ml",label_app="tf-training"`,
		"app.kubernetes.io/name!=x": `namespace="ml",label_app_kubernetes_io_name!="x"`,
		"tier in (a.b,c)":           `namespace="ml",label_tier=~"a\\.b|c"`,
		"tier notin (a)":            `namespace="ml",label_tier!~"a"`,
		"canary":                    `namespace="ml",label_canary!=""`,
		"!canary":                   `namespace="ml",label_canary=""`,
	} {
		s, err := labels.Parse(sel)
		if err != nil {
			t.Fatal(err)
		}
		got, err := matchers(Query{Namespace: "ml", Selector: s}, "label_")
		if err != nil || got != want {
			t.Errorf("%q -> %s, %v; want %s", sel, got, err, want)
		}
	}
	gt, _ := labels.Parse("gpus>2")
	if _, err := matchers(Query{Selector: gt}, ""); err == nil {
		t.Error("gpus>2 turned into a matcher")
	}
}

// TestAdapterMetricsDocumented: every metric of the adapter's table is in
// docs/metrics.md with its type, unit and labels, every documented one is
// in the table, the adapter exports nothing else, and promtool finds
// nothing wrong.
func TestAdapterMetricsDocumented(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	now := time.Now()
	p := NewProvider(&fakeBackend{values: []Value{{Labels: map[string]string{"model": "H100"}, Value: 2, Time: now}}}, time.Minute, m, nil, quietLog())
	if _, err := p.GetExternalMetric(context.Background(), "ml", labels.Everything(), provider.ExternalMetricInfo{Metric: PoolUnallocatedGPUs}); err != nil {
		t.Fatal(err)
	}
	m.backendErrors.WithLabelValues("fake")
	metricstest.Documented(t, "../docs/metrics.md", "Adapter", MetricFamilies, reg)
	metricstest.Lint(t, reg)
}
