// Package secrets makes, in the cluster, the Secrets the Helm chart's
// components read: the allocator's tokens and config, and, without
// cert-manager, a CA of the pool's own and the certificates it signs; and
// a copy of KEDA's client certificate in KEDA's namespace. The chart runs
// it as a hook Job (`gpupool-scheduler secrets`) before each install,
// upgrade and rollback, so that no token and no private key is
// ever in the chart's templates, and so in Helm's release Secret
// (docs/design.md, "The chart's secrets"). What it finds it keeps: a
// token, the CA, a certificate signed by that CA for the same names that
// has more than a month to run; it makes what is missing and writes what
// differs.
package secrets

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/big"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// The Secrets' names, as the manifests (deploy/base) name them: names,
// not credentials.
const (
	TokensSecret = "gpupool-tokens"           //nolint:gosec // G101: a Secret's name
	ConfigSecret = "gpupool-allocator-config" //nolint:gosec // G101: a Secret's name
	CASecret     = "gpupool-ca"               //nolint:gosec // G101: a Secret's name
	// KedaClientSecret holds the client certificate KEDA presents to the
	// adapter's external scaler, and the CA KEDA checks the adapter with:
	// the keys of deploy/examples/tf-training-keda's ClusterTriggerAuthentication.
	KedaClientSecret = "gpupool-keda-client" //nolint:gosec // G101: a Secret's name
)

// Token keys of TokensSecret.
const (
	AdminKey  = "admin-token"
	ServerKey = "server-token"
	ReaderKey = "reader-token"
)

// Leaf is a certificate the CA signs: its Secret and its names, or, for a
// client certificate, the name it presents.
type Leaf struct {
	Secret string
	DNS    []string
	Client string
}

// Leaves are the chart's certificates in namespace ns: the serving ones,
// for the names their callers check, and KEDA's client certificate
// (deploy/README.md, "Certificates").
func Leaves(ns string) []Leaf {
	names := func(svc string, more ...string) []string {
		out := []string{svc + "." + ns + ".svc", svc + "." + ns + ".svc.cluster.local"}
		for _, m := range more {
			out = append(out, m+"."+ns+".svc", m+"."+ns+".svc.cluster.local")
		}
		return out
	}
	return []Leaf{
		{"gpupool-allocator-tls", names("gpupool-allocator", "*.gpupool-allocator-peers"), ""},
		{"gpupool-adapter-tls", names("gpupool-adapter"), ""},
		{"gpupool-webhook-tls", names("gpupool-webhook"), ""},
		{KedaClientSecret, nil, "keda"},
	}
}

// Config is what Ensure makes.
type Config struct {
	Client kubernetes.Interface
	// Dynamic patches the APIService's caBundle; nil: not patched.
	Dynamic   dynamic.Interface
	Namespace string
	// AdminToken and ServerToken, when set, are the tokens (the chart's
	// tokens.admin and tokens.server); empty: kept as stored, or made.
	AdminToken, ServerToken string
	// Namespaces is the allocator config's namespaces, a JSON object.
	Namespaces json.RawMessage
	// Certs makes the CA and the certificates, and sets the CA as the
	// caBundle of Webhook and APIService where they exist.
	Certs               bool
	Webhook, APIService string
	// KedaNamespace, when set, gets a copy of KedaClientSecret: KEDA reads
	// a ClusterTriggerAuthentication's Secrets in its own namespace only.
	// Without Certs, cert-manager issues the original, after the install
	// creates its Certificate: the copy waits for it up to KedaWait.
	KedaNamespace string
	KedaWait      time.Duration
	Now           func() time.Time
	Log           *slog.Logger
}

// renewBefore is how long before its end a certificate is made again.
const renewBefore = 30 * 24 * time.Hour

