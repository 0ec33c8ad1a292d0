package app

import (
	"fmt"
	"net"
	"os"
	"time"

	"github.com/spf13/pflag"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/cmd/options"

	"github.com/gpupool/gpupool/internal/cli"
)

// Options are gpupool-adapter's flags: its own, and custom-metrics-apiserver's
// serving options (Serving), which are spf13/pflag's.
type Options struct {
	// Backend is where values come from: direct or prometheus.
	Backend string
	// Allocator is one address or several, comma-separated.
	Allocator, AllocatorCAFile, AllocatorTokenFile string
	Refresh                                        time.Duration
	PrometheusURL, PrometheusQueries               string
	MaxAge                                         time.Duration
	Kubeconfig                                     string
	NoDelegation                                   bool
	MetricsListen                                  string
	// MetricsListener, when set, serves /metrics in place of MetricsListen:
	// no flag sets it, a caller that runs the adapter in its own process
	// does (gpupool-demo), as Serving.SecureServing.Listener for the API.
	MetricsListener net.Listener
	// KedaScalerListen serves KEDA's external scaler API there (gRPC over
	// TLS); empty serves none. KedaClientCA is the CA file of the client
	// certificates it accepts: KEDA's TriggerAuthentication's.
	KedaScalerListen, KedaClientCA string
	// KedaScalerListener, when set, serves it in place of KedaScalerListen,
	// as MetricsListener does /metrics.
	KedaScalerListener net.Listener

	Serving *options.CustomMetricsAdapterServerOptions
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		Backend: "direct", Allocator: "http://127.0.0.1:8470", Refresh: 500 * time.Millisecond,
		PrometheusURL: "http://127.0.0.1:9090", MaxAge: 30 * time.Second, MetricsListen: "127.0.0.1:9470",
		Serving: options.NewCustomMetricsAdapterServerOptions(),
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Backend, "backend", o.Backend, "where values come from: direct (the allocator and the GPU-server daemons; no Prometheus) or prometheus (PromQL)")
	fs.StringVar(&o.Allocator, "allocator", o.Allocator, "allocator address(es), comma-separated (--backend direct)")
	fs.StringVar(&o.AllocatorCAFile, cli.AllocatorCAFlag, os.Getenv(cli.AllocatorCAEnv), cli.AllocatorCAUsage)
	fs.StringVar(&o.AllocatorTokenFile, "allocator-token-file", o.AllocatorTokenFile, "file holding an allocator admin token: the adapter reads every namespace's leases (--backend direct)")
	fs.DurationVar(&o.Refresh, "refresh", o.Refresh, "how long one read of the pool answers queries (--backend direct)")
	fs.StringVar(&o.PrometheusURL, "prometheus-url", o.PrometheusURL, "Prometheus (or VictoriaMetrics) base URL (--backend prometheus)")
	fs.StringVar(&o.PrometheusQueries, "prometheus-queries", o.PrometheusQueries, "YAML file of PromQL templates per metric; empty uses the built-in ones (--backend prometheus)")
	fs.DurationVar(&o.MaxAge, "max-age", o.MaxAge, "oldest value served; an older one is an error to the HPA, which then holds its size")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig of the cluster that delegates authentication and authorization to; empty uses the in-cluster config")
	fs.BoolVar(&o.NoDelegation, "no-delegation", o.NoDelegation, "serve every request without asking a cluster who may (loopback demos only: INSECURE)")
	fs.StringVar(&o.MetricsListen, "metrics-listen", o.MetricsListen, "address to serve the adapter's own /metrics on (plain HTTP)")
	fs.StringVar(&o.KedaScalerListen, "keda-scaler-listen", o.KedaScalerListen,
		"address to serve KEDA's external scaler API on (gRPC over TLS, with the serving certificate of --tls-cert-file; :9471), for ScaledObjects' external and external-push triggers; empty serves none (needs --backend direct and --keda-client-ca)")
	fs.StringVar(&o.KedaClientCA, "keda-client-ca", o.KedaClientCA,
		"PEM file of the CA whose client certificates the KEDA scaler accepts: the one that signed the tlsClientCert of KEDA's TriggerAuthentication; a client without one is refused")
	o.Serving.AddFlags(fs)
}

// Validate checks the adapter's own options; adapter.NewServer checks the
// serving options.
func (o *Options) Validate() error {
	if o.MaxAge <= 0 {
		return fmt.Errorf("--max-age=%s must be above 0", o.MaxAge)
	}
	switch o.Backend {
	case "direct", "prometheus":
	default:
		return fmt.Errorf("--backend %q is not one of direct, prometheus", o.Backend)
	}
	return o.validateKeda()
}

// validateKeda checks the KEDA scaler's flags.
func (o *Options) validateKeda() error {
	listen := o.KedaScalerListen
	switch {
	case o.KedaScalerListener != nil:
		listen = o.KedaScalerListener.Addr().String()
	case listen == "" && o.KedaClientCA != "":
		return fmt.Errorf("--keda-client-ca=%s without --keda-scaler-listen: it is the KEDA scaler's, which serves only with an address", o.KedaClientCA)
	case listen == "":
		return nil
	}
	if _, _, err := net.SplitHostPort(listen); err != nil {
		return fmt.Errorf("--keda-scaler-listen=%s is not an address such as :9471: %w", listen, err)
	}
	if o.KedaClientCA == "" {
		return fmt.Errorf("--keda-scaler-listen=%s needs --keda-client-ca: the scaler answers only clients with a certificate that CA signed "+
			"(KEDA's TriggerAuthentication's tlsClientCert), since anyone else could read every namespace's use through it", listen)
	}
	if o.Backend != "direct" {
		return fmt.Errorf("--keda-scaler-listen=%s needs --backend=direct, not %s: the scaler's activity reads the allocator's idle verdicts per lease, which Prometheus does not hold by pod labels",
			listen, o.Backend)
	}
	return nil
}
