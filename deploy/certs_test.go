package deploy_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestCertsScript runs certs.sh, the way without cert-manager, and checks
// what each component does with its files: the servers' certificates are
// valid for their Service's name and for serving only, KEDA's for the
// adapter's external scaler as a client only, all signed by ca.crt; a
// second run renews the
// leaves and keeps the CA, so that the caBundles stay valid.
func TestCertsScript(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("no openssl on PATH")
	}
	dir := t.TempDir()
	run := func() {
		t.Helper()
		if out, err := exec.Command("bash", "certs.sh", dir).CombinedOutput(); err != nil {
			t.Fatalf("certs.sh: %v\n%s", err, out)
		}
	}
	run()
	caPEM := read(t, dir, "ca.crt")
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.crt holds no certificate")
	}
	verify := func(name, dnsName string, usage x509.ExtKeyUsage) error {
		t.Helper()
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = pair.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: dnsName, KeyUsages: []x509.ExtKeyUsage{usage}})
		return err
	}
	for _, service := range []string{"gpupool-adapter", "gpupool-webhook"} {
		for _, name := range []string{service + ".gpupool.svc", service + ".gpupool.svc.cluster.local"} {
			if err := verify(service, name, x509.ExtKeyUsageServerAuth); err != nil {
				t.Errorf("%s serving %s: %v", service, name, err)
			}
		}
		if verify(service, "", x509.ExtKeyUsageClientAuth) == nil {
			t.Errorf("%s's certificate is a client certificate too: it serves only", service)
		}
	}
	// The scaler checks KEDA's as kedascaler.ServerTLS does: a client
	// certificate of the CA --keda-client-ca names (ca.crt).
	if err := verify("gpupool-keda-client", "", x509.ExtKeyUsageClientAuth); err != nil {
		t.Errorf("KEDA's client certificate: %v", err)
	}
	if verify("gpupool-keda-client", "gpupool-adapter.gpupool.svc", x509.ExtKeyUsageServerAuth) == nil {
		t.Error("KEDA's client certificate serves too")
	}
	if names, _ := filepath.Glob(filepath.Join(dir, "*.crt")); len(names) != 5 {
		t.Errorf("certs.sh wrote %q: want ca.crt, the allocator's, the adapter's and the webhook's, and KEDA's", names)
	}

	leaf := read(t, dir, "gpupool-webhook.crt")
	run()
	if !bytes.Equal(read(t, dir, "ca.crt"), caPEM) {
		t.Error("a second run made a new CA: every caBundle would need replacing")
	}
	if bytes.Equal(read(t, dir, "gpupool-webhook.crt"), leaf) {
		t.Error("a second run kept the webhook's certificate: it renews nothing")
	}
}

func read(t *testing.T, dir, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
