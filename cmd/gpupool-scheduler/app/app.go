// Package app runs gpupool-scheduler from its Options: the lease
// controller and quota reconciliation (kube/leases), leader-elected, and,
// with --listen, kube-scheduler's extender (kube/scheduler/extender).
package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/httpserver"
	"github.com/gpupool/gpupool/internal/kubeconfig"
	"github.com/gpupool/gpupool/internal/metricdef"
	"github.com/gpupool/gpupool/kube/dra"
	"github.com/gpupool/gpupool/kube/leases"
	"github.com/gpupool/gpupool/kube/scheduler"
	"github.com/gpupool/gpupool/kube/scheduler/extender"
)

// Usage is what --help says above the flags.
const Usage = `Usage: gpupool-scheduler [flags]
       gpupool-scheduler secrets [flags]
       gpupool-scheduler resume [flags]

Runs the controllers that keep the GPU pool's leases and quotas in step
with the cluster, beside the kube-scheduler that places the pool's pods
(gpupool-kube-scheduler, whose GPUPool plugin takes each pod's lease from
the allocator and binds the pod with it).

The lease controller: a pod's lease, which has no TTL, ends when the pod
is deleted, succeeds or fails, or its node is deleted; a resync at start
and every --resync releases leases whose pod is gone, or still unbound
--resync-unbound-lease-timeout after their grant (a scheduling cycle that
died with kube-scheduler), and acquires again those of bound pods that
lost theirs. Quota reconciliation: the namespaces' ResourceQuotas on
requests.bitfusion.io/gpu (in --unit) are the allocator's quotas.

Dynamic Resource Allocation: every --resource-slices-every the pool's
servers are read and their healthy GPUs published as ResourceSlices of
driver gpu.gpupool.io, which ResourceClaims of DeviceClass gpu.gpupool.io
ask for (gpupool-kube-scheduler places them).

Leader election: with --leader-elect (the default) the replicas elect one
through the coordination.k8s.io Lease gpupool-lease-controller in
--leader-elect-namespace, and only it reconciles and publishes; the others stand by and
take over within 15 s of its loss. /metrics and /healthz are served on
--metrics-listen by every replica.

Subcommands: "gpupool-scheduler secrets" makes the Helm chart's Secrets
(tokens, the allocator's configuration, the CA) in the cluster and exits;
"gpupool-scheduler resume", which "gpupool resume" runs, undoes what an
idle policy reclaimed. Each takes --help.

The extender, only with --listen: for an upstream kube-scheduler without
the plugin, it also serves kube-scheduler's HTTP extender over the same
placement. kube-scheduler filters the nodes itself, then calls POST
/filter with the feasible node names: the pod is read as kube-apiserver
has it (never as the call describes it), its lease acquired from the
allocator among those nodes, with the pod as its owner and its UID as the
idempotency key, and the lease's server answered as the only node. POST
/bind binds the pod with that lease, the annotations gpupool.io/lease and
gpupool.io/gpus written with the node in one Binding. A pod the pool
cannot place stays Pending with kube-scheduler's FailedScheduling event
saying why. The extender protocol has no Unreserve: a lease a filter took
whose pod is not bound within --unbound-lease-timeout is released.
--log-level debug logs every call with the allocator's answer.
kube-scheduler's extender configuration: urlPrefix this address,
filterVerb filter, bindVerb bind, nodeCacheCapable true, managedResources
[{name: bitfusion.io/gpu, ignoredByScheduler: true}], and
percentageOfNodesToScore 100 (else the extender sees a sample of the
nodes). On a loopback address (a container beside kube-scheduler in its
pod) it speaks plain HTTP; anywhere else it needs --tls-cert-file,
--tls-private-key-file and --client-ca-file, and answers only a client
certificate that CA signed (kube-scheduler's tlsConfig certFile/keyFile):
whoever can call /bind binds pods and whoever can call /filter takes GPUs.
The serving certificate is read again when it is renewed; the client CA
is read at start. The manifests run no extender.
`

