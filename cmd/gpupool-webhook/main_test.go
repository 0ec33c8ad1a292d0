package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/internal/cli"
)

func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--help"}, &stdout, &stderr); code != 0 || stderr.Len() != 0 {
		t.Fatalf("--help: exit %d, stderr %q", code, stderr.String())
	}
	for _, want := range []string{"POST /mutate", "POST /validate", "MutatingWebhookConfiguration", "caBundle", "failurePolicy Fail", "-gpu-memory", "-scheduler-name"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("--help does not say %q", want)
		}
	}
}

func TestBadFlags(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writePair(t, dir, "a")
	tlsFlags := []string{"--tls-cert-file", certFile, "--tls-private-key-file", keyFile}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--tls-cert-file and --tls-private-key-file are required: kube-apiserver calls webhooks over HTTPS only"},
		{append([]string{"--unit", "GPU"}, tlsFlags...), `--unit: unit \"GPU\": must be one of percent, gpus`},
		{append([]string{"--gpu-memory", "lots"}, tlsFlags...), `--gpu-memory: \"lots\" is not a quantity (e.g. 8000, 8000M or 16Gi)`},
		{[]string{"--tls-cert-file", keyFile, "--tls-private-key-file", keyFile}, "the serving certificate"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, &stdout, &stderr); code != cli.ExitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, %s; want %d and %q", tc.args, code, stderr.String(), cli.ExitUsage, tc.want)
		}
	}
}

// TestKeyPairReloads: a renewed certificate is served from the next
// handshake; a pair that does not load leaves the previous one served.
func TestKeyPairReloads(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writePair(t, dir, "first")
	k, err := loadKeyPair(certFile, keyFile, slog.New(slog.DiscardHandler))
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
	writePair(t, dir, "second")
	if got := served(); got != "second" {
		t.Errorf("after renewal serves %q, want second", got)
	}
	// A certificate written before its key: they do not match.
	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	touch(t, keyFile)
	if got := served(); got != "second" {
		t.Errorf("with a broken key serves %q, want second still", got)
	}
	writePair(t, dir, "third")
	if got := served(); got != "third" {
		t.Errorf("after the next renewal serves %q, want third", got)
	}
}

// writePair writes a new self-signed certificate for commonName and its
// key as tls.crt and tls.key in dir, dated later than any write before, so
// that the change shows whatever the file system's time resolution.
func writePair(t *testing.T, dir, commonName string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: commonName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for path, block := range map[string]*pem.Block{certFile: {Type: "CERTIFICATE", Bytes: der}, keyFile: {Type: "PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		touch(t, path)
	}
	return certFile, keyFile
}

var generation = time.Now()

// touch dates path a second after the last file touched.
func touch(t *testing.T, path string) {
	t.Helper()
	generation = generation.Add(time.Second)
	if err := os.Chtimes(path, generation, generation); err != nil {
		t.Fatal(err)
	}
}