// Ensure makes or keeps each Secret, and sets the caBundles.
func Ensure(ctx context.Context, c Config) error {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	tokens, err := c.tokens(ctx)
	if err != nil {
		return err
	}
	if err := c.config(ctx, tokens); err != nil {
		return err
	}
	if !c.Certs {
		return c.kedaCopy(ctx)
	}
	ca, err := c.ca(ctx)
	if err != nil {
		return err
	}
	for _, l := range Leaves(c.Namespace) {
		if err := c.leaf(ctx, ca, l); err != nil {
			return err
		}
	}
	if err := c.kedaCopy(ctx); err != nil {
		return err
	}
	return c.caBundles(ctx, ca.certPEM)
}

// tokens keeps TokensSecret's tokens, makes the missing ones, and sets
// those the chart's values name.
func (c Config) tokens(ctx context.Context) (map[string][]byte, error) {
	want := map[string]string{AdminKey: c.AdminToken, ServerKey: c.ServerToken, ReaderKey: ""}
	return c.write(ctx, TokensSecret, corev1.SecretTypeOpaque, func(old map[string][]byte) map[string][]byte {
		out := maps.Clone(old)
		if out == nil {
			out = map[string][]byte{}
		}
		for key, set := range want {
			switch {
			case set != "":
				out[key] = []byte(set)
			case len(out[key]) < 16:
				out[key] = []byte(rand.Text() + rand.Text())
			}
		}
		return out
	})
}

// config writes the allocator's --config: its tokens, and the namespaces
// of the chart's values.
func (c Config) config(ctx context.Context, tokens map[string][]byte) error {
	ns := c.Namespaces
	if len(bytes.TrimSpace(ns)) == 0 || bytes.Equal(bytes.TrimSpace(ns), []byte("null")) {
		ns = json.RawMessage("{}")
	}
	var check map[string]json.RawMessage
	if err := json.Unmarshal(ns, &check); err != nil {
		return fmt.Errorf("namespaces: not a JSON object: %w", err)
	}
	set := func(key string) map[string][]string { return map[string][]string{"tokens": {string(tokens[key])}} }
	// JSON is YAML: the allocator reads it as it reads its YAML.
	b, err := json.MarshalIndent(map[string]any{"admin": set(AdminKey), "readers": set(ReaderKey), "servers": set(ServerKey), "namespaces": ns}, "", "  ")
	if err != nil {
		return err
	}
	_, err = c.write(ctx, ConfigSecret, corev1.SecretTypeOpaque, func(map[string][]byte) map[string][]byte {
		return map[string][]byte{"config.yaml": append(b, '\n')}
	})
	return err
}

// keep is the annotation by which Helm deletes no object, read on the
// live object: a release of an older chart rendered these Secrets, and an
// upgrade to this one, which does not, would delete them.
const keepKey, keepValue = "helm.sh/resource-policy", "keep"

// write creates or updates Secret name with what data makes of its data
// (nil when there is none), and returns what it holds.
func (c Config) write(ctx context.Context, name string, typ corev1.SecretType, data func(old map[string][]byte) map[string][]byte) (map[string][]byte, error) {
	return c.writeIn(ctx, c.Namespace, name, typ, data)
}

// writeIn is write in namespace ns.
func (c Config) writeIn(ctx context.Context, ns, name string, typ corev1.SecretType, data func(old map[string][]byte) map[string][]byte) (map[string][]byte, error) {
	secrets := c.Client.CoreV1().Secrets(ns)
	old, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/part-of": "gpupool"}, Annotations: map[string]string{keepKey: keepValue}}, Type: typ, Data: data(nil)}
		if _, err := secrets.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("creating Secret %s/%s: %w", ns, name, err)
		}
		c.Log.Info("created", "secret", name, "namespace", ns, "keys", slices.Sorted(maps.Keys(s.Data)))
		return s.Data, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading Secret %s/%s: %w", ns, name, err)
	}
	now := data(old.Data)
	if maps.EqualFunc(now, old.Data, bytes.Equal) && old.Annotations[keepKey] == keepValue {
		c.Log.Info("kept", "secret", name, "namespace", ns)
		return now, nil
	}
	var changed []string
	for k, v := range now {
		if !bytes.Equal(old.Data[k], v) {
			changed = append(changed, k)
		}
	}
	old.Data = now
	if old.Annotations == nil {
		old.Annotations = map[string]string{}
	}
	old.Annotations[keepKey] = keepValue
	if _, err := secrets.Update(ctx, old, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("updating Secret %s/%s: %w", ns, name, err)
	}
	c.Log.Info("updated", "secret", name, "namespace", ns, "keys", slices.Sorted(slices.Values(changed)))
	return now, nil
}

