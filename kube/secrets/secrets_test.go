package secrets

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpupool/gpupool/allocator/service"
)

func secretData(t *testing.T, c *fake.Clientset, name string) map[string][]byte {
	t.Helper()
	s, err := c.CoreV1().Secrets("gpupool").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s.Data
}

func allSecrets(t *testing.T, c *fake.Clientset) map[string]map[string][]byte {
	t.Helper()
	list, err := c.CoreV1().Secrets("gpupool").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string][]byte{}
	for _, s := range list.Items {
		out[s.Name] = s.Data
	}
	return out
}

// TestEnsureMakesThenKeeps: a first run makes every Secret, with tokens
// the allocator loads and certificates that verify for their names against
// the CA that becomes the caBundles; a second run changes nothing.
func TestEnsureMakesThenKeeps(t *testing.T) {
	ctx := context.Background()
	webhook := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "gpupool"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "a.gpupool.io"}, {Name: "b.gpupool.io"}}}
	c := fake.NewClientset(webhook)
	api := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": "v1beta1.external.metrics.k8s.io"}, "spec": map[string]any{"group": "external.metrics.k8s.io"}}}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{apiServices: "APIServiceList"}, api)
	cfg := Config{Client: c, Dynamic: dyn, Namespace: "gpupool", Certs: true, Webhook: "gpupool", APIService: "v1beta1.external.metrics.k8s.io",
		KedaNamespace: "keda", Namespaces: []byte(`{"ml":{"hard":{"requests.bitfusion.io/gpu":400},"tokens":["ml-0123456789abcdef"]}}`)}
	if err := Ensure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	first := allSecrets(t, c)

	tokens := first[TokensSecret]
	for _, k := range []string{AdminKey, ServerKey, ReaderKey} {
		if len(tokens[k]) < 16 {
			t.Errorf("%s: %q, want a random token of 16 characters or more", k, tokens[k])
		}
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, first[ConfigSecret]["config.yaml"], 0o600); err != nil {
		t.Fatal(err)
	}
	config, err := service.LoadConfig(path)
	if err != nil {
		t.Fatalf("the allocator refuses the config: %v\n%s", err, first[ConfigSecret]["config.yaml"])
	}
	auth := service.NewAuthenticator(config)
	for key, want := range map[string]service.Principal{AdminKey: {Admin: true}, ReaderKey: {Reader: true}, ServerKey: {Server: true}} {
		if p, ok := auth.Lookup(string(tokens[key])); !ok || p != want {
			t.Errorf("%s is %+v (%v) to the allocator, want %+v", key, p, ok, want)
		}
	}
	if p, ok := auth.Lookup("ml-0123456789abcdef"); !ok || p.Namespace != "ml" || config.Quotas()["ml"].Percent() != 400 {
		t.Errorf("namespace ml: %+v %v, quotas %v", p, ok, config.Quotas())
	}

	ca := first[CASecret]["ca.crt"]
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		t.Fatal("no CA certificate")
	}
	for _, l := range Leaves("gpupool") {
		s := first[l.Secret]
		if !bytes.Equal(s["ca.crt"], ca) {
			t.Errorf("%s: ca.crt is not the CA", l.Secret)
		}
		b, _ := pem.Decode(s["tls.crt"])
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range l.DNS {
			if name[0] == '*' {
				name = "gpupool-allocator-2" + name[1:]
			}
			if _, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: roots}); err != nil {
				t.Errorf("%s for %s: %v", l.Secret, name, err)
			}
		}
		// KEDA's, as the scaler checks it (kedascaler.ServerTLS): a client
		// certificate of the CA the adapter's --keda-client-ca mounts.
		_, err = cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		if (err == nil) != (l.Secret == KedaClientSecret) {
			t.Errorf("%s as a client certificate: %v, want it accepted for %s alone", l.Secret, err, KedaClientSecret)
		}
		if !bytes.Contains(s["tls.key"], []byte("PRIVATE KEY")) {
			t.Errorf("%s: no key", l.Secret)
		}
	}
	keda, err := c.CoreV1().Secrets("keda").Get(ctx, KedaClientSecret, metav1.GetOptions{})
	if err != nil || !maps.EqualFunc(keda.Data, first[KedaClientSecret], bytes.Equal) {
		t.Errorf("KEDA's namespace holds %v (%v), want a copy of gpupool's %s", keda, err, KedaClientSecret)
	}
	w, _ := c.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "gpupool", metav1.GetOptions{})
	for _, h := range w.Webhooks {
		if !bytes.Equal(h.ClientConfig.CABundle, ca) {
			t.Errorf("webhook %s trusts %q, want the CA", h.Name, h.ClientConfig.CABundle)
		}
	}
	a, _ := dyn.Resource(apiServices).Get(ctx, "v1beta1.external.metrics.k8s.io", metav1.GetOptions{})
	if bundle, _, _ := unstructured.NestedString(a.Object, "spec", "caBundle"); bundle != base64.StdEncoding.EncodeToString(ca) {
		t.Errorf("the APIService trusts %q, want the CA", bundle)
	}

	// Again, a day later: nothing changes.
	cfg.Now = func() time.Time { return time.Now().Add(24 * time.Hour) }
	if err := Ensure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if again := allSecrets(t, c); !maps.EqualFunc(again, first, func(a, b map[string][]byte) bool { return maps.EqualFunc(a, b, bytes.Equal) }) {
		t.Error("a second run changed the Secrets: clients of the first ones are cut off")
	}

	// Eleven months later, the certificates are made again by the same
	// CA; the tokens stay.
	cfg.Now = func() time.Time { return time.Now().AddDate(0, 11, 10) }
	if err := Ensure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	renewed := allSecrets(t, c)
	if !bytes.Equal(renewed[CASecret]["ca.crt"], ca) || !maps.EqualFunc(renewed[TokensSecret], tokens, bytes.Equal) {
		t.Error("renewing the certificates changed the CA or the tokens")
	}
	if bytes.Equal(renewed["gpupool-webhook-tls"]["tls.crt"], first["gpupool-webhook-tls"]["tls.crt"]) {
		t.Error("a certificate with less than a month to run was kept")
	}
}

