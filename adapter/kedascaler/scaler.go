// Package kedascaler serves KEDA's external scaler API
// (adapter/externalscaler) from the adapter's Provider, so that a cluster
// that runs KEDA scales GPU workloads on the pool's signals, to zero when
// their leases have been idle for their namespace's whole window, and
// back when a lease request of theirs waits.
//
// A ScaledObject's trigger names a metric, a selector of its pods and a
// target (ParseTrigger); the values are the external metrics API's, from
// the same backend, under the same freshness guard (adapter.Provider.Values).
package kedascaler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpupool/gpupool/adapter"
	"github.com/gpupool/gpupool/adapter/externalscaler"
	"github.com/gpupool/gpupool/internal/fielderr"
)

// DefaultPoll is how often a StreamIsActive stream's activity is asked of
// the backend: a pending request wakes a workload scaled to zero within
// about a second (the direct backend reads the allocator at most every
// --refresh, 500 ms, whatever the number of streams).
const DefaultPoll = time.Second

// Config is what New needs.
type Config struct {
	Provider *adapter.Provider
	// Poll is StreamIsActive's interval; DefaultPoll when 0.
	Poll time.Duration
	// Registry, when set, gets the scaler's own metrics.
	Registry prometheus.Registerer
	Log      *slog.Logger
}

// Scaler implements externalscaler.ExternalScalerServer.
// StreamMetricSpec is left unimplemented: a trigger's target is in its
// ScaledObject, which KEDA holds already, and never changes under it, so
// there is nothing to push; KEDA then asks GetMetricSpec, as it does of
// scalers older than the RPC.
type Scaler struct {
	externalscaler.UnimplementedExternalScalerServer

	provider *adapter.Provider
	log      *slog.Logger
	requests *prometheus.CounterVec
	watches  *watches

	// stopping is closed when Serve stops: the streams end then.
	stopping chan struct{}
	stopOnce sync.Once
}

// New returns a scaler over cfg's Provider.
func New(cfg Config) *Scaler {
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultPoll
	}
	s := &Scaler{provider: cfg.Provider, log: cfg.Log, requests: requestsTotal.NewCounterVec(), stopping: make(chan struct{})}
	s.watches = &watches{poll: cfg.Poll, active: s.active, byKey: map[string]*watch{}}
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(s.requests, s.watches)
	}
	return s
}

// IsActive implements externalscaler.ExternalScalerServer: whether the
// trigger's workload wants replicas (see active).
func (s *Scaler) IsActive(ctx context.Context, ref *externalscaler.ScaledObjectRef) (*externalscaler.IsActiveResponse, error) {
	t, err := ParseTrigger(ref)
	if err != nil {
		return nil, grpcError(err)
	}
	active, err := s.active(ctx, t)
	if err != nil {
		return nil, grpcError(err)
	}
	return &externalscaler.IsActiveResponse{Result: active}, nil
}

// active is whether t's workload wants replicas: a lease request of its
// pods is pending (demand wakes it), or one of its leases is not idle for
// its namespace's whole window. A workload with neither (every lease idle,
// or none at all) is not, and KEDA scales it to zero, which gives its GPUs
// back. An error (the backend down, a value too old) decides nothing:
// KEDA keeps the workload's size, or applies its fallback.
func (s *Scaler) active(ctx context.Context, t Trigger) (bool, error) {
	pending, err := s.provider.Values(ctx, t.query(adapter.PendingRequests))
	if err != nil {
		return false, queryError{t.query(adapter.PendingRequests), err}
	}
	for _, v := range pending {
		if v.Value > 0 {
			return true, nil
		}
	}
	q := t.query(adapter.IdleHeldShare)
	share, err := s.provider.Values(ctx, q)
	switch {
	case errors.Is(err, adapter.ErrNoData):
		return false, nil // no lease holds a GPU, and none is asked for
	case err != nil:
		return false, queryError{q, err}
	}
	return share[0].Value < 1, nil
}

// GetMetricSpec implements externalscaler.ExternalScalerServer: the
// trigger's metric and target.
func (s *Scaler) GetMetricSpec(_ context.Context, ref *externalscaler.ScaledObjectRef) (*externalscaler.GetMetricSpecResponse, error) {
	t, err := ParseTrigger(ref)
	if err != nil {
		return nil, grpcError(err)
	}
	return &externalscaler.GetMetricSpecResponse{MetricSpecs: []*externalscaler.MetricSpec{{
		MetricName: t.Metric, TargetSize: int64(math.Round(t.Target)), TargetSizeFloat: t.Target,
	}}}, nil
}