// Run runs the lease controller and serves /metrics, and the extender
// with --listen, until ctx ends or one of them fails.
func Run(ctx context.Context, o *Options, log *slog.Logger) error {
	tlsConfig, err := servingTLS(o, log)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	alloc, err := client.NewFromFlags(client.Flags{Allocator: o.Allocator, CAFile: o.AllocatorCAFile, TokenFile: o.TokenFile, TokenFlag: "--token-file"})
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	// kube-scheduler waits 5 s for a filter (its httpTimeout) while its
	// one scheduling loop waits with it: fail over between replicas once
	// and answer within that, so the pod's event says why.
	alloc.Retries, alloc.Timeout = 2*len(strings.Split(o.Allocator, ",")), 3*time.Second
	kubeClient, err := kubeconfig.Client(o.Kubeconfig, "gpupool-scheduler", func(c *rest.Config) {
		c.QPS, c.Burst = float32(o.KubeAPIQPS), o.KubeAPIBurst
	})
	if err != nil {
		return &cli.UsageError{Err: err}
	}

	reg := metricdef.NewProcessRegistry()
	election, err := o.election()
	if err != nil {
		return err
	}
	cfg := leases.Config{Client: kubeClient, Allocator: alloc, Unit: o.Unit, GPUMemoryBytes: o.GPUMemoryBytes, Resync: o.Resync,
		UnboundLeaseTimeout: o.ResyncUnboundLeaseTimeout, Election: election, Logger: log, Registry: reg}
	if o.ResourceSlicesEvery > 0 {
		cfg.WhileLeading = func(ctx context.Context) {
			ctx = klog.NewContext(ctx, logr.FromSlogHandler(log.Handler()))
			if err := dra.Publish(ctx, kubeClient, alloc, o.ResourceSlicesEvery); err != nil {
				log.Error("no ResourceSlices published", "err", err)
			}
		}
	}
	if o.Listen != "" {
		// The extender's waits for binds are in this process: after a
		// restart, the resync at start ends those they would have.
		cfg.StartUnboundLeaseTimeout = o.UnboundLeaseTimeout
	}
	controller, err := leases.NewController(cfg)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	metrics := httpserver.Endpoint{Name: "/metrics", Server: httpserver.New(httpserver.MetricsHandler(reg), httpserver.Default)}
	if metrics.Listener, err = net.Listen("tcp", o.MetricsListen); err != nil {
		return fmt.Errorf("listening for /metrics: %w", err)
	}
	endpoints := []httpserver.Endpoint{metrics}
	if o.Listen == "" {
		log.Info("no extender (--listen empty): the lease controller and /metrics only", "metrics", "http://"+metrics.Listener.Addr().String()+"/metrics",
			"allocator", o.Allocator, "unit", o.Unit)
	} else {
		placer := scheduler.New(scheduler.Config{Allocator: alloc, Kube: kubeClient, Pods: controller.Pods(),
			UnboundLeaseTimeout: o.UnboundLeaseTimeout, Registry: reg})
		// The placer logs through logr: V(2), its record of each call,
		// shows at slog's debug.
		ext := extender.New(placer, logr.FromSlogHandler(log.Handler()))
		served := httpserver.Endpoint{Name: "the extender", Server: httpserver.New(ext.Handler(), httpserver.Default)}
		served.Server.TLSConfig = tlsConfig
		if served.Listener, err = net.Listen("tcp", o.Listen); err != nil {
			_ = metrics.Listener.Close()
			return fmt.Errorf("listening for the extender: %w", err)
		}
		endpoints = append(endpoints, served)
		log.Info("extender serving", "url", httpserver.Scheme(served.Server)+"://"+served.Listener.Addr().String(),
			"metrics", "http://"+metrics.Listener.Addr().String()+"/metrics", "allocator", o.Allocator, "unit", o.Unit)
	}
	return httpserver.Serve(ctx, endpoints, func(ctx context.Context) error {
		if err := controller.Run(ctx); err != nil {
			return fmt.Errorf("lease controller: %w", err)
		}
		return nil
	})
}

// servingTLS is the extender's TLS (servingMode), or nil for plain HTTP.
// The serving certificate is read again when it is renewed.
func servingTLS(o *Options, log *slog.Logger) (*tls.Config, error) {
	if on, err := servingMode(o.Listen, o.TLSServingFlags, o.ClientCAFile); !on || err != nil {
		return nil, err
	}
	pair, err := httpserver.LoadKeyPair(o.CertFile, o.KeyFile, log)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: pair.GetCertificate}
	if o.ClientCAFile != "" {
		pem, err := os.ReadFile(o.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("--client-ca-file: %w", err)
		}
		cfg.ClientCAs = x509.NewCertPool()
		if !cfg.ClientCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--client-ca-file %s holds no PEM certificate", o.ClientCAFile)
		}
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// Command is gpupool-scheduler's command line: its options, and Run on them.
func Command() cli.Service {
	o := NewOptions()
	return cli.Service{Name: "gpupool-scheduler", Usage: Usage, Options: o,
		Run: func(ctx context.Context, log *slog.Logger) error { return Run(ctx, o, log) }}
}
