// Command gpupool-adapter serves the GPU pool's signals to the
// HorizontalPodAutoscaler as external metrics (external.metrics.k8s.io).
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/cmd/options"

	"github.com/gpupool/gpupool/adapter"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/httpserver"
	"github.com/gpupool/gpupool/internal/kubeconfig"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("gpupool-adapter", pflag.ContinueOnError)
	backend := fs.String("backend", "direct", "where values come from: direct (the allocator and the GPU-server daemons; no Prometheus) or prometheus (PromQL)")
	allocatorURL := fs.String("allocator", "http://127.0.0.1:8470", "allocator address(es), comma-separated (--backend direct)")
	caFile := fs.String(cli.AllocatorCAFlag, os.Getenv(cli.AllocatorCAEnv), cli.AllocatorCAUsage)
	tokenFile := fs.String("allocator-token-file", "", "file holding an allocator admin token: the adapter reads every namespace's leases (--backend direct)")
	refresh := fs.Duration("refresh", 500*time.Millisecond, "how long one read of the pool answers queries (--backend direct)")
	promURL := fs.String("prometheus-url", "http://127.0.0.1:9090", "Prometheus (or VictoriaMetrics) base URL (--backend prometheus)")
	promQueries := fs.String("prometheus-queries", "", "YAML file of PromQL templates per metric; empty uses the built-in ones (--backend prometheus)")
	maxAge := fs.Duration("max-age", 30*time.Second, "oldest value served; an older one is an error to the HPA, which then holds its size")
	kubeconfigPath := fs.String("kubeconfig", "", "kubeconfig of the cluster that delegates authentication and authorization to; empty uses the in-cluster config")
	noDelegation := fs.Bool("no-delegation", false, "serve every request without asking a cluster who may (loopback demos only: INSECURE)")
	metricsListen := fs.String("metrics-listen", "127.0.0.1:9470", "address to serve the adapter's own /metrics on (plain HTTP)")
	opts := options.NewCustomMetricsAdapterServerOptions()
	opts.AddFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: gpupool-adapter [flags]

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

Flags:
`)
		fs.PrintDefaults()
	}
	if exit, ok := cli.Parse(fs, args, stdout, stderr); !ok {
		return exit
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	bad := func(format string, a ...any) int {
		log.Error("bad flag", "err", fmt.Sprintf(format, a...))
		return cli.ExitUsage
	}
	if *maxAge <= 0 {
		return bad("--max-age=%s must be above 0", *maxAge)
	}

	var be adapter.Backend
	switch *backend {
	case "direct":
		token, err := cli.ReadToken(*tokenFile)
		if err != nil {
			return bad("--allocator-token-file: %v", err)
		}
		c, err := client.New([]string{*allocatorURL}, token)
		if err != nil {
			return bad("--allocator: %v", err)
		}
		if err := c.TrustCAFile(*caFile); err != nil {
			return bad("--allocator-ca-file: %v", err)
		}
		// The HPA asks again in 15 s: answer now, from whichever replica
		// leads (each is tried twice), or not at all.
		c.Retries, c.Timeout = 2*len(strings.Split(*allocatorURL, ",")), 5*time.Second
		be = adapter.NewDirect(c, *refresh, log)
	case "prometheus":
		p, err := adapter.NewPrometheus(*promURL, *promQueries)
		if err != nil {
			return bad("%v", err)
		}
		be = p
	default:
		return bad("--backend %q is not one of direct, prometheus", *backend)
	}

	var kube *rest.Config
	if *noDelegation {
		log.Warn("INSECURE: --no-delegation serves every request without authentication or authorization; use it on loopback only")
	} else {
		var err error
		if kube, err = kubeconfig.Load(*kubeconfigPath); err != nil {
			return bad("no cluster to delegate authentication to (--kubeconfig, or run in a pod; --no-delegation for a loopback demo): %v", err)
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	prov := adapter.NewProvider(be, *maxAge, adapter.NewMetrics(reg), nil, log)
	srv, err := adapter.NewServer(opts, kube, prov)
	if err != nil {
		log.Error("building the API server", "err", err)
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *metricsListen)
	if err != nil {
		log.Error("listening for /metrics", "err", err)
		return 1
	}
	metrics := httpserver.New(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), httpserver.Default)
	go func() { _ = metrics.Serve(ln) }()
	defer func() { _ = metrics.Close() }()
	log.Info("adapter serving", "backend", be.Name(), "max_age", *maxAge, "metrics", "http://"+ln.Addr().String()+"/metrics",
		"api", fmt.Sprintf("https://%s:%d/apis/external.metrics.k8s.io/v1beta1", opts.SecureServing.BindAddress, opts.SecureServing.BindPort))
	if err := srv.GenericAPIServer.PrepareRun().RunWithContext(ctx); err != nil {
		log.Error("serving", "err", err)
		return 1
	}
	return 0
}
