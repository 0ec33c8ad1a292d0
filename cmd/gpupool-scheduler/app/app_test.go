package app

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/testcert"
)

// TestPlainHTTPOnLoopbackOnly: the extender speaks plain HTTP on a
// loopback address only; anywhere else it needs a serving certificate and
// the CA of its clients, and a half-given pair is refused.
func TestPlainHTTPOnLoopbackOnly(t *testing.T) {
	pki := newTestPKI(t)
	quiet := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		listen, cert, key, ca string
		// err is in the refusal; else plain says whether TLS is off and
		// mutual whether client certificates are required.
		err           string
		plain, mutual bool
	}{
		{listen: "127.0.0.1:8474", plain: true},
		{listen: "", plain: true},
		{listen: "", cert: pki.serverCert, key: pki.serverKey, ca: pki.caCert, err: "are the extender's: they need --listen"},
		{listen: "[::1]:8474", plain: true},
		{listen: "localhost:8474", plain: true},
		{listen: ":8474", err: "--listen :8474 is not a loopback address: serving there needs --tls-cert-file, --tls-private-key-file and --client-ca-file"},
		{listen: "10.0.0.7:8474", err: "is not a loopback address"},
		{listen: "0.0.0.0:8474", cert: pki.serverCert, key: pki.serverKey,
			err: "--listen 0.0.0.0:8474 is not a loopback address: --client-ca-file must name the CA of kube-scheduler's client certificate"},
		{listen: "0.0.0.0:8474", cert: pki.serverCert, key: pki.serverKey, ca: pki.caCert, mutual: true},
		{listen: "127.0.0.1:8474", cert: pki.serverCert, key: pki.serverKey},
		{listen: "127.0.0.1:8474", cert: pki.serverCert, err: "--tls-cert-file and --tls-private-key-file go together"},
		{listen: "127.0.0.1:8474", ca: pki.caCert, err: "--client-ca-file needs --tls-cert-file and --tls-private-key-file"},
		{listen: "0.0.0.0:8474", cert: pki.serverCert, key: pki.serverKey, ca: pki.serverKey, err: "holds no PEM certificate"},
		{listen: "8474", err: `--listen "8474": address 8474: missing port in address`},
	} {
		cfg, err := servingTLS(&Options{Listen: tc.listen, TLSServingFlags: cli.TLSServingFlags{CertFile: tc.cert, KeyFile: tc.key}, ClientCAFile: tc.ca}, quiet)
		name := strings.Join([]string{tc.listen, filepath.Base(tc.cert), filepath.Base(tc.key), filepath.Base(tc.ca)}, " ")
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want %q", name, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", name, err)
		case (cfg == nil) != tc.plain || cfg != nil && (cfg.ClientAuth == tls.RequireAndVerifyClientCert) != tc.mutual:
			t.Errorf("%s: TLS %+v, want plain %v, client certificates required %v", name, cfg, tc.plain, tc.mutual)
		}
	}

}

// TestOnlyKubeSchedulersCertificateIsAnswered: with a client CA, a client
// without a certificate from it never reaches /bind.
func TestOnlyKubeSchedulersCertificateIsAnswered(t *testing.T) {
	pki := newTestPKI(t)
	cfg, err := servingTLS(&Options{Listen: "0.0.0.0:0", TLSServingFlags: cli.TLSServingFlags{CertFile: pki.serverCert, KeyFile: pki.serverKey}, ClientCAFile: pki.caCert}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), TLSConfig: cfg, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	defer func() { _ = srv.Close() }()
	for _, tc := range []struct {
		name  string
		certs []tls.Certificate
		ok    bool
	}{
		{name: "kube-scheduler's certificate", certs: []tls.Certificate{pki.ca.Issue(t, "kube-scheduler", x509.ExtKeyUsageClientAuth)}, ok: true},
		{name: "no certificate"},
		{name: "a certificate of another CA", certs: []tls.Certificate{testcert.NewCA(t, "another CA").Issue(t, "kube-scheduler", x509.ExtKeyUsageClientAuth)}},
	} {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.ca.Pool(), Certificates: tc.certs, MinVersion: tls.VersionTLS12}}}
		resp, err := c.Post("https://"+ln.Addr().String()+"/bind", "application/json", strings.NewReader("{}"))
		if err == nil {
			_ = resp.Body.Close()
		}
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want answered %v", tc.name, err, tc.ok)
		}
	}
}

// testPKI is kube-scheduler's CA, and the extender's serving certificate
// it signed, as files.
type testPKI struct {
	ca                            *testcert.CA
	caCert, serverCert, serverKey string
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	p := &testPKI{ca: testcert.NewCA(t, "kube-scheduler CA")}
	p.caCert = p.ca.WriteFile(t, dir)
	p.serverCert, p.serverKey = testcert.WritePair(t, dir, p.ca.Issue(t, "gpupool-scheduler", x509.ExtKeyUsageServerAuth))
	return p
}
