// Command gpupool-webhook is gpupool's admission webhook for pods that ask
// for GPUs from the pool (kube/admission), served over HTTPS.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/httpserver"
	"github.com/gpupool/gpupool/kube"
	"github.com/gpupool/gpupool/kube/admission"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpupool-webhook", flag.ContinueOnError)
	listen := fs.String("listen", ":8443", "address to serve HTTPS on")
	certFile := fs.String("tls-cert-file", "", "the serving certificate (PEM), signed by the CA in the webhook configurations' caBundle; read again when it changes")
	keyFile := fs.String("tls-private-key-file", "", "the certificate's private key (PEM)")
	unitName := fs.String("unit", string(kube.UnitPercent), "what one bitfusion.io/gpu stands for, the same for the whole cluster: percent (100 is one GPU, as BFK) or gpus (1 is one GPU, as the articles)")
	gpuMemory := fs.String("gpu-memory", admission.DefaultGPUMemory, "one GPU's memory, which a bitfusion.io/gpu-memory request is a share of: a quantity (80Gi) or megabytes (16000); the default is BFK's")
	scheduler := fs.String("scheduler-name", kube.SchedulerName, "the spec.schedulerName written into the pods the webhook normalises (the kube-scheduler profile that places them through the pool); empty leaves a pod's own")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: gpupool-webhook --tls-cert-file FILE --tls-private-key-file FILE [flags]

The admission webhook for pods that ask for GPUs from the pool. It accepts the
resources users wrote for Bitfusion on Kubernetes (BFK) and the articles
about it, in a container or an init container (one per pod):

  bitfusion.io/gpu-amount: N (GPUs, 1..64, all on one server), alone (whole
    GPUs) or with bitfusion.io/gpu-percent: P (1..100, of each GPU) or
    bitfusion.io/gpu-memory: M (of each GPU: 8000 is megabytes, as in BFK,
    or a quantity such as 8000M or 16Gi)
  bitfusion.io/gpu: N, in the cluster's unit (--unit)

It writes them as bitfusion.io/gpu in the cluster's unit, in requests and
limits, so that a ResourceQuota on requests.bitfusion.io/gpu counts them:
N x P in percent, BFK's ceil(M / --gpu-memory x N x 100) for a memory, N in
gpus (where a fraction of a GPU is refused: the quota could not count it).
It records the whole request in the annotation gpupool.io/request (with the
models of gpupool.io/gpu-models), marks the pod auto-management/status:
injected, and sets spec.schedulerName (--scheduler-name), so that the pool
places it. BFK's annotations auto-management/bitfusion, bitfusion-client/os
and bitfusion-client/version are checked and kept; no client is injected, as
the pod runs on the GPU server that holds its lease.

Each refusal names the field, the value and the limit.

Served over HTTPS, as AdmissionReview v1:

  POST /mutate     normalises a created pod (a JSON patch), or refuses it
  POST /validate   refuses a created pod marked as handled whose request
                   does not match its bitfusion.io/gpu, and an update that
                   changes gpupool.io/request or the mark
  GET  /healthz    ok

kube-apiserver calls it through a MutatingWebhookConfiguration (pods,
CREATE, path /mutate) and a ValidatingWebhookConfiguration (pods, CREATE
and UPDATE, path /validate), each with clientConfig naming this server (a
Service, or an https URL) and in caBundle the CA that signed
--tls-cert-file; admissionReviewVersions [v1]; sideEffects None;
failurePolicy Fail, as a GPU pod left unnormalised could never run; and a
matchCondition that sends only pods naming a bitfusion.io resource (or
carrying gpupool.io/request), so that no other pod ever waits on the webhook.

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
	if *certFile == "" || *keyFile == "" {
		return bad("--tls-cert-file and --tls-private-key-file are required: kube-apiserver calls webhooks over HTTPS only")
	}
	unit, err := kube.ParseUnit(*unitName)
	if err != nil {
		return bad("--unit: %v", err)
	}
	memory, err := admission.ParseGPUMemory(*gpuMemory)
	if err != nil {
		return bad("--gpu-memory: %v", err)
	}
	pair, err := httpserver.LoadKeyPair(*certFile, *keyFile, log)
	if err != nil {
		return bad("%v", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("listening", "err", err)
		return 1
	}
	cfg := admission.Config{Unit: unit, GPUMemoryBytes: memory, SchedulerName: *scheduler}
	srv := httpserver.New(admission.NewHandler(cfg), httpserver.Default)
	srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: pair.GetCertificate}
	failed := make(chan error, 1)
	go func() { failed <- srv.ServeTLS(ln, "", "") }()
	log.Info("webhook serving", "address", "https://"+ln.Addr().String(), "unit", unit, "gpu_memory", *gpuMemory, "scheduler_name", *scheduler)
	select {
	case <-ctx.Done():
	case err := <-failed:
		if !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving", "err", err)
			return 1
		}
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	return 0
}
