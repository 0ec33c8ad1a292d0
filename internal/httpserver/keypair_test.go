package httpserver

import (
	"crypto/x509"
	"log/slog"
	"os"
	"testing"

	"github.com/gpupool/gpupool/internal/testcert"
)

// TestKeyPairReloads: a renewed certificate is served from the next
// handshake; a pair that does not load leaves the previous one served.
func TestKeyPairReloads(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, "test CA")
	renew := func(commonName string) (certFile, keyFile string) {
		return testcert.WritePair(t, dir, ca.Issue(t, commonName, x509.ExtKeyUsageServerAuth))
	}
	certFile, keyFile := renew("first")
	k, err := LoadKeyPair(certFile, keyFile, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	served := func() string {
		t.Helper()
		c, err := k.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.Subject.CommonName
	}
	if got := served(); got != "first" {
		t.Fatalf("serves %q, want first", got)
	}
	renew("second")
	if got := served(); got != "second" {
		t.Errorf("after renewal serves %q, want second", got)
	}
	// A certificate written before its key: they do not match.
	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	testcert.Touch(t, keyFile)
	if got := served(); got != "second" {
		t.Errorf("with a broken key serves %q, want second still", got)
	}
	renew("third")
	if got := served(); got != "third" {
		t.Errorf("after the next renewal serves %q, want third", got)
	}
}
