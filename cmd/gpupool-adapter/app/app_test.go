package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/gpupool/gpupool/adapter/externalscaler"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/testcert"
)

// TestRunRefusesBadFlags: a flag that only Run can check (a file it
// reads, an address it parses, a cluster it loads) is a cli.UsageError
// naming the flag and the value, before anything is served.
func TestRunRefusesBadFlags(t *testing.T) {
	notPEM := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		set  func(*Options)
		want string
	}{
		{"token file", func(o *Options) { o.AllocatorTokenFile = "/nonexistent/token" }, "--allocator-token-file: open /nonexistent/token"},
		{"allocator", func(o *Options) { o.Allocator = "allocator:8470" }, `--allocator: allocator address "allocator:8470" is not a URL`},
		{"allocator CA", func(o *Options) { o.AllocatorCAFile = "/nonexistent/ca.crt" }, "--allocator-ca-file: the allocator's CA: open /nonexistent/ca.crt"},
		{"queries", func(o *Options) { o.Backend, o.PrometheusQueries = "prometheus", "/nonexistent/queries.yaml" }, "open /nonexistent/queries.yaml"},
		{"kubeconfig", func(o *Options) { o.Kubeconfig = "/nonexistent/kubeconfig" }, "no cluster to delegate authentication to (--kubeconfig, or run in a pod; --no-delegation for a loopback demo)"},
		{"KEDA client CA", func(o *Options) { o.KedaScalerListen, o.KedaClientCA = "127.0.0.1:0", "/nonexistent/ca.crt" }, "--keda-client-ca: open /nonexistent/ca.crt"},
		{"KEDA client CA not PEM", func(o *Options) { o.KedaScalerListen, o.KedaClientCA = "127.0.0.1:0", notPEM }, "--keda-client-ca: " + notPEM + " holds no PEM certificate"},
	} {
		o := NewOptions()
		tc.set(o)
		if err := o.Validate(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		err := Run(t.Context(), o, slog.New(slog.DiscardHandler))
		var usage *cli.UsageError
		if !errors.As(err, &usage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a usage error with %q", tc.name, err, tc.want)
		}
	}
}

// TestRunServesUntilTheContextEnds: on loopback without delegation, Run
// serves the external metrics API, /metrics (on the MetricsListener
// given) and KEDA's external scaler with the API's certificate to a
// client with a certificate the KEDA CA signed, and returns nil once its
// context ends, all stopped.
func TestRunServesUntilTheContextEnds(t *testing.T) {
	o := NewOptions()
	metrics, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.NoDelegation, o.MetricsListener = true, metrics
	kedaCA := testcert.NewCA(t, "KEDA client CA")
	o.KedaScalerListen, o.KedaClientCA = freeAddr(t), kedaCA.WriteFile(t, t.TempDir())
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	metricsURL := "http://" + metrics.Addr().String() + "/metrics"
	_, port, _ := net.SplitHostPort(freeAddr(t))
	o.Serving.SecureServing.BindAddress = net.ParseIP("127.0.0.1")
	o.Serving.SecureServing.BindPort, _ = strconv.Atoi(port)
	o.Serving.SecureServing.ServerCert.CertDirectory = t.TempDir()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o, slog.New(slog.DiscardHandler)) }()

	// The API server's certificate is the loopback one Run made itself.
	insecure := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for _, url := range []string{metricsURL, "https://127.0.0.1:" + port + "/readyz"} {
		if err := waitOK(insecure, url, done); err != nil {
			cancel()
			t.Fatalf("%s: %v", url, err)
		}
	}
	// The scaler answers KEDA, with the API's certificate: here that the
	// allocator (none runs) does not answer.
	keda := kedaCA.Issue(t, "keda-operator", x509.ExtKeyUsageClientAuth)
	servingPEM, err := os.ReadFile(filepath.Join(o.Serving.SecureServing.ServerCert.CertDirectory, "apiserver.crt"))
	if err != nil {
		t.Fatal(err)
	}
	serving, _ := pem.Decode(servingPEM)
	conn, err := grpc.NewClient(o.KedaScalerListen, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		InsecureSkipVerify: true, // VerifyConnection checks it is the certificate Run made itself
		Certificates:       []tls.Certificate{keda},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if serving == nil || !bytes.Equal(cs.PeerCertificates[0].Raw, serving.Bytes) {
				return fmt.Errorf("served %s, not the API's certificate", cs.PeerCertificates[0].Subject)
			}
			return nil
		}})))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_, err = externalscaler.NewExternalScalerClient(conn).IsActive(ctx, &externalscaler.ScaledObjectRef{Name: "tf-training", Namespace: "ml",
		ScalerMetadata: map[string]string{"metric": "bitfusion_gpu_utilization", "selector": "app=tf-training", "target": "0.7"}})
	if s, _ := status.FromError(err); s.Code() != codes.Internal || s.Message() != "the direct backend failed for bitfusion_lease_pending_requests (the adapter's log says why)" {
		t.Errorf("IsActive: %v, want the backend's failure", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after its context ended: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after its context ended")
	}
	for _, url := range []string{metricsURL, "https://127.0.0.1:" + port + "/readyz"} {
		if resp, err := insecure.Get(url); err == nil {
			_ = resp.Body.Close()
			t.Errorf("%s still answers after Run returned", url)
		}
	}
	if c, err := net.Dial("tcp", o.KedaScalerListen); err == nil {
		_ = c.Close()
		t.Errorf("the KEDA scaler's %s still answers after Run returned", o.KedaScalerListen)
	}
}

// waitOK waits until url answers 200, for up to 30 s, or Run returns.
func waitOK(c *http.Client, url string, done <-chan error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := c.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		select {
		case runErr := <-done:
			return errors.Join(errors.New("Run returned"), runErr)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return err
		}
	}
}

// freeAddr is a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}
