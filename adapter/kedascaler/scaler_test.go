package kedascaler

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/gpupool/gpupool/adapter"
	"github.com/gpupool/gpupool/adapter/externalscaler"
	"github.com/gpupool/gpupool/internal/metricstest"
	"github.com/gpupool/gpupool/internal/testcert"
)

// metricsOf asks for ref's metric, as KEDA's HPA does.
func metricsOf(ref *externalscaler.ScaledObjectRef) *externalscaler.GetMetricsRequest {
	return &externalscaler.GetMetricsRequest{ScaledObjectRef: ref, MetricName: ref.ScalerMetadata["metric"]}
}

// isActive asks as KEDA does and fails the test on an error.
func isActive(t *testing.T, keda externalscaler.ExternalScalerClient, ref *externalscaler.ScaledObjectRef) bool {
	t.Helper()
	r, err := keda.IsActive(t.Context(), ref)
	if err != nil {
		t.Fatalf("IsActive: %v", err)
	}
	return r.GetResult()
}

// metricValue asks for ref's metric and fails the test on an error.
func metricValue(t *testing.T, keda externalscaler.ExternalScalerClient, ref *externalscaler.ScaledObjectRef) float64 {
	t.Helper()
	r, err := keda.GetMetrics(t.Context(), metricsOf(ref))
	if err != nil {
		t.Fatalf("GetMetrics: %v", err)
	}
	if len(r.GetMetricValues()) != 1 || r.GetMetricValues()[0].GetMetricName() != ref.ScalerMetadata["metric"] {
		t.Fatalf("GetMetrics: %v, want one value of %s", r, ref.ScalerMetadata["metric"])
	}
	return r.GetMetricValues()[0].GetMetricValueFloat()
}

// wantStatus fails the test unless err is a gRPC status of code whose
// message starts with want.
func wantStatus(t *testing.T, what string, err error, code codes.Code, want string) {
	t.Helper()
	s, ok := status.FromError(err)
	if !ok || s.Code() != code || !strings.HasPrefix(s.Message(), want) {
		t.Errorf("%s: %v, want %s %q", what, err, code, want)
	}
}

// TestScalerAnswersEachCall: over TLS with KEDA's client certificate,
// each call of KEDA's external scaler API answers from the allocator's
// leases and the daemon's readings of the trigger's pods, and is counted.
func TestScalerAnswersEachCall(t *testing.T) {
	p := newTestPool(t)
	keda := p.kedaClient(t)
	p.acquire(t, "tf-0", "tf-training", 0.6)
	p.acquire(t, "web-0", "web", 0.2)

	spec, err := keda.GetMetricSpec(t.Context(), tfTraining(nil))
	if err != nil {
		t.Fatal(err)
	}
	if s := spec.GetMetricSpecs(); len(s) != 1 || s[0].GetMetricName() != adapter.GPUUtilization || s[0].GetTargetSizeFloat() != 0.7 || s[0].GetTargetSize() != 1 {
		t.Errorf("GetMetricSpec: %v, want bitfusion_gpu_utilization to 0.7", spec)
	}
	for metric, want := range map[string]float64{adapter.GPUUtilization: 0.6, adapter.MemoryPressure: 0.5, adapter.IdleHeldShare: 0} {
		if got := metricValue(t, keda, tfTraining(map[string]string{"metric": metric})); math.Abs(got-want) > 1e-9 {
			t.Errorf("GetMetrics %s of tf-training: %v, want %v", metric, got, want)
		}
	}
	r, err := keda.GetMetrics(t.Context(), metricsOf(tfTraining(map[string]string{"metric": adapter.MemoryPressure, "target": "2.6"})))
	if err != nil || r.GetMetricValues()[0].GetMetricValue() != 1 {
		t.Errorf("GetMetrics: %v, %v; want the deprecated integer value 1 beside 0.5", r, err)
	}
	if !isActive(t, keda, tfTraining(nil)) {
		t.Error("IsActive: false for a workload using its GPU")
	}
	stream, err := keda.StreamIsActive(t.Context(), tfTraining(nil))
	if err != nil {
		t.Fatal(err)
	}
	if r, err := stream.Recv(); err != nil || !r.GetResult() {
		t.Errorf("StreamIsActive's first answer: %v, %v; want true", r, err)
	}
	_, err = keda.GetMetrics(t.Context(), &externalscaler.GetMetricsRequest{ScaledObjectRef: tfTraining(nil), MetricName: "s0-bitfusion_gpu_utilization"})
	wantStatus(t, "GetMetrics of another metric", err, codes.InvalidArgument,
		`metricName "s0-bitfusion_gpu_utilization" is not the trigger's metric "bitfusion_gpu_utilization"`)
	specs, err := keda.StreamMetricSpec(t.Context(), tfTraining(nil))
	if err == nil {
		_, err = specs.Recv()
	}
	wantStatus(t, "StreamMetricSpec", err, codes.Unimplemented, "method StreamMetricSpec not implemented")
	for method, want := range map[string]float64{"GetMetricSpec/OK": 1, "GetMetrics/OK": 4, "GetMetrics/InvalidArgument": 1, "IsActive/OK": 1,
		"StreamMetricSpec/Unimplemented": 1} {
		m, code, _ := strings.Cut(method, "/")
		if got := testutil.ToFloat64(p.scaler.requests.WithLabelValues(m, code)); got != want {
			t.Errorf("bitfusion_adapter_scaler_requests_total{method=%q,code=%q} = %v, want %v", m, code, got, want)
		}
	}
}

