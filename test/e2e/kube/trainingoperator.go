package kube

import (
	"bytes"
	"context"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// The names the training operator v1.8.1 expects, as its manifests set them.
const (
	// trainingOperatorNamespace holds its webhook's Secret and Service.
	trainingOperatorNamespace = "kubeflow"
	trainingOperatorService   = "training-operator"
	// trainingOperatorSecret is where the operator keeps the CA and serving
	// certificate it makes for its webhook. A Deployment mounts it at
	// webhookCertDir.
	trainingOperatorSecret = "training-operator-webhook-cert"
	// trainingOperatorWebhooks is the ValidatingWebhookConfiguration whose
	// caBundle the operator fills.
	trainingOperatorWebhooks = "validator.training-operator.kubeflow.org"
	// webhookCertDir is where the operator's webhook server reads its
	// certificate: os.TempDir()/k8s-webhook-server/serving-certs.
	webhookCertDir = "k8s-webhook-server/serving-certs"
	// mountedCertFile is where the operator waits for its certificate to
	// appear before it starts its controllers; it names /tmp, not
	// os.TempDir().
	mountedCertFile = "/tmp/k8s-webhook-server/serving-certs/tls.crt"
)

// The files from the operator's module that build.sh copies into BinDir.
const (
	tfJobCRDFile             = "kubeflow.org_tfjobs.yaml"
	trainingOperatorRoleFile = "training-operator-role.yaml"
)

var customResourceDefinitions = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// TFJobs is the resource of the Kubeflow training operator's TFJobs, for
// the dynamic client.
var TFJobs = schema.GroupVersionResource{Group: "kubeflow.org", Version: "v1", Resource: "tfjobs"}

// StartTrainingOperator starts the Kubeflow training operator for TFJobs
// (kubeflow.org/v1) alone, and returns once it is ready: its CRD is
// Established, its controller runs, and the apiserver calls its validating
// webhook. TFJobs' pods are then created, and deleted with their TFJob, by
// the operator.
//
// It runs as the user "training-operator", bound to the ClusterRole that
// the operator's own manifests grant it, so that it runs with the
// permissions it has in a real cluster, no more (its role covers every job
// kind it knows, a little more than TFJobs need). Its webhook is
// registered through the Service kubeflow/training-operator, as in a real
// cluster; its failurePolicy is Fail, as the operator's manifests set it,
// so TFJobs cannot be created or changed while the operator is down.
func (c *ControlPlane) StartTrainingOperator(ctx context.Context) error {
	if err := c.installCRD(ctx, tfJobCRDFile); err != nil {
		return err
	}
	if err := c.bindTrainingOperatorRole(ctx); err != nil {
		return err
	}
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	metricsPort, probePort, webhookPort := ports[0], ports[1], ports[2]
	if err := c.registerTrainingOperatorWebhook(ctx, int32(webhookPort)); err != nil {
		return err
	}
	// The operator's own temporary directory, so that its webhook server
	// reads this operator's certificate, not another test's. The server
	// exits if it finds none there when it starts, which it may do before
	// the operator's certificate is mounted: it starts with one that the
	// apiserver does not trust for the webhook, and reads the directory
	// again when mountWebhookCert replaces it.
	tmp := filepath.Join(c.dir, "training-operator-tmp")
	certDir := filepath.Join(tmp, webhookCertDir)
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return err
	}
	placeholder := &files{dir: certDir}
	placeholder.issue(c.ca, "tls", leaf{
		dnsNames: []string{trainingOperatorService + "." + trainingOperatorNamespace + ".svc"},
		usages:   serverAuth,
	})
	f := &files{dir: c.dir}
	kubeconfig := f.kubeconfig("training-operator", c.URL, c.ca, leaf{
		subject: pkix.Name{CommonName: "training-operator"},
		usages:  clientAuth,
	})
	if err := errors.Join(placeholder.err, f.err); err != nil {
		return err
	}
	operator, err := c.start("training-operator", filepath.Join(c.binDir, "training-operator.v1"),
		[]string{"TMPDIR=" + tmp, "MY_POD_NAMESPACE=" + trainingOperatorNamespace},
		"--kubeconfig="+kubeconfig,
		"--enable-scheme=tfjob",
		"--leader-elect=false",
		// On loopback ports of their own, not the defaults, which another
		// test's operator may hold.
		"--metrics-bind-address=127.0.0.1:"+strconv.Itoa(metricsPort),
		"--health-probe-bind-address=127.0.0.1:"+strconv.Itoa(probePort),
		"--webhook-server-port="+strconv.Itoa(webhookPort),
	)
	if err != nil {
		return err
	}
	// A dry run of a TFJob's creation passes once the operator has made
	// its certificate and registered its webhook, which it does after its
	// controller, and the apiserver trusts the certificate.
	return operator.waitFor(ctx, "the apiserver to call its webhook", func(ctx context.Context) error {
		if err := c.mountWebhookCert(ctx, certDir); err != nil {
			return err
		}
		_, err := c.dynamic.Resource(TFJobs).Namespace(trainingOperatorNamespace).Create(ctx,
			tfJob("webhook-probe", "tensorflow"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})
}

// tfJob is a TFJob of two workers whose container is named container,
// for kwok's nodes.
func tfJob(name, container string) *unstructured.Unstructured {
	toleration := map[string]any{
		"key":      KwokToleration.Key,
		"operator": string(KwokToleration.Operator),
		"effect":   string(KwokToleration.Effect),
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": TFJobs.GroupVersion().String(),
		"kind":       "TFJob",
		"metadata":   map[string]any{"name": name},
		"spec": map[string]any{
			"tfReplicaSpecs": map[string]any{
				"Worker": map[string]any{
					"replicas":      int64(2),
					"restartPolicy": "Never",
					"template": map[string]any{
						"spec": map[string]any{
							"tolerations": []any{toleration},
							"containers": []any{map[string]any{
								"name":  container,
								"image": "registry.k8s.io/pause:3.10",
							}},
						},
					},
				},
			},
		},
	}}
}

// installCRD creates the CRD in BinDir's file, which build.sh copied from
// its project's module, and waits until the apiserver serves it.
func (c *ControlPlane) installCRD(ctx context.Context, file string) error {
	var crd map[string]any
	if err := readYAML(filepath.Join(c.binDir, file), &crd); err != nil {
		return err
	}
	obj := &unstructured.Unstructured{Object: crd}
	if _, err := c.dynamic.Resource(customResourceDefinitions).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the CRD %s: %w", obj.GetName(), err)
	}
	if err := c.waitCondition(ctx, customResourceDefinitions, obj.GetName(), "Established"); err != nil {
		return fmt.Errorf("CRD %s: %w", obj.GetName(), err)
	}
	return nil
}

