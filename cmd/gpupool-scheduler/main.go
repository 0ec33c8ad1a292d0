// Command gpupool-scheduler places pods through the GPU pool: it serves
// kube-scheduler's extender (kube/scheduler) and runs the controller that
// ends each pod's lease with the pod (kube/leases).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"

	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/httpserver"
	"github.com/gpupool/gpupool/internal/kubeconfig"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/leases"
	"github.com/gpupool/gpupool/kube/scheduler"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpupool-scheduler", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8474", "address of the extender (POST /filter, POST /bind): plain HTTP on a loopback address only, else TLS with client certificates")
	certFile := fs.String("tls-cert-file", "", "serving certificate (PEM) of the extender; read again when it changes")
	keyFile := fs.String("tls-private-key-file", "", "private key (PEM) of --tls-cert-file")
	clientCAFile := fs.String("client-ca-file", "", "CA (PEM) that signs kube-scheduler's client certificate; required off loopback")
	metricsListen := fs.String("metrics-listen", "127.0.0.1:9474", "address of /metrics and /healthz (plain HTTP)")
	allocatorURL := fs.String("allocator", "http://127.0.0.1:8470", "allocator address(es), comma-separated")
	caFile := cli.AddAllocatorCAFlag(fs)
	tokenFile := fs.String("token-file", "", "file holding an allocator admin token: the extender acquires leases in every namespace")
	kubeconfigPath := fs.String("kubeconfig", "", "kubeconfig of the cluster; empty uses the in-cluster config")
	unitName := fs.String("unit", string(kube.UnitPercent), "what one bitfusion.io/gpu stands for, the webhook's --unit: percent (100 is one GPU, as BFK) or gpus; the unit the ResourceQuotas' requests.bitfusion.io/gpu are read in")
	resync := fs.Duration("resync", leases.DefaultResync, "how often every lease is compared with its pod and every quota with its ResourceQuotas (and once at start)")
	qps := fs.Float64("kube-api-qps", 200, "requests per second to kube-apiserver (a bind reads the pod and creates its binding)")
	burst := fs.Int("kube-api-burst", 400, "burst of requests to kube-apiserver above --kube-api-qps")
	unboundTimeout := fs.Duration("unbound-lease-timeout", scheduler.DefaultUnboundLeaseTimeout, "how long a lease a filter took waits for its pod's bind: then, the pod still unbound, it is released (kube-scheduler's cycle failed after the filter, which the extender protocol does not report); the resync releases such leases too, after a restart")
	logFlags := cli.AddLogFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: gpupool-scheduler [flags]

Places pods through the GPU pool as a kube-scheduler extender. kube-scheduler
(the upstream one, as a second profile or scheduler named gpupool-scheduler)
filters the nodes itself, then calls POST /filter with the feasible node
names: the extender reads the pod as kube-apiserver has it (never as the
call describes it), acquires its lease from the allocator among those nodes,
with the pod as its owner and its UID as the idempotency key, and answers the
lease's server as the only node. POST /bind binds the pod with that lease,
the annotations gpupool.io/lease and gpupool.io/gpus written with the node
in one Binding. The calls for one pod are taken one at a time, and the lease
of a pod that is bound, or being bound, is never moved. A pod the pool
cannot place stays Pending with kube-scheduler's FailedScheduling event
saying why. The extender protocol has no Unreserve: a lease a filter took
whose pod is not bound within --unbound-lease-timeout (its scheduling cycle
failed after the filter) is released. --log-level debug logs every call with
the allocator's answer.

kube-scheduler's extender configuration: urlPrefix this address, filterVerb
filter, bindVerb bind, nodeCacheCapable true, managedResources
[{name: bitfusion.io/gpu, ignoredByScheduler: true}], and
percentageOfNodesToScore 100 (else the extender sees a sample of the nodes).

It also runs the lease controller: a pod's lease, which has no TTL, ends
when the pod is deleted, succeeds or fails, or its node is deleted; a resync
at start and every --resync releases leases whose pod is gone and acquires
again those of bound pods that lost theirs; the namespaces' ResourceQuotas on
requests.bitfusion.io/gpu (in --unit) are the allocator's quotas.

Serving: on a loopback address (a container beside kube-scheduler in its
pod) the extender speaks plain HTTP; anywhere else it needs
--tls-cert-file, --tls-private-key-file and --client-ca-file, and answers
only a client certificate that CA signed (kube-scheduler's tlsConfig
certFile/keyFile): whoever can call /bind binds pods and whoever can call
/filter takes GPUs. The serving certificate is read again when it is
renewed; the client CA is read at start.