// authority is the pool's CA.
type authority struct {
	cert            *x509.Certificate
	key             *ecdsa.PrivateKey
	certPEM, keyPEM []byte
}

// ca keeps CASecret's CA when it parses, else makes one.
func (c Config) ca(ctx context.Context) (*authority, error) {
	var ca *authority
	_, err := c.write(ctx, CASecret, corev1.SecretTypeOpaque, func(old map[string][]byte) map[string][]byte {
		if a, err := parseAuthority(old["ca.crt"], old["ca.key"]); err == nil {
			ca = a
			return old
		}
		ca = c.newAuthority()
		return map[string][]byte{"ca.crt": ca.certPEM, "ca.key": ca.keyPEM}
	})
	if err == nil && ca == nil {
		err = errors.New("no CA")
	}
	return ca, err
}

func parseAuthority(certPEM, keyPEM []byte) (*authority, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("no PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, err
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !cert.IsCA || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("not this CA's key")
	}
	return &authority{cert: cert, key: key, certPEM: certPEM, keyPEM: keyPEM}, nil
}

func (c Config) newAuthority() *authority {
	key := newKey()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "gpupool-ca"},
		NotBefore: c.Now().Add(-time.Hour), NotAfter: c.Now().AddDate(10, 0, 0),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err) // only for a template this code got wrong
	}
	cert, _ := x509.ParseCertificate(der)
	return &authority{cert: cert, key: key, certPEM: pemOf("CERTIFICATE", der), keyPEM: keyPEM(key)}
}