// bindTrainingOperatorRole creates the operator's ClusterRole and binds
// the user "training-operator" to it.
func (c *ControlPlane) bindTrainingOperatorRole(ctx context.Context) error {
	var role rbacv1.ClusterRole
	if err := readYAML(filepath.Join(c.binDir, trainingOperatorRoleFile), &role); err != nil {
		return err
	}
	if _, err := c.Client.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "training-operator"}},
	}
	_, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
	return err
}

// registerTrainingOperatorWebhook creates what the operator's manifests
// install for its webhook: the Service that reaches it, the empty Secret
// that it fills with its certificates, and the ValidatingWebhookConfiguration
// for TFJobs, whose caBundle it fills.
func (c *ControlPlane) registerTrainingOperatorWebhook(ctx context.Context, port int32) error {
	if err := c.LocalService(ctx, trainingOperatorNamespace, trainingOperatorService, port); err != nil {
		return err
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: trainingOperatorSecret, Namespace: trainingOperatorNamespace}}
	if _, err := c.Client.CoreV1().Secrets(trainingOperatorNamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		return err
	}
	webhooks := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: trainingOperatorWebhooks},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "validator.tfjob.training-operator.kubeflow.org",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{
					Namespace: trainingOperatorNamespace,
					Name:      trainingOperatorService,
					Path:      ptr.To("/validate-kubeflow-org-v1-tfjob"),
					Port:      ptr.To(port),
				},
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{
					APIGroups:   []string{TFJobs.Group},
					APIVersions: []string{TFJobs.Version},
					Resources:   []string{TFJobs.Resource},
				},
			}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	_, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, webhooks, metav1.CreateOptions{})
	return err
}

// mountWebhookCert does what the kubelet does for the operator's
// Deployment, which mounts its Secret: once the operator has filled the
// Secret, it writes the certificate and key into dir, where the webhook
// server reads them, again whenever they change. The operator also waits
// for mountedCertFile to exist before it starts its controller and
// webhook; it makes it if no other test's operator has.
func (c *ControlPlane) mountWebhookCert(ctx context.Context, dir string) error {
	secret, err := c.Client.CoreV1().Secrets(trainingOperatorNamespace).Get(ctx, trainingOperatorSecret, metav1.GetOptions{})
	if err != nil {
		return err
	}
	cert, key := secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey]
	if len(cert) == 0 || len(key) == 0 {
		return errors.New("the Secret " + trainingOperatorNamespace + "/" + trainingOperatorSecret + " has no certificate yet")
	}
	certFile, keyFile := filepath.Join(dir, corev1.TLSCertKey), filepath.Join(dir, corev1.TLSPrivateKeyKey)
	if mounted, err := os.ReadFile(certFile); err != nil || !bytes.Equal(mounted, cert) {
		// The key first: the server reads both when either changes, and
		// keeps what it has while they do not match.
		if err := os.WriteFile(keyFile, key, 0o600); err != nil {
			return err
		}
		if err := os.WriteFile(certFile, cert, 0o600); err != nil {
			return err
		}
	}
	return createIfMissing(mountedCertFile, cert)
}

// createIfMissing writes data to path unless the file exists, making its
// directory if need be.
func createIfMissing(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, os.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// readYAML decodes the YAML file path into v.
func readYAML(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