Flags:
`)
		fs.PrintDefaults()
	}
	if exit, ok := cli.Parse(fs, args, stdout, stderr); !ok {
		return exit
	}
	log, err := logFlags.Logger(stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return cli.ExitUsage
	}
	bad := func(err error) int {
		log.Error("bad flag", "err", err)
		return cli.ExitUsage
	}
	tlsConfig, err := servingTLS(*listen, *certFile, *keyFile, *clientCAFile, log)
	if err != nil {
		return bad(err)
	}
	unit, err := kube.ParseUnit(*unitName)
	if err != nil {
		return bad(fmt.Errorf("--unit: %w", err))
	}
	token, err := cli.ReadToken(*tokenFile)
	if err != nil {
		return bad(fmt.Errorf("--token-file: %w", err))
	}
	alloc, err := client.New([]string{*allocatorURL}, token)
	if err != nil {
		return bad(fmt.Errorf("--allocator: %w", err))
	}
	if err := alloc.TrustCAFile(*caFile); err != nil {
		return bad(fmt.Errorf("--allocator-ca-file: %w", err))
	}
	// kube-scheduler waits 5 s for a filter (its httpTimeout) while its
	// one scheduling loop waits with it: fail over between replicas once
	// and answer within that, so the pod's event says why.
	alloc.Retries, alloc.Timeout = 2*len(strings.Split(*allocatorURL, ",")), 3*time.Second
	kubeConfig, err := kubeconfig.Load(*kubeconfigPath)
	if err != nil {
		return bad(fmt.Errorf("no cluster (--kubeconfig, or run in a pod): %w", err))
	}
	kubeConfig.QPS, kubeConfig.Burst, kubeConfig.UserAgent = float32(*qps), *burst, "gpupool-scheduler"
	kubeClient, err := kubernetes.NewForConfig(kubeConfig)
	if err != nil {
		return bad(fmt.Errorf("--kubeconfig: %w", err))
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	controller, err := leases.NewController(leases.Config{Client: kubeClient, Allocator: alloc, Unit: unit, Resync: *resync,
		UnboundLeaseTimeout: *unboundTimeout, Logger: log, Registry: reg})
	if err != nil {
		return bad(err)
	}
	ext := scheduler.New(scheduler.Config{Allocator: alloc, Kube: kubeClient, Pods: controller.Pods(),
		UnboundLeaseTimeout: *unboundTimeout, Registry: reg, Logger: log})

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("listening for the extender", "err", err)
		return 1
	}
	metricsLn, err := net.Listen("tcp", *metricsListen)
	if err != nil {
		_ = ln.Close()
		log.Error("listening for /metrics", "err", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	metricsMux := http.NewServeMux()
	metricsMux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	metricsMux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	extender := httpserver.New(ext.Handler(), httpserver.Default)
	extender.TLSConfig = tlsConfig
	metrics := httpserver.New(metricsMux, httpserver.Default)
	failed := make(chan error, 3) // one per server and the controller: none waits to send
	go func() {
		if tlsConfig != nil {
			failed <- extender.ServeTLS(ln, "", "")
		} else {
			failed <- extender.Serve(ln)
		}
	}()
	go func() { failed <- metrics.Serve(metricsLn) }()
	go func() {
		if err := controller.Run(ctx); err != nil && ctx.Err() == nil {
			failed <- fmt.Errorf("lease controller: %w", err)
		}
	}()
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
	}
	log.Info("extender serving", "url", scheme+"://"+ln.Addr().String(), "metrics", "http://"+metricsLn.Addr().String()+"/metrics", "allocator", *allocatorURL, "unit", unit)

	code := 0
	select {
	case <-ctx.Done():
	case err := <-failed:
		log.Error("stopping", "err", err)
		code = 1
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = extender.Shutdown(shutdown)
	_ = metrics.Shutdown(shutdown)
	return code
}

// servingTLS is the extender's TLS, or nil for plain HTTP, which only a
// loopback address may serve: anyone who reaches /bind binds pods, and
// anyone who reaches /filter takes GPUs, so off loopback the extender
// answers only clients with a certificate from clientCAFile.
func servingTLS(listen, certFile, keyFile, clientCAFile string, log *slog.Logger) (*tls.Config, error) {
	loopback, err := httpserver.IsLoopback(listen)
	if err != nil {
		return nil, err
	}
	switch {
	case (certFile == "") != (keyFile == ""):
		return nil, errors.New("--tls-cert-file and --tls-private-key-file go together")
	case certFile == "" && clientCAFile != "":
		return nil, errors.New("--client-ca-file needs --tls-cert-file and --tls-private-key-file")
	case certFile == "" && loopback:
		return nil, nil
	case certFile == "":
		return nil, fmt.Errorf("--listen %s is not a loopback address: serving there needs --tls-cert-file, --tls-private-key-file and --client-ca-file", listen)
	case clientCAFile == "" && !loopback:
		return nil, fmt.Errorf("--listen %s is not a loopback address: --client-ca-file must name the CA of kube-scheduler's client certificate", listen)
	}
	pair, err := httpserver.LoadKeyPair(certFile, keyFile, log)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: pair.GetCertificate}
	if clientCAFile != "" {
		pem, err := os.ReadFile(clientCAFile) //nolint:gosec // the operator names the CA file
		if err != nil {
			return nil, fmt.Errorf("--client-ca-file: %w", err)
		}
		cfg.ClientCAs = x509.NewCertPool()
		if !cfg.ClientCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--client-ca-file %s holds no PEM certificate", clientCAFile)
		}
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
