package kedascaler

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/grpclog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupool/gpupool/adapter"
	"github.com/gpupool/gpupool/adapter/externalscaler"
	"github.com/gpupool/gpupool/allocator"
	allocapi "github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/allocator/service"
	"github.com/gpupool/gpupool/allocator/service/servicetest"
	"github.com/gpupool/gpupool/allocator/store"
	"github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/internal/testcert"
)

// idleWindow is namespace ml's idle policy's window in the test pool: the
// shortest the allocator takes, six samples.
const idleWindow = time.Minute

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// The clients refused in TestClientWithoutCertificateIsRefused would log
// their failed handshakes.
func init() { grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, io.Discard)) }

// clock is the allocator's clock, which the test moves.
type clock struct{ nanos atomic.Int64 }

func newClock(at time.Time) *clock {
	c := &clock{}
	c.nanos.Store(at.UnixNano())
	return c
}

func (c *clock) Now() time.Time      { return time.Unix(0, c.nanos.Load()) }
func (c *clock) Add(d time.Duration) { c.nanos.Add(int64(d)) }

// testPool is a real allocator in process, on a clock the test moves, with
// one GPU server of 2 GPUs ("s1") whose daemon is a fake that reports the
// readings the test sets, and namespace ml's idle policy of idleWindow.
// The direct backend reads both; a scaler over it serves KEDA's API on a
// loopback port with TLS, asking for client certificates.
type testPool struct {
	svc    *service.Service
	url    string
	client *client.Client
	clock  *clock

	mu       sync.Mutex
	readings map[string]api.LeaseUsage // by lease ID

	scaler   *Scaler
	registry *prometheus.Registry
	addr     string
	// stop stops the scaler's server and returns what Serve returned.
	stop func() error
	// serverCA signed the scaler's serving certificate, clientCA KEDA's
	// client certificate (keda).
	serverCA, clientCA *testcert.CA
	keda               tls.Certificate
}

func newTestPool(t *testing.T) *testPool {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "allocator"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	p := &testPool{clock: newClock(time.Now()), readings: map[string]api.LeaseUsage{}}
	reg := prometheus.NewRegistry()
	p.svc, err = service.New(ctx, service.Config{Store: st, Policy: "best-fit", DefaultTTL: time.Hour, MaxTTL: time.Hour,
		HeartbeatTimeout: 24 * time.Hour, Quotas: map[string]allocator.Share{"ml": allocator.ShareGPUs(2)},
		IdlePolicies: map[string]service.IdlePolicy{"ml": {UseBelow: 0.1, Window: metav1.Duration{Duration: idleWindow}, Action: service.IdleReport}},
		Clock:        p.clock.Now, Registry: reg, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	alloc := httptest.NewServer(service.Handler(p.svc, nil, reg, quietLog()))
	t.Cleanup(alloc.Close)
	p.url = alloc.URL
	if p.client, err = client.New([]string{alloc.URL}, ""); err != nil {
		t.Fatal(err)
	}
	p.client.Retries = 1
	daemon := httptest.NewServer(http.HandlerFunc(p.usage))
	t.Cleanup(daemon.Close)
	s1 := servicetest.Server("s1", 2)
	s1.Labels = map[string]string{api.LabelDaemonURL: daemon.URL}
	if err := p.client.RegisterServer(ctx, s1); err != nil {
		t.Fatal(err)
	}

	p.registry = prometheus.NewRegistry()
	provider := adapter.NewProvider(adapter.NewDirect(p.client, 0, quietLog()), 30*time.Second, adapter.NewMetrics(p.registry), nil, quietLog())
	p.scaler = New(Config{Provider: provider, Registry: p.registry, Log: quietLog()})
	p.serverCA, p.clientCA = testcert.NewCA(t, "gpupool CA"), testcert.NewCA(t, "KEDA client CA")
	p.keda = p.clientCA.Issue(t, "keda-operator", x509.ExtKeyUsageClientAuth)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	serving := pemPair(t, p.serverCA.Issue(t, "gpupool-adapter", x509.ExtKeyUsageServerAuth))
	served := make(chan error, 1)
	serveCtx, stopServing := context.WithCancel(context.Background())
	go func() { served <- p.scaler.Serve(serveCtx, ln, ServerTLS(serving, p.clientCA.Pool())) }()
	p.stop = sync.OnceValue(func() error {
		stopServing()
		return <-served
	})
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return p
}

// staticCert is a serving certificate that never changes.
type staticCert struct{ cert, key []byte }

func (c staticCert) CurrentCertKeyContent() ([]byte, []byte) { return c.cert, c.key }

func pemPair(t *testing.T, c tls.Certificate) staticCert {
	t.Helper()
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	return staticCert{pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})}
}