// TestActivityFollowsIdleLeasesAndDemand: a workload is active while one
// of its leases is not idle for the window, inactive once all are (KEDA
// scales it to zero, which gives the GPUs back), active again while a
// lease request of its pods waits, and inactive with no lease and nothing
// waiting. Another workload's leases and requests change nothing.
func TestActivityFollowsIdleLeasesAndDemand(t *testing.T) {
	p := newTestPool(t)
	keda := p.kedaClient(t)
	share := tfTraining(map[string]string{"metric": adapter.IdleHeldShare, "target": "1"})

	if isActive(t, keda, tfTraining(nil)) {
		t.Error("active with no lease and nothing pending")
	}
	_, err := keda.GetMetrics(t.Context(), metricsOf(share))
	wantStatus(t, "idle share of no lease", err, codes.NotFound,
		`bitfusion_idle_held_share for namespace "ml" selector "app=tf-training": no data (no selected lease, or none measured yet)`)

	tf0 := p.acquire(t, "tf-0", "tf-training", 0.6)
	tf1 := p.acquire(t, "tf-1", "tf-training", 0.02)
	p.sample(t)
	if !isActive(t, keda, tfTraining(nil)) || metricValue(t, keda, share) != 0 {
		t.Error("new leases: inactive, or some idle; want active, none idle (not measured idle for the window yet)")
	}
	p.idleForTheWindow(t)
	if got := metricValue(t, keda, share); got != 0.5 || !isActive(t, keda, tfTraining(nil)) {
		t.Errorf("tf-1 idle for the window, tf-0 busy: idle share %v, want 0.5, and active", got)
	}
	p.setUse(tf0, 0.01)
	p.idleForTheWindow(t)
	if got := metricValue(t, keda, share); got != 1 || isActive(t, keda, tfTraining(nil)) {
		t.Errorf("both idle for the window: idle share %v, want 1, and inactive", got)
	}

	withdraw := p.queue(t, "web-0", "web") // ml's quota is held: it waits
	if isActive(t, keda, tfTraining(nil)) {
		t.Error("another app's request waiting made tf-training active")
	}
	withdraw()
	withdraw = p.queue(t, "tf-2", "tf-training")
	if !isActive(t, keda, tfTraining(nil)) {
		t.Error("a request of tf-training waiting: inactive")
	}
	withdraw()
	if isActive(t, keda, tfTraining(nil)) {
		t.Error("the request withdrawn, the leases idle: active")
	}

	// Scaled to zero: the pods' leases are released.
	p.release(t, tf0)
	p.release(t, tf1)
	if isActive(t, keda, tfTraining(nil)) {
		t.Error("no lease, nothing pending: active")
	}
}