// TestEnsureTakesTheValuesTokens: tokens the chart's values set replace the
// stored ones; a key an older chart did not make (reader-token) is added,
// and the others kept; the Secret, which that chart rendered, is marked
// for Helm to keep when the upgrade no longer renders it.
func TestEnsureTakesTheValuesTokens(t *testing.T) {
	ctx := context.Background()
	old := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: TokensSecret, Namespace: "gpupool"},
		Data: map[string][]byte{AdminKey: []byte("stored-admin-0123456789"), ServerKey: []byte("stored-server-0123456789")}}
	c := fake.NewClientset(old)
	if err := Ensure(ctx, Config{Client: c, Namespace: "gpupool", ServerToken: "values-server-0123456789"}); err != nil {
		t.Fatal(err)
	}
	s, _ := c.CoreV1().Secrets("gpupool").Get(ctx, TokensSecret, metav1.GetOptions{})
	if s.Annotations["helm.sh/resource-policy"] != "keep" {
		t.Errorf("an older chart's Secret is not marked for Helm to keep: %v (an upgrade would delete it)", s.Annotations)
	}
	got := secretData(t, c, TokensSecret)
	if string(got[AdminKey]) != "stored-admin-0123456789" || string(got[ServerKey]) != "values-server-0123456789" || len(got[ReaderKey]) < 16 {
		t.Errorf("tokens %q: want the stored admin, the values' server, a new reader", got)
	}
	if _, err := c.CoreV1().Secrets("gpupool").Get(ctx, CASecret, metav1.GetOptions{}); err == nil {
		t.Error("without --certs, a CA was made")
	}
	if err := Ensure(ctx, Config{Client: c, Namespace: "gpupool", Namespaces: []byte(`[1]`)}); err == nil {
		t.Error("namespaces that are no object were taken")
	}
}

// TestEnsureCopiesCertManagersKedaClient: with cert-manager, the Job copies
// the Secret cert-manager issues into KEDA's namespace: before the install
// creates the Certificate there is nothing to wait for; after, it waits for
// the Secret, and fails, naming the Certificate, when none comes.
func TestEnsureCopiesCertManagersKedaClient(t *testing.T) {
	ctx := context.Background()
	cert := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
		"metadata": map[string]any{"name": KedaClientSecret, "namespace": "gpupool"}}}
	lists := map[schema.GroupVersionResource]string{certificates: "CertificateList"}

	c := fake.NewClientset()
	cfg := Config{Client: c, Dynamic: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), lists),
		Namespace: "gpupool", KedaNamespace: "keda", KedaWait: time.Second}
	if err := Ensure(ctx, cfg); err != nil {
		t.Fatalf("before the install, no Certificate: %v, want nothing copied and no error", err)
	}

	cfg.Dynamic = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), lists, cert)
	if err := Ensure(ctx, cfg); err == nil || !strings.Contains(err.Error(), "describe certificate "+KedaClientSecret) {
		t.Errorf("a Certificate that issues nothing: %v, want an error naming it", err)
	}

	issued := map[string][]byte{"ca.crt": []byte("CA"), "tls.crt": []byte("CERT"), "tls.key": []byte("KEY")}
	go func() {
		time.Sleep(200 * time.Millisecond)
		_, _ = c.CoreV1().Secrets("gpupool").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: KedaClientSecret, Namespace: "gpupool"},
			Data: issued}, metav1.CreateOptions{})
	}()
	cfg.KedaWait = 10 * time.Second
	if err := Ensure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	keda, err := c.CoreV1().Secrets("keda").Get(ctx, KedaClientSecret, metav1.GetOptions{})
	if err != nil || !maps.EqualFunc(keda.Data, issued, bytes.Equal) {
		t.Errorf("KEDA's namespace holds %v (%v), want cert-manager's keys", keda, err)
	}
}
