// Command gpupool-secrets makes, in the cluster, the Secrets the Helm
// chart's components read (kube/secrets): the allocator's tokens and
// config and, with --certs, a CA of the pool's own, the serving
// certificates it signs, and the caBundles that trust it. The chart runs it
// as a hook Job before and after each install, upgrade and rollback, so
// that no token and no private key is in the release.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/kubeconfig"
	"github.com/gpupool/gpupool/kube/secrets"
)

const usage = `Usage: gpupool-secrets [flags]

Makes the Secrets of gpupool's Helm chart in --namespace, keeping what it
finds: gpupool-tokens (admin-token, server-token, reader-token: random, or
GPUPOOL_ADMIN_TOKEN and GPUPOOL_SERVER_TOKEN when set), and
gpupool-allocator-config (config.yaml: those tokens and --allocator-namespaces).
With --certs, gpupool-ca (a CA of ten years) and gpupool-allocator-tls,
gpupool-adapter-tls and gpupool-webhook-tls (a year, made again a month
before they end), and the CA as the caBundle of --webhook and --apiservice
where they exist. Then it exits.
`

type options struct {
	kubeconfig, namespace, namespaces, webhook, apiService string
	certs                                                  bool
}

func (o *options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: the pod's ServiceAccount")
	fs.StringVar(&o.namespace, "namespace", "gpupool", "the namespace of the Secrets")
	fs.StringVar(&o.namespaces, "allocator-namespaces", "{}", "the allocator config's namespaces (quotas and tokens), a JSON object")
	fs.BoolVar(&o.certs, "certs", false, "make the CA and the serving certificates, and set the caBundles")
	fs.StringVar(&o.webhook, "webhook", "gpupool", "the MutatingWebhookConfiguration whose caBundle is the CA, with --certs")
	fs.StringVar(&o.apiService, "apiservice", "v1beta1.external.metrics.k8s.io", "the APIService whose caBundle is the CA, with --certs")
}

func (o *options) Validate() error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(o.namespaces), &m); err != nil {
		return fmt.Errorf("--allocator-namespaces %q: not a JSON object: %w", o.namespaces, err)
	}
	if o.namespace == "" {
		return errors.New("--namespace: empty")
	}
	return nil
}

func main() {
	o := &options{}
	cli.Service{Name: "gpupool-secrets", Usage: usage, Options: o, Run: func(ctx context.Context, log *slog.Logger) error {
		cfg, err := kubeconfig.Load(o.kubeconfig)
		if err != nil {
			return &cli.UsageError{Err: fmt.Errorf("no cluster (--kubeconfig, or run in a pod): %w", err)}
		}
		cfg.UserAgent = "gpupool-secrets"
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		plain := *cfg
		plain.ContentType, plain.AcceptContentTypes = "", ""
		dyn, err := dynamic.NewForConfig(&plain)
		if err != nil {
			return err
		}
		return secrets.Ensure(ctx, secrets.Config{Client: client, Dynamic: dyn, Namespace: o.namespace,
			AdminToken: os.Getenv("GPUPOOL_ADMIN_TOKEN"), ServerToken: os.Getenv("GPUPOOL_SERVER_TOKEN"),
			Namespaces: json.RawMessage(o.namespaces), Certs: o.certs, Webhook: o.webhook, APIService: o.apiService, Log: log})
	}}.Main()
}