// GetMetrics implements externalscaler.ExternalScalerServer: the trigger's
// metric now, if fresh.
func (s *Scaler) GetMetrics(ctx context.Context, req *externalscaler.GetMetricsRequest) (*externalscaler.GetMetricsResponse, error) {
	t, err := ParseTrigger(req.GetScaledObjectRef())
	if err != nil {
		return nil, grpcError(err)
	}
	if req.GetMetricName() != t.Metric {
		return nil, grpcError(&fielderr.Error{Field: "metricName", Value: fmt.Sprintf("%q", fielderr.Shorten(req.GetMetricName())),
			Limit: fmt.Sprintf("is not the trigger's metric %q", t.Metric)})
	}
	values, err := s.provider.Values(ctx, t.Query())
	if err != nil {
		return nil, grpcError(queryError{t.Query(), err})
	}
	out := &externalscaler.GetMetricsResponse{}
	for _, v := range values {
		out.MetricValues = append(out.MetricValues, &externalscaler.MetricValue{
			MetricName: t.Metric, MetricValue: int64(math.Round(v.Value)), MetricValueFloat: v.Value,
		})
	}
	return out, nil
}

// StreamIsActive implements externalscaler.ExternalScalerServer: the
// trigger's activity at once, then each change as the stream's poll sees
// it, until the client goes away, the poll fails (the stream ends with the
// error, and KEDA opens it again) or the scaler stops. Streams that ask of
// the same namespace and selector share one poll.
func (s *Scaler) StreamIsActive(ref *externalscaler.ScaledObjectRef, stream externalscaler.ExternalScaler_StreamIsActiveServer) error {
	t, err := ParseTrigger(ref)
	if err != nil {
		return grpcError(err)
	}
	w := s.watches.join(t)
	defer s.watches.leave(w)
	var seen uint64
	for {
		active, version, err := s.watches.next(stream.Context(), s.stopping, w, seen)
		if err != nil {
			return grpcError(err)
		}
		if err := stream.Send(&externalscaler.IsActiveResponse{Result: active}); err != nil {
			return err
		}
		seen = version
	}
}

// stop ends the streams.
func (s *Scaler) stop() {
	s.stopOnce.Do(func() { close(s.stopping) })
}

// queryError is a Provider's error for one query, which its gRPC status
// names.
type queryError struct {
	q   adapter.Query
	err error
}

func (e queryError) Error() string {
	return fmt.Sprintf("%s for namespace %q selector %q: %v", e.q.Metric, e.q.Namespace, e.q.Selector.String(), e.err)
}

func (e queryError) Unwrap() error { return e.err }

// errStopping ends the streams when the scaler stops.
var errStopping = errors.New("gpupool-adapter is stopping: open the stream again (another replica answers)")

// grpcError is err as a gRPC status, with the code a client acts on, as
// the external metrics API's HTTP statuses (docs/adapter.md): a bad
// trigger or selector is InvalidArgument, no data NotFound, a value too
// old Unavailable, the backend failing Internal (its cause in the log).
func grpcError(err error) error {
	var (
		field   *fielderr.Error
		invalid *adapter.SelectorError
		stale   *adapter.StaleError
		failed  *adapter.BackendError
		q       queryError
	)
	switch {
	case errors.As(err, &field):
		return status.Error(codes.InvalidArgument, field.Error())
	case errors.As(err, &invalid):
		return status.Error(codes.InvalidArgument, invalid.Error())
	case errors.As(err, &stale):
		return status.Error(codes.Unavailable, stale.Error())
	case errors.As(err, &failed):
		return status.Error(codes.Internal, failed.Error())
	case errors.Is(err, adapter.ErrNoData) && errors.As(err, &q):
		return status.Error(codes.NotFound, fmt.Sprintf("%s for namespace %q selector %q: no data (no selected lease, or none measured yet)",
			q.q.Metric, q.q.Namespace, q.q.Selector.String()))
	case errors.Is(err, adapter.ErrUnknownMetric) && errors.As(err, &q):
		return status.Error(codes.FailedPrecondition, fmt.Sprintf("%s: the adapter's backend does not serve it (--backend=direct does)", q.q.Metric))
	case errors.Is(err, errStopping):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Internal, err.Error())
}