// recv receives the stream's next answer within d.
func recv(t *testing.T, stream externalscaler.ExternalScaler_StreamIsActiveClient, d time.Duration) (bool, error) {
	t.Helper()
	type answer struct {
		r   *externalscaler.IsActiveResponse
		err error
	}
	got := make(chan answer, 1)
	go func() {
		r, err := stream.Recv()
		got <- answer{r, err}
	}()
	select {
	case a := <-got:
		return a.r.GetResult(), a.err
	case <-time.After(d):
		t.Fatalf("no answer within %v", d)
		return false, nil
	}
}

// pushWithin bounds a stream's answer: DefaultPoll (1 s), and slack for a
// loaded machine. Measured on an idle one: 1.0 s.
const pushWithin = 3 * time.Second

// TestStreamIsActivePushesChanges: a stream answers at once, then pushes
// each change within pushWithin of the allocator seeing it, and nothing
// while nothing changes; streams of one
// namespace and selector share one poll; a stream ends when its client
// goes away, and each one when the server stops.
func TestStreamIsActivePushesChanges(t *testing.T) {
	p := newTestPool(t)
	keda := p.kedaClient(t)
	tf0 := p.acquire(t, "tf-0", "tf-training", 0.6)
	tf1 := p.acquire(t, "tf-1", "tf-training", 0.6)
	ctx, cancel := context.WithCancel(t.Context())
	first, err := keda.StreamIsActive(ctx, tfTraining(nil))
	if err != nil {
		t.Fatal(err)
	}
	second, err := keda.StreamIsActive(ctx, tfTraining(map[string]string{"metric": adapter.IdleHeldShare}))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []externalscaler.ExternalScaler_StreamIsActiveClient{first, second} {
		if active, err := recv(t, s, pushWithin); err != nil || !active {
			t.Fatalf("first answer: %v, %v; want true at once", active, err)
		}
	}
	if streams, polls := gauges(t, p.registry); streams != 2 || polls != 1 {
		t.Errorf("%v streams, %v polls; want 2 sharing 1", streams, polls)
	}

	p.setUse(tf0, 0)
	p.setUse(tf1, 0)
	p.idleForTheWindow(t)
	seen := time.Now()
	for _, s := range []externalscaler.ExternalScaler_StreamIsActiveClient{first, second} {
		if active, err := recv(t, s, pushWithin); err != nil || active {
			t.Fatalf("after the leases went idle: %v, %v; want false", active, err)
		}
	}
	t.Logf("pushed the leases idle %v after the allocator's sample", time.Since(seen).Round(time.Millisecond))
	withdraw := p.queue(t, "tf-2", "tf-training")
	if active, err := recv(t, first, pushWithin); err != nil || !active {
		t.Fatalf("after a request of tf-training queued: %v, %v; want true", active, err)
	}
	withdraw()
	if active, err := recv(t, first, pushWithin); err != nil || active {
		t.Fatalf("after the request was withdrawn: %v, %v; want false", active, err)
	}

	// KEDA goes away: the streams and their poll end.
	cancel()
	waitUntil(t, func() bool { s, polls := gauges(t, p.registry); return s == 0 && polls == 0 })

	// The server stops: open streams end at once, Unavailable, and Serve
	// returns without waiting for them.
	third, err := keda.StreamIsActive(t.Context(), tfTraining(nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := recv(t, third, pushWithin); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > pushWithin {
		t.Errorf("Serve took %v to return with a stream open", took)
	}
	_, err = recv(t, third, pushWithin)
	if s, _ := status.FromError(err); s.Code() != codes.Unavailable {
		t.Errorf("the stream when the server stopped: %v, want Unavailable", err)
	}
}

// gauges are the scaler's streams and polls as its registry exports them.
func gauges(t *testing.T, reg *prometheus.Registry) (streams, polls float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case streamsOpen.Name:
			streams = mf.GetMetric()[0].GetGauge().GetValue()
		case pollsRunning.Name:
			polls = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return streams, polls
}

// TestBadInputIsRefused: each bad trigger is InvalidArgument to every
// call, naming the field, the value and the limit; a message over the
// bound is refused before it is read whole; the server serves on.
func TestBadInputIsRefused(t *testing.T) {
	p := newTestPool(t)
	keda := p.kedaClient(t)
	for _, tc := range badTriggers {
		_, err := keda.IsActive(t.Context(), tc.ref)
		wantStatus(t, tc.name+": IsActive", err, codes.InvalidArgument, tc.want)
		_, err = keda.GetMetricSpec(t.Context(), tc.ref)
		wantStatus(t, tc.name+": GetMetricSpec", err, codes.InvalidArgument, tc.want)
		_, err = keda.GetMetrics(t.Context(), metricsOf(tc.ref))
		wantStatus(t, tc.name+": GetMetrics", err, codes.InvalidArgument, tc.want)
		stream, err := keda.StreamIsActive(t.Context(), tc.ref)
		if err == nil {
			_, err = stream.Recv()
		}
		wantStatus(t, tc.name+": StreamIsActive", err, codes.InvalidArgument, tc.want)
	}
	_, err := keda.IsActive(t.Context(), tfTraining(map[string]string{"selector": strings.Repeat("a", maxMessageBytes)}))
	wantStatus(t, "a message over the bound", err, codes.ResourceExhausted, "grpc: received message larger than max")
	if isActive(t, keda, tfTraining(nil)) {
		t.Error("active with no lease")
	}
}

// TestClientWithoutCertificateIsRefused: a client with no certificate the
// client CA signed, or in cleartext (a trigger without authenticationRef),
// gets Unauthenticated on every call, naming the parameters to set; one
// that sends another CA's certificate anyway fails the handshake; none is
// answered.
func TestClientWithoutCertificateIsRefused(t *testing.T) {
	p := newTestPool(t)
	mallory := testcert.NewCA(t, "mallory CA").Issue(t, "keda-operator", x509.ExtKeyUsageClientAuth)
	insistent := p.dialConfig(t, &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: p.serverCA.Pool(),
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &mallory, nil }})
	_, err := insistent.IsActive(t.Context(), tfTraining(nil))
	// The client sees the server's alert (bad certificate) or, when it was
	// still writing, the connection cut.
	if s, _ := status.FromError(err); s.Code() != codes.Unavailable {
		t.Errorf("another CA's certificate, sent: %v, want Unavailable", err)
	}
	const noCert = "no client certificate signed by the CA of gpupool-adapter's --keda-client-ca: the trigger's authenticationRef must give tlsClientCert and tlsClientKey"
	cleartext, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cleartext.Close() })
	for name, tc := range map[string]struct {
		client externalscaler.ExternalScalerClient
		want   string
	}{
		"no certificate":        {p.dial(t, nil), noCert},
		"another CA's":          {p.dial(t, &mallory), noCert},
		"the serving CA's, too": {p.dial(t, ptr(p.serverCA.Issue(t, "keda-operator", x509.ExtKeyUsageClientAuth))), noCert},
		"cleartext":             {externalscaler.NewExternalScalerClient(cleartext), "cleartext: the scaler takes TLS only; the trigger's authenticationRef must give caCert"},
	} {
		_, err := tc.client.IsActive(t.Context(), tfTraining(nil))
		wantStatus(t, name+": IsActive", err, codes.Unauthenticated, tc.want)
		_, err = tc.client.GetMetrics(t.Context(), metricsOf(tfTraining(nil)))
		wantStatus(t, name+": GetMetrics", err, codes.Unauthenticated, tc.want)
		stream, err := tc.client.StreamIsActive(t.Context(), tfTraining(nil))
		if err == nil {
			_, err = stream.Recv()
		}
		wantStatus(t, name+": StreamIsActive", err, codes.Unauthenticated, tc.want)
	}
	answered := 0
	for _, m := range []string{"IsActive", "GetMetrics", "StreamIsActive"} {
		answered += int(testutil.ToFloat64(p.scaler.requests.WithLabelValues(m, codes.OK.String())))
	}
	if answered != 0 {
		t.Errorf("%d calls answered", answered)
	}
	if isActive(t, p.kedaClient(t), tfTraining(nil)) {
		t.Error("KEDA's client: active with no lease")
	}
}

