package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/logtest"
	"github.com/gpupool/gpupool/internal/testcert"
)

// TestRunServesHTTPSUntilStopped: the webhook serves its certificate on
// the address it logs, and stops when its context ends.
func TestRunServesHTTPSUntilStopped(t *testing.T) {
	ca := testcert.NewCA(t, "test CA")
	o := NewOptions()
	o.Listen = "127.0.0.1:0"
	o.CertFile, o.KeyFile = testcert.WritePair(t, t.TempDir(), ca.Issue(t, "gpupool-webhook", x509.ExtKeyUsageServerAuth))
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	var log logtest.Log
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran, returned := make(chan error, 1), make(chan struct{})
	go func() { ran <- Run(ctx, o, log.Logger()); close(returned) }()

	address := logtest.Value(log.Await(t, "webhook serving", returned), "address")
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS12}}}
	resp, err := c.Get(address + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "ok\n" {
		t.Errorf("GET /healthz: %d %q, want 200 ok", resp.StatusCode, body)
	}

	cancel()
	if err := <-ran; err != nil {
		t.Errorf("Run stopped with %v, want nil", err)
	}
}

// TestCertificateThatDoesNotLoadIsAUsageError: a key pair that does not
// load is the command line's fault.
func TestCertificateThatDoesNotLoadIsAUsageError(t *testing.T) {
	_, keyFile := testcert.WritePair(t, t.TempDir(), testcert.NewCA(t, "test CA").Issue(t, "a", x509.ExtKeyUsageServerAuth))
	o := NewOptions()
	o.CertFile, o.KeyFile = keyFile, keyFile
	var log logtest.Log
	var usage *cli.UsageError
	if err := Run(context.Background(), o, log.Logger()); !errors.As(err, &usage) {
		t.Errorf("Run with a key as the certificate: %v, want a UsageError", err)
	}
}