// usage is the fake daemon's GET /v1/usage: the readings the test set,
// sampled now.
func (p *testPool) usage(w http.ResponseWriter, _ *http.Request) {
	p.mu.Lock()
	u := api.Usage{Server: "s1", SampledAt: time.Now(), GPUs: []api.GPUUsage{}, Leases: []api.LeaseUsage{}}
	for _, r := range p.readings {
		u.Leases = append(u.Leases, r)
	}
	p.mu.Unlock()
	_ = json.NewEncoder(w).Encode(u)
}

// dial connects as KEDA does (pkg/scalers/external_scaler.go): TLS with
// the CA of the serving certificate and, unless cert is nil, a client
// certificate; round robin over the address's endpoints.
func (p *testPool) dial(t *testing.T, cert *tls.Certificate) externalscaler.ExternalScalerClient {
	t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: p.serverCA.Pool()}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return p.dialConfig(t, cfg)
}

// dialConfig connects over TLS with cfg.
func (p *testPool) dialConfig(t *testing.T, cfg *tls.Config) externalscaler.ExternalScalerClient {
	t.Helper()
	conn, err := grpc.NewClient(p.addr, grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"round_robin":{}}]}`),
		grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return externalscaler.NewExternalScalerClient(conn)
}

// keda is a client with KEDA's certificate.
func (p *testPool) kedaClient(t *testing.T) externalscaler.ExternalScalerClient {
	t.Helper()
	return p.dial(t, &p.keda)
}

// acquire grants pod a whole GPU in ml until released, its owner labeled
// app=app, and has the daemon report it using sm of it.
func (p *testPool) acquire(t *testing.T, pod, app string, sm float64) allocapi.Lease {
	t.Helper()
	l, err := p.client.Acquire(context.Background(), allocapi.AcquireRequest{Namespace: "ml", GPUAmount: 1, UntilReleased: true,
		Owner: allocapi.Owner{Pod: pod, UID: "uid-" + pod, Labels: map[string]string{"app": app}}})
	if err != nil {
		t.Fatal(err)
	}
	p.setUse(l, sm)
	return l
}

// setUse has the daemon report lease l using sm of its GPU, and half its
// memory.
func (p *testPool) setUse(l allocapi.Lease, sm float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.readings[l.ID] = api.LeaseUsage{Lease: l.ID, Namespace: l.Namespace, GPU: l.GPUs[0].Index, Milli: int32(allocator.WholeGPU),
		SMUtilization: &sm, MemoryUsedBytes: l.GPUs[0].MemoryBytes / 2, MemoryGrantedBytes: l.GPUs[0].MemoryBytes, Processes: 1}
}

// release releases l and drops its reading.
func (p *testPool) release(t *testing.T, l allocapi.Lease) {
	t.Helper()
	if err := p.client.Release(context.Background(), l.ID); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	delete(p.readings, l.ID)
	p.mu.Unlock()
}

// sample reports the leases' use to the allocator as s1's daemon
// heart-beats it, and moves the clock one sample on, where the allocator's
// tick samples the leases' use.
func (p *testPool) sample(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	p.mu.Lock()
	use := &allocapi.ServerUse{SampledAt: p.clock.Now()}
	for _, r := range p.readings {
		use.Leases = append(use.Leases, allocapi.LeaseUse{Lease: r.Lease, GPU: r.GPU, SMUtilization: r.SMUtilization, MemoryUsedBytes: r.MemoryUsedBytes})
	}
	p.mu.Unlock()
	if err := p.client.Heartbeat(ctx, "s1", allocapi.Heartbeat{Use: use}); err != nil {
		t.Fatal(err)
	}
	p.clock.Add(allocapi.HistoryInterval)
	p.svc.Tick()
}

// idleForTheWindow samples the leases' use for the idle window.
func (p *testPool) idleForTheWindow(t *testing.T) {
	t.Helper()
	for range int(idleWindow / allocapi.HistoryInterval) {
		p.sample(t)
	}
}

// queue asks for a GPU for pod, owner labeled app=app, to wait for
// capacity or quota up to a minute, and waits until it is pending; the
// request is withdrawn when the returned function is called.
func (p *testPool) queue(t *testing.T, pod, app string) (withdraw func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = p.client.Acquire(ctx, allocapi.AcquireRequest{Namespace: "ml", GPUAmount: 1, UntilReleased: true, Wait: "1m",
			Owner: allocapi.Owner{Pod: pod, UID: "uid-" + pod, Labels: map[string]string{"app": app}}})
	}()
	waitUntil(t, func() bool { return len(p.svc.Status().Pending) > 0 })
	withdraw = func() {
		cancel()
		<-done
		waitUntil(t, func() bool { return len(p.svc.Status().Pending) == 0 })
	}
	t.Cleanup(withdraw)
	return withdraw
}

func waitUntil(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}