func ptr[T any](v T) *T { return &v }

// TestBackendTroubleDecidesNothing: when the backend fails, or its value
// is too old, or it serves no idle share, activity and metrics are errors
// with the code KEDA acts on (it then keeps the workload's size, or applies
// its fallback), never a made-up answer.
func TestBackendTroubleDecidesNothing(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name    string
		backend fakeBackend
		call    func(*Scaler) error
		code    codes.Code
		want    string
	}{
		{"backend down", fakeBackend{err: errors.New("connection refused")}, askActive, codes.Internal,
			"the fake backend failed for bitfusion_lease_pending_requests (the adapter's log says why)"},
		{"pending too old", fakeBackend{values: map[string]adapter.Value{adapter.PendingRequests: {Time: now.Add(-2 * time.Minute)}}}, askActive,
			codes.Unavailable, `bitfusion_lease_pending_requests for namespace "ml" selector "app=tf-training" is 2m0s old, more than --max-age=30s`},
		{"idle share too old", fakeBackend{values: map[string]adapter.Value{adapter.PendingRequests: {Time: now},
			adapter.IdleHeldShare: {Value: 1, Time: now.Add(-time.Minute)}}}, askActive,
			codes.Unavailable, `bitfusion_idle_held_share for namespace "ml" selector "app=tf-training" is 1m0s old`},
		{"no idle share", fakeBackend{values: map[string]adapter.Value{adapter.PendingRequests: {Time: now}}, unknown: adapter.IdleHeldShare}, askActive,
			codes.FailedPrecondition, "bitfusion_idle_held_share: the adapter's backend does not serve it (--backend=direct does)"},
		{"selector the backend cannot express", fakeBackend{err: &adapter.SelectorError{Selector: "gpus>2", Key: "gpus", Operator: ">", Limit: "has no PromQL label matcher"}},
			askActive, codes.InvalidArgument, `labelSelector "gpus>2": gpus > has no PromQL label matcher`},
		{"utilization not measured", fakeBackend{}, askUtilization, codes.NotFound,
			`bitfusion_gpu_utilization for namespace "ml" selector "app=tf-training": no data`},
		{"utilization too old", fakeBackend{values: map[string]adapter.Value{adapter.GPUUtilization: {Value: 0.7, Time: now.Add(-time.Minute)}}}, askUtilization,
			codes.Unavailable, `bitfusion_gpu_utilization for namespace "ml" selector "app=tf-training" is 1m0s old`},
		{"a source not sampled yet", fakeBackend{values: map[string]adapter.Value{adapter.GPUUtilization: {Value: 0.7}}}, askUtilization,
			codes.Unavailable, `bitfusion_gpu_utilization for namespace "ml" selector "app=tf-training" rests on a source not sampled yet`},
	} {
		s := New(Config{Provider: adapter.NewProvider(&tc.backend, 30*time.Second, adapter.NewMetrics(prometheus.NewRegistry()), nil, quietLog()), Log: quietLog()})
		wantStatus(t, tc.name, tc.call(s), tc.code, tc.want)
	}
}

