package adapter

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"

	"sigs.k8s.io/custom-metrics-apiserver/pkg/cmd/options"
)

// TestSelfSignedCert: the certificate is for localhost and 127.0.0.1 and
// verifies against the file it is written to (its CA within), which a
// loopback client trusts; options that name one keep it.
func TestSelfSignedCert(t *testing.T) {
	o := options.NewCustomMetricsAdapterServerOptions()
	o.SecureServing.BindPort = 6443 // without a port to serve on there is nothing to certify
	o.SecureServing.ServerCert.CertDirectory = t.TempDir()
	if err := SelfSignedCert(o); err != nil {
		t.Fatal(err)
	}
	key := o.SecureServing.ServerCert.CertKey
	pem, err := os.ReadFile(key.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("%s holds no certificate", key.CertFile)
	}
	pair, err := tls.LoadX509KeyPair(key.CertFile, key.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"localhost", "127.0.0.1"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots}); err != nil {
			t.Errorf("the certificate for %s: %v", host, err)
		}
	}
	if err := SelfSignedCert(o); err != nil || o.SecureServing.ServerCert.CertKey != key {
		t.Errorf("again: %v, %+v; want %+v kept", err, o.SecureServing.ServerCert.CertKey, key)
	}
}
