package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/internal/testcert"
)

// TestAllocatorTLS runs the allocator on HTTPS with tokens, as the
// manifests do, and its clients as deployed: gpupool-server registers
// through it, verifying its certificate against the CA file, and the CLI
// does the same; a client without the CA, or speaking plain HTTP, gets
// nowhere. A renewed certificate is served without a restart. Off
// loopback, plain HTTP needs --insecure-http, which says what it exposes.
func TestAllocatorTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, "gpupool-ca")
	caFile := ca.WriteFile(t, dir)
	certFile, keyFile := testcert.WritePair(t, dir, ca.Issue(t, "gpupool-allocator", x509.ExtKeyUsageServerAuth))
	config := writePoolConfig(t, map[string]int64{"ml": 400})
	a := startAllocator(t, "--data-dir", t.TempDir(), "--config", config.Path, "--tls-cert-file", certFile, "--tls-private-key-file", keyFile)
	if !strings.HasPrefix(a.URL, "https://") {
		t.Fatalf("the allocator serves %s, want https", a.URL)
	}

	logs := &syncBuffer{}
	startDaemon(t, logs, config.Servers, "--name", "gpu-0", "--allocator", a.URL, "--allocator-ca-file", caFile,
		"--listen", "127.0.0.1:0", "--probe-listen", "127.0.0.1:0", "--simulate-gpus", "A100:80Gi:2")
	admin := newClient(t, a.URL, config.Admin)
	if err := admin.TrustCAFile(caFile); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		pool, err := admin.Pool(context.Background())
		return err == nil && len(pool.Servers) == 1
	})

	env := append(config.tenantEnv(t, a.URL, "ml"), "GPUPOOL_ALLOCATOR_CA_FILE="+caFile)
	if out, code := gpupool(t, env, "run", "-n", "1", "-p", "50", "--", "true"); code != 0 {
		t.Errorf("gpupool run over HTTPS: exit %d\n%s", code, out)
	}
	if out, code := gpupool(t, env[:len(env)-1], "leases"); code == 0 || !strings.Contains(out, "certificate signed by unknown authority") {
		t.Errorf("gpupool without the CA: exit %d, want refused for the unknown authority\n%s", code, out)
	}
	resp, err := http.Get("http" + strings.TrimPrefix(a.URL, "https") + "/v1/pool")
	if err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP to the HTTPS port: %s, want 400", resp.Status)
		}
	}

	// cert-manager renews: a new certificate in the same files.
	renewed := ca.Issue(t, "gpupool-allocator", x509.ExtKeyUsageServerAuth)
	testcert.WritePair(t, dir, renewed)
	conn, err := tls.Dial("tcp", strings.TrimPrefix(a.URL, "https://"), &tls.Config{RootCAs: ca.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	if got := conn.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(renewed.Leaf.SerialNumber) != 0 {
		t.Errorf("after the renewal the allocator serves serial %v, want the new %v", got, renewed.Leaf.SerialNumber)
	}
	_ = conn.Close()

	out, code := runAllocator(t, "--data-dir", t.TempDir(), "--listen", "0.0.0.0:0")
	if code != 2 || !strings.Contains(out, "bearer token in clear text") || !strings.Contains(out, "--insecure-http") {
		t.Errorf("plain HTTP off loopback: exit %d, want 2 naming the risk and the flag\n%s", code, out)
	}
	insecure := startAllocator(t, "--data-dir", t.TempDir(), "--listen", "0.0.0.0:0", "--insecure-http")
	if !strings.Contains(insecure.logs.String(), "INSECURE") {
		t.Errorf("--insecure-http off loopback logged no warning:\n%s", insecure.logs)
	}
}
