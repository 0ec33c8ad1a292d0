package kube

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// KEDA's names, as its manifests set them.
const (
	// KEDANamespace holds KEDA's Services, and the Secrets its
	// ClusterTriggerAuthentications name.
	KEDANamespace = "keda"
	// kedaMetricsServer is the Service of KEDA's metrics server, which its
	// APIService names.
	kedaMetricsServer = "keda-metrics-apiserver"
)

// kedaCRDs are the CRDs build.sh copies from KEDA's module: all six, as the
// operator watches each kind and stops when one is missing.
var kedaCRDs = []string{"keda.sh_scaledobjects.yaml", "keda.sh_scaledjobs.yaml", "keda.sh_triggerauthentications.yaml",
	"keda.sh_clustertriggerauthentications.yaml", "eventing.keda.sh_cloudeventsources.yaml", "eventing.keda.sh_clustercloudeventsources.yaml"}

// ScaledObjects is the resource of KEDA's ScaledObjects, for the dynamic client.
var ScaledObjects = schema.GroupVersionResource{Group: "keda.sh", Version: "v1alpha1", Resource: "scaledobjects"}

// ClusterTriggerAuthentications is the resource of KEDA's cluster-wide
// TriggerAuthentications, for the dynamic client.
var ClusterTriggerAuthentications = schema.GroupVersionResource{Group: "keda.sh", Version: "v1alpha1", Resource: "clustertriggerauthentications"}

// StartKEDA starts KEDA (build.sh keda builds it) as its Helm chart
// installs it, and returns once its metrics server is the cluster's
// external metrics APIService, Available: the operator, which turns each
// ScaledObject into an HPA and scales between zero and one itself, and the
// metrics server, which serves that HPA's external metrics by asking the
// operator (gRPC, mutual TLS, as in the chart) which asks the scalers.
//
// Both act as the administrator: the test is of what KEDA does with
// gpupool's scaler, not of KEDA's RBAC. The certificates between them are
// the cluster CA's, as the chart's cert rotation would make its own.
func (c *ControlPlane) StartKEDA(ctx context.Context) error {
	for _, f := range append([]string{"keda-operator", "keda-adapter"}, kedaCRDs...) {
		if _, err := os.Stat(filepath.Join(c.binDir, f)); err != nil {
			return errors.New("KEDA is not built: run test/e2e/kube/build.sh keda (make e2e does, with KUBE_EXTRAS=keda)")
		}
	}
	for _, f := range kedaCRDs {
		if err := c.installCRD(ctx, f); err != nil {
			return err
		}
	}
	ports, err := freePorts(5)
	if err != nil {
		return err
	}
	metricsPort, probePort, grpcPort, servingPort, adapterMetricsPort := ports[0], ports[1], ports[2], ports[3], ports[4]
	// What KEDA's cert rotation keeps in its Secret, mounted in both: the
	// CA, and a certificate each side presents to the other.
	certDir := filepath.Join(c.dir, "keda-certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return err
	}
	certs := &files{dir: certDir}
	certs.write("ca.crt", c.CA)
	certs.issue(c.ca, "tls", leaf{
		dnsNames: []string{"keda-operator." + KEDANamespace + ".svc", kedaMetricsServer + "." + KEDANamespace + ".svc"},
		ips:      loopback,
		usages:   slices.Concat(serverAuth, clientAuth),
	})
	scalerCAs := filepath.Join(c.dir, "keda-scaler-cas")
	if err := os.MkdirAll(scalerCAs, 0o700); err != nil {
		return err
	}
	serving := &files{dir: c.dir}
	servingCert, servingKey := serving.issue(c.ca, "keda-metrics-apiserver", leaf{
		dnsNames: []string{kedaMetricsServer + "." + KEDANamespace + ".svc"}, ips: loopback, usages: serverAuth,
	})
	if err := errors.Join(certs.err, serving.err); err != nil {
		return err
	}
	env := []string{"KUBECONFIG=" + c.Kubeconfig, "POD_NAMESPACE=" + KEDANamespace, "KEDA_CLUSTER_OBJECT_NAMESPACE=" + KEDANamespace, "WATCH_NAMESPACE="}
	operator, err := c.start("keda-operator", filepath.Join(c.binDir, "keda-operator"), env,
		"--leader-elect=false",
		"--enable-cert-rotation=false",
		"--cert-dir="+certDir,
		// An empty CA directory: a scaler's CA comes from its
		// TriggerAuthentication (caCert), as gpupool's does, and the test
		// would not see a missing one if KEDA trusted the cluster CA.
		"--ca-dir="+scalerCAs,
		"--metrics-bind-address=127.0.0.1:"+strconv.Itoa(metricsPort),
		"--health-probe-bind-address=127.0.0.1:"+strconv.Itoa(probePort),
		"--metrics-service-bind-address=127.0.0.1:"+strconv.Itoa(grpcPort),
		"--zap-log-level=info",
	)
	if err != nil {
		return err
	}
	if err := operator.waitFor(ctx, "ready", getOK(http.DefaultClient, "http://127.0.0.1:"+strconv.Itoa(probePort)+"/readyz")); err != nil {
		return err
	}
	adapter, err := c.start("keda-adapter", filepath.Join(c.binDir, "keda-adapter"), env,
		"--secure-port="+strconv.Itoa(servingPort),
		"--bind-address=127.0.0.1",
		"--tls-cert-file="+servingCert,
		"--tls-private-key-file="+servingKey,
		// Where the gRPC client to the operator reads its certificates.
		"--cert-dir="+certDir,
		"--lister-kubeconfig="+c.Kubeconfig,
		"--authentication-kubeconfig="+c.Kubeconfig,
		"--authorization-kubeconfig="+c.Kubeconfig,
		"--metrics-service-address=127.0.0.1:"+strconv.Itoa(grpcPort),
		"--port="+strconv.Itoa(adapterMetricsPort),
		"--zap-log-level=info",
	)
	if err != nil {
		return err
	}
	if err := c.RegisterAPIService(ctx, "external.metrics.k8s.io", "v1beta1", KEDANamespace, kedaMetricsServer, int32(servingPort)); err != nil {
		return err
	}
	return adapter.waitFor(ctx, "its APIService Available", func(ctx context.Context) error {
		return c.WaitAPIServiceAvailable(ctx, "v1beta1.external.metrics.k8s.io")
	})
}