// leaf keeps l's certificate while ca signed it for l's names and use and
// it has more than renewBefore to run, else makes one.
func (c Config) leaf(ctx context.Context, ca *authority, l Leaf) error {
	_, err := c.write(ctx, l.Secret, corev1.SecretTypeTLS, func(old map[string][]byte) map[string][]byte {
		if c.keeps(ca, l, old) {
			return old
		}
		key := newKey()
		tmpl := &x509.Certificate{
			SerialNumber: serial(), Subject: pkix.Name{CommonName: l.Client}, DNSNames: l.DNS,
			NotBefore: c.Now().Add(-time.Hour), NotAfter: c.Now().AddDate(1, 0, 0),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{l.usage()},
		}
		if l.Client == "" {
			tmpl.Subject.CommonName = l.DNS[0]
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
		if err != nil {
			panic(err)
		}
		return map[string][]byte{"ca.crt": ca.certPEM, "tls.crt": pemOf("CERTIFICATE", der), "tls.key": keyPEM(key)}
	})
	return err
}

func (c Config) keeps(ca *authority, l Leaf, old map[string][]byte) bool {
	if !bytes.Equal(old["ca.crt"], ca.certPEM) || len(old["tls.key"]) == 0 {
		return false
	}
	b, _ := pem.Decode(old["tls.crt"])
	if b == nil {
		return false
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil || cert.CheckSignatureFrom(ca.cert) != nil || !slices.Equal(cert.DNSNames, l.DNS) || !slices.Equal(cert.ExtKeyUsage, []x509.ExtKeyUsage{l.usage()}) {
		return false
	}
	return cert.NotAfter.Sub(c.Now()) > renewBefore
}

func (l Leaf) usage() x509.ExtKeyUsage {
	if l.Client != "" {
		return x509.ExtKeyUsageClientAuth
	}
	return x509.ExtKeyUsageServerAuth
}

// certificates is cert-manager's Certificate resource.
var certificates = schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "certificates"}

// kedaCopy writes KedaClientSecret's keys into c.KedaNamespace. Without
// Certs, the original is cert-manager's: before the install that creates
// its Certificate there is none to copy, after it the copy waits up to
// KedaWait for cert-manager to issue it.
func (c Config) kedaCopy(ctx context.Context) error {
	if c.KedaNamespace == "" {
		return nil
	}
	secrets := c.Client.CoreV1().Secrets(c.Namespace)
	src, err := secrets.Get(ctx, KedaClientSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && !c.Certs && c.Dynamic != nil {
		_, cerr := c.Dynamic.Resource(certificates).Namespace(c.Namespace).Get(ctx, KedaClientSecret, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(cerr):
			c.Log.Info("no Certificate yet: KEDA's client certificate is copied once cert-manager issues it", "certificate", KedaClientSecret)
			return nil
		case cerr != nil:
			return fmt.Errorf("reading Certificate %s/%s: %w", c.Namespace, KedaClientSecret, cerr)
		}
		wait, cancel := context.WithTimeout(ctx, c.KedaWait)
		defer cancel()
		for apierrors.IsNotFound(err) {
			select {
			case <-wait.Done():
				return fmt.Errorf("cert-manager issued no Secret %s/%s within %s: is it running? (kubectl -n %s describe certificate %s)",
					c.Namespace, KedaClientSecret, c.KedaWait, c.Namespace, KedaClientSecret)
			case <-time.After(time.Second):
			}
			src, err = secrets.Get(ctx, KedaClientSecret, metav1.GetOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("reading Secret %s/%s: %w", c.Namespace, KedaClientSecret, err)
	}
	keys := []string{"ca.crt", corev1.TLSCertKey, corev1.TLSPrivateKeyKey}
	_, err = c.writeIn(ctx, c.KedaNamespace, KedaClientSecret, corev1.SecretTypeTLS, func(map[string][]byte) map[string][]byte {
		out := map[string][]byte{}
		for _, k := range keys {
			out[k] = src.Data[k]
		}
		return out
	})
	return err
}

// apiServices is the APIService resource.
var apiServices = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}

// caBundles sets ca as the caBundle of every webhook of c.Webhook and of
// c.APIService, where they exist (before an install, or without
// the components, they do not).
func (c Config) caBundles(ctx context.Context, ca []byte) error {
	if c.Webhook != "" {
		hooks := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
		w, err := hooks.Get(ctx, c.Webhook, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return fmt.Errorf("reading MutatingWebhookConfiguration %s: %w", c.Webhook, err)
		default:
			var patch []map[string]any
			for _, h := range w.Webhooks {
				if !bytes.Equal(h.ClientConfig.CABundle, ca) {
					patch = append(patch, map[string]any{"name": h.Name, "clientConfig": map[string]any{"caBundle": ca}})
				}
			}
			if len(patch) > 0 {
				b, _ := json.Marshal(map[string]any{"webhooks": patch})
				if _, err := hooks.Patch(ctx, c.Webhook, types.StrategicMergePatchType, b, metav1.PatchOptions{}); err != nil {
					return fmt.Errorf("setting the caBundle of MutatingWebhookConfiguration %s: %w", c.Webhook, err)
				}
				c.Log.Info("set the caBundle", "mutatingwebhookconfiguration", c.Webhook)
			}
		}
	}
	if c.APIService != "" && c.Dynamic != nil {
		api := c.Dynamic.Resource(apiServices)
		a, err := api.Get(ctx, c.APIService, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return fmt.Errorf("reading APIService %s: %w", c.APIService, err)
		default:
			want := base64.StdEncoding.EncodeToString(ca)
			if have, _, _ := unstructured.NestedString(a.Object, "spec", "caBundle"); have != want {
				b, _ := json.Marshal(map[string]any{"spec": map[string]any{"caBundle": want}})
				if _, err := api.Patch(ctx, c.APIService, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
					return fmt.Errorf("setting the caBundle of APIService %s: %w", c.APIService, err)
				}
				c.Log.Info("set the caBundle", "apiservice", c.APIService)
			}
		}
	}
	return nil
}

func newKey() *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return key
}

func keyPEM(key *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		panic(err)
	}
	return pemOf("PRIVATE KEY", der)
}

func pemOf(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err)
	}
	return n
}
