// Package app runs gpupool-webhook from its Options: the admission webhook
// (kube/admission) over HTTPS.
package app

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"

	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/httpserver"
	"github.com/gpupool/gpupool/kube/admission"
)

// Usage is what --help says above the flags.
const Usage = `Usage: gpupool-webhook --tls-cert-file FILE --tls-private-key-file FILE [flags]

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

  POST /mutate     normalises a created pod (a JSON patch), or refuses it;
                   a pod created marked as handled is refused when its
                   request does not match its bitfusion.io/gpu
  GET  /healthz    ok

kube-apiserver calls it through a MutatingWebhookConfiguration (pods,
CREATE, path /mutate) with clientConfig naming this server (a Service, or an
https URL) and in caBundle the CA that signed --tls-cert-file;
admissionReviewVersions [v1]; sideEffects None; reinvocationPolicy IfNeeded
(called again after a later webhook changed the pod); failurePolicy Fail, as
a GPU pod left unnormalised could never run; and a matchCondition that sends
only pods naming a bitfusion.io resource (or carrying gpupool.io/request),
so that no other pod ever waits on the webhook. That an update never changes
gpupool.io/request or the mark is the ValidatingAdmissionPolicy
gpupool-pod-annotations' (deploy/components/kubernetes): no update of a pod
waits on this webhook.
`

// Run serves the webhook until ctx ends or serving fails. The serving
// certificate is read again when it is renewed.
func Run(ctx context.Context, o *Options, log *slog.Logger) error {
	pair, err := httpserver.LoadKeyPair(o.CertFile, o.KeyFile, log)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	cfg := admission.Config{Unit: o.Unit, GPUMemoryBytes: o.GPUMemoryBytes, SchedulerName: o.SchedulerName, DefaultTopology: o.DefaultTopology}
	webhook := httpserver.Endpoint{Name: "the webhook", Server: httpserver.New(admission.NewHandler(cfg), httpserver.Default)}
	webhook.Server.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: pair.GetCertificate}
	if webhook.Listener, err = net.Listen("tcp", o.Listen); err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	log.Info("webhook serving", "address", "https://"+webhook.Listener.Addr().String(), "unit", o.Unit, "gpu_memory", o.GPUMemory, "scheduler_name", o.SchedulerName, "default_topology", o.DefaultTopology)
	return httpserver.Serve(ctx, []httpserver.Endpoint{webhook})
}

// Command is gpupool-webhook's command line: its options, and Run on them.
func Command() cli.Service {
	o := NewOptions()
	return cli.Service{Name: "gpupool-webhook", Usage: Usage, Options: o,
		Run: func(ctx context.Context, log *slog.Logger) error { return Run(ctx, o, log) }}
}
