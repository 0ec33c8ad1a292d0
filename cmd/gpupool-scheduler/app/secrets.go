package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/kubeconfig"
	"github.com/gpupool/gpupool/kube/secrets"
)

// SecretsUsage is what `gpupool-scheduler secrets --help` says above the
// flags: it names Secrets, and holds none.
//
//nolint:gosec // G101: the help names the Secrets' keys
const SecretsUsage = `Usage: gpupool-scheduler secrets [flags]

Makes the Secrets of gpupool's Helm chart in --namespace, keeping what it
finds: gpupool-tokens (admin-token, server-token, reader-token: random, or
GPUPOOL_ADMIN_TOKEN and GPUPOOL_SERVER_TOKEN when set), and
gpupool-allocator-config (config.yaml: those tokens and --allocator-namespaces).
With --certs, gpupool-ca (a CA of ten years) and gpupool-allocator-tls,
gpupool-adapter-tls, gpupool-webhook-tls and KEDA's client certificate
gpupool-keda-client (a year, made again a month before they end), and the
CA as the caBundle of --webhook and --apiservice where they exist. With
--keda-namespace, a copy of gpupool-keda-client there, where KEDA reads it
(without --certs, once cert-manager has issued it). Then it exits.
`

// secretsOptions are the flags of `gpupool-scheduler secrets`.
type secretsOptions struct {
	kubeconfig, namespace, namespaces, webhook, apiService, kedaNamespace string
	certs                                                                 bool
	kedaWait                                                              time.Duration
}

func (o *secretsOptions) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: the pod's ServiceAccount")
	fs.StringVar(&o.namespace, "namespace", "gpupool", "the namespace of the Secrets")
	fs.StringVar(&o.namespaces, "allocator-namespaces", "{}", "the allocator config's namespaces (quotas and tokens), a JSON object")
	fs.BoolVar(&o.certs, "certs", false, "make the CA and the serving certificates, and set the caBundles")
	fs.StringVar(&o.webhook, "webhook", "gpupool", "the MutatingWebhookConfiguration whose caBundle is the CA, with --certs")
	fs.StringVar(&o.apiService, "apiservice", "v1beta1.external.metrics.k8s.io", "the APIService whose caBundle is the CA, with --certs")
	fs.StringVar(&o.kedaNamespace, "keda-namespace", "", "KEDA's namespace, which gets a copy of gpupool-keda-client; empty: none")
	fs.DurationVar(&o.kedaWait, "keda-wait", 2*time.Minute, "without --certs, how long to wait for cert-manager to issue gpupool-keda-client once its Certificate exists")
}

func (o *secretsOptions) Validate() error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(o.namespaces), &m); err != nil {
		return fmt.Errorf("--allocator-namespaces %q: not a JSON object: %w", o.namespaces, err)
	}
	if o.namespace == "" {
		return errors.New("--namespace: empty")
	}
	if o.kedaNamespace == o.namespace {
		return fmt.Errorf("--keda-namespace=%s is --namespace: the copy would be the original", o.kedaNamespace)
	}
	if o.kedaWait <= 0 {
		return fmt.Errorf("--keda-wait=%s must be above 0", o.kedaWait)
	}
	return nil
}

// SecretsCommand is `gpupool-scheduler secrets`: it makes the Secrets of
// gpupool's Helm chart in the cluster (kube/secrets), then exits. The chart
// runs it as a hook Job; it lives in this binary, which links client-go
// already, rather than in one of its own (28 MB more in the image).
func SecretsCommand() cli.Service {
	o := &secretsOptions{}
	return cli.Service{Name: "gpupool-scheduler secrets", Usage: SecretsUsage, Options: o, Run: func(ctx context.Context, log *slog.Logger) error {
		cfg, err := kubeconfig.Load(o.kubeconfig)
		if err != nil {
			return &cli.UsageError{Err: fmt.Errorf("no cluster (--kubeconfig, or run in a pod): %w", err)}
		}
		cfg.UserAgent = "gpupool-scheduler-secrets"
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
			Namespaces: json.RawMessage(o.namespaces), Certs: o.certs, Webhook: o.webhook, APIService: o.apiService,
			KedaNamespace: o.kedaNamespace, KedaWait: o.kedaWait, Log: log})
	}}
}