func askActive(s *Scaler) error {
	_, err := s.IsActive(context.Background(), tfTraining(nil))
	return err
}

func askUtilization(s *Scaler) error {
	_, err := s.GetMetrics(context.Background(), metricsOf(tfTraining(nil)))
	return err
}

// fakeBackend answers each metric with its value, none, or err.
type fakeBackend struct {
	values  map[string]adapter.Value
	unknown string
	err     error
}

func (*fakeBackend) Name() string { return "fake" }

func (f *fakeBackend) Query(_ context.Context, q adapter.Query) ([]adapter.Value, error) {
	if q.Metric == f.unknown {
		return nil, adapter.ErrUnknownMetric
	}
	if v, ok := f.values[q.Metric]; ok {
		return []adapter.Value{v}, f.err
	}
	return nil, f.err
}

// TestScalerMetricsDocumented: the scaler's metrics are docs/metrics.md's
// KEDA section, and promtool finds nothing wrong with them.
func TestScalerMetricsDocumented(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := New(Config{Provider: adapter.NewProvider(&fakeBackend{}, time.Minute, adapter.NewMetrics(prometheus.NewRegistry()), nil, quietLog()),
		Registry: reg, Log: quietLog()})
	s.requests.WithLabelValues("IsActive", "OK")
	metricstest.Documented(t, "../../docs/metrics.md", "KEDA external scaler", MetricFamilies, reg)
	metricstest.Lint(t, reg)
}
