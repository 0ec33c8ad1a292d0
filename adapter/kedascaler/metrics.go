package kedascaler

import (
	"context"
	"path"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/gpupool/gpupool/internal/metricdef"
)

// The scaler's table: docs/metrics.md's KEDA scaler section is checked
// against it. The values it serves and the backend's errors are counted
// by the adapter's own (adapter.MetricFamilies), through the Provider.
var (
	requestsTotal = metricdef.Counter("bitfusion_adapter_scaler_requests_total", "requests", metricdef.Labels{"method", "code"},
		"KEDA external-scaler calls answered, by method and gRPC status code; a stream counts when it ends.")
	streamsOpen = metricdef.Gauge("bitfusion_adapter_scaler_streams", "streams", nil,
		"StreamIsActive streams open.")
	pollsRunning = metricdef.Gauge("bitfusion_adapter_scaler_polls", "polls", nil,
		"Polls the StreamIsActive streams share: one per distinct namespace and selector.")
)

// MetricFamilies is the table of the scaler's own metrics.
var MetricFamilies = []*metricdef.Family{requestsTotal, streamsOpen, pollsRunning}

// countUnary counts unary calls by method and code.
func (s *Scaler) countUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	s.requests.WithLabelValues(path.Base(info.FullMethod), status.Code(err).String()).Inc()
	return resp, err
}

// countStream counts streams by method and code, when they end.
func (s *Scaler) countStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	err := handler(srv, ss)
	s.requests.WithLabelValues(path.Base(info.FullMethod), status.Code(err).String()).Inc()
	return err
}
