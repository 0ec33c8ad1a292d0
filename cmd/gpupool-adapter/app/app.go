// Package app runs gpupool-adapter from its Options: the external metrics
// API (adapter) and the adapter's own /metrics.
package app

import (
	"cmp"
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/gpupool/gpupool/adapter"
	"github.com/gpupool/gpupool/adapter/kedascaler"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/httpserver"
	"github.com/gpupool/gpupool/internal/kubeconfig"
	"github.com/gpupool/gpupool/internal/metricdef"
)

// Usage is what --help says above the flags.
const Usage = `Usage: gpupool-adapter [flags]

Serves external.metrics.k8s.io/v1beta1 for the HorizontalPodAutoscaler, built
on sigs.k8s.io/custom-metrics-apiserver. Metrics, each for a namespace and a
label selector on the owner pods of the leases:

  bitfusion_gpu_utilization        SM use of the leases' GPU shares over those shares (0..1)
  bitfusion_memory_pressure        GPU memory used over granted
  bitfusion_rdma_latency_seconds   p99 round trip over 5 minutes, per transport
  bitfusion_pool_unallocated_gpus  free GPU share of healthy GPUs, per model (selector: model=...)
  bitfusion_lease_pending_requests lease requests queued for capacity or quota

A value older than --max-age, or no value, is an error to the HPA (it then
holds its size), never a zero. Register it as the v1beta1.external.metrics.k8s.io
APIService; deploy/ has the manifests, docs/adapter.md the details.

With --keda-scaler-listen it also serves KEDA's external scaler API (gRPC
over TLS, client certificates signed by --keda-client-ca): a ScaledObject
scales on bitfusion_gpu_utilization, bitfusion_memory_pressure or
bitfusion_idle_held_share, to zero once its leases have been idle for their
namespace's whole window, and back while a lease request of its pods waits.
`

// Run serves the external metrics API and /metrics until ctx ends or one
// of them fails.
func Run(ctx context.Context, o *Options, log *slog.Logger) error {
	be, err := newBackend(o, log)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	var kedaCAs *x509.CertPool
	if o.KedaClientCA != "" {
		if kedaCAs, err = kedascaler.ClientCAs(o.KedaClientCA); err != nil {
			return &cli.UsageError{Err: fmt.Errorf("--keda-client-ca: %w", err)}
		}
	}
	var kube *rest.Config
	if o.NoDelegation {
		log.Warn("INSECURE: --no-delegation serves every request without authentication or authorization; use it on loopback only")
	} else if kube, err = kubeconfig.Load(o.Kubeconfig); err != nil {
		return &cli.UsageError{Err: fmt.Errorf("no cluster to delegate authentication to (--kubeconfig, or run in a pod; --no-delegation for a loopback demo): %w", err)}
	}

	reg := metricdef.NewProcessRegistry()
	prov := adapter.NewProvider(be, o.MaxAge, adapter.NewMetrics(reg), nil, log)
	srv, err := adapter.NewServer(o.Serving, kube, prov)
	if err != nil {
		return fmt.Errorf("building the API server: %w", err)
	}
	metrics := httpserver.Endpoint{Name: "/metrics", Server: httpserver.New(httpserver.MetricsHandler(reg), httpserver.Default)}
	if metrics.Listener, err = httpserver.Listen(o.MetricsListener, o.MetricsListen); err != nil {
		return fmt.Errorf("listening for /metrics: %w", err)
	}
	// Serve returns once ctx ends and /metrics is drained, without waiting
	// for its tasks; the API server drains its own requests (the
	// aggregator's, in flight), the KEDA scaler its calls, and the command
	// waits for them here.
	apiStopped := make(chan error, 1)
	tasks := []func(context.Context) error{func(ctx context.Context) error {
		err := srv.GenericAPIServer.PrepareRun().RunWithContext(ctx)
		if err != nil {
			err = fmt.Errorf("serving the external metrics API: %w", err)
		}
		apiStopped <- err
		return err
	}}
	kedaStopped := make(chan error, 1)
	kedaAt := "off"
	if kedaCAs != nil {
		ln, err := httpserver.Listen(o.KedaScalerListener, o.KedaScalerListen)
		if err != nil {
			_ = metrics.Listener.Close()
			return fmt.Errorf("listening for KEDA's external scaler: %w", err)
		}
		kedaAt = ln.Addr().String()
		// The API server's certificate, which it reads again when its
		// files change.
		tlsConfig := kedascaler.ServerTLS(srv.GenericAPIServer.SecureServingInfo.Cert, kedaCAs)
		scaler := kedascaler.New(kedascaler.Config{Provider: prov, Registry: reg, Log: log})
		tasks = append(tasks, func(ctx context.Context) error {
			err := scaler.Serve(ctx, ln, tlsConfig)
			kedaStopped <- err
			return err
		})
	} else {
		kedaStopped <- nil
	}
	log.Info("adapter serving", "backend", be.Name(), "max_age", o.MaxAge, "metrics", "http://"+metrics.Listener.Addr().String()+"/metrics",
		"api", fmt.Sprintf("https://%s:%d/apis/external.metrics.k8s.io/v1beta1", o.Serving.SecureServing.BindAddress, o.Serving.SecureServing.BindPort),
		"keda_scaler", kedaAt)
	err = httpserver.Serve(ctx, []httpserver.Endpoint{metrics}, tasks...)
	return cmp.Or(err, <-apiStopped, <-kedaStopped)
}

// newBackend is the backend --backend names, from its flags.
func newBackend(o *Options, log *slog.Logger) (adapter.Backend, error) {
	if o.Backend == "prometheus" {
		p, err := adapter.NewPrometheus(o.PrometheusURL, o.PrometheusQueries)
		if err != nil {
			return nil, err
		}
		return p, nil
	}
	c, err := client.NewFromFlags(client.Flags{Allocator: o.Allocator, CAFile: o.AllocatorCAFile, TokenFile: o.AllocatorTokenFile, TokenFlag: "--allocator-token-file"}) //nolint:gosec // a flag's name, not a credential
	if err != nil {
		return nil, err
	}
	// The HPA asks again in 15 s: answer now, from whichever replica
	// leads (each is tried twice), or not at all.
	c.Retries, c.Timeout = 2*len(strings.Split(o.Allocator, ",")), 5*time.Second
	return adapter.NewDirect(c, o.Refresh, log), nil
}

// Command is gpupool-adapter's command line: its options, and Run on them,
// on pflag, as custom-metrics-apiserver's serving flags are.
func Command() cli.PflagService {
	o := NewOptions()
	return cli.PflagService{Name: "gpupool-adapter", Usage: Usage, Options: o,
		Run: func(ctx context.Context, log *slog.Logger) error { return Run(ctx, o, log) }}
}
