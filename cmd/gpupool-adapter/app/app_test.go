package app

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/internal/cli"
)

// TestRunRefusesBadFlags: a flag that only Run can check (a file it
// reads, an address it parses, a cluster it loads) is a cli.UsageError
// naming the flag and the value, before anything is served.
func TestRunRefusesBadFlags(t *testing.T) {
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
// serves the external metrics API and /metrics (on the MetricsListener
// given), and returns nil once its context ends, both stopped.
func TestRunServesUntilTheContextEnds(t *testing.T) {
	o := NewOptions()
	metrics, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.NoDelegation, o.MetricsListener = true, metrics
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
