package kedascaler

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/gpupool/gpupool/adapter/externalscaler"
	"github.com/gpupool/gpupool/internal/httpserver"
)

// maxMessageBytes bounds a call's message, read before the metadata's own
// bounds are checked: a trigger's is a few hundred bytes.
const maxMessageBytes = 64 << 10

// CertKeyContent is where the serving certificate comes from: the
// adapter's API server's (its SecureServingInfo.Cert), which reads its
// files again when they change.
type CertKeyContent interface {
	CurrentCertKeyContent() (cert, key []byte)
}

// ServerTLS is the scaler's TLS: it serves cert's current certificate and
// asks every client for a certificate that one of clientCAs signed,
// refusing the handshake of a client whose certificate they did not sign.
// KEDA presents the TriggerAuthentication's tlsClientCert and
// tlsClientKey, and checks the serving certificate against its caCert. A
// client with no certificate completes the handshake, so that each of its
// calls can be refused with the parameters it lacks (requireClientCert);
// so does Go's client with a certificate of another CA, which it does not
// send to a server that names the CAs it accepts.
func ServerTLS(cert CertKeyContent, clientCAs *x509.CertPool) *tls.Config {
	c := &servingCert{src: cert}
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: c.get, ClientCAs: clientCAs, ClientAuth: tls.VerifyClientCertIfGiven}
}

// What a client without KEDA's certificate is told: the parameters of its
// trigger's authenticationRef.
const (
	errNoClientCert = "no client certificate signed by the CA of gpupool-adapter's --keda-client-ca: the trigger's " +
		"authenticationRef must give tlsClientCert and tlsClientKey, such a certificate (and caCert, the CA of its serving certificate)"
	errCleartext = "cleartext: the scaler takes TLS only; the trigger's authenticationRef must give caCert (the CA of " +
		"gpupool-adapter's serving certificate), tlsClientCert and tlsClientKey (signed by the CA of its --keda-client-ca)"
)

// requireClientCert refuses a call whose client presented no
// certificate: ServerTLS verified any it did present.
func requireClientCert(ctx context.Context) error {
	p, ok := peer.FromContext(ctx)
	if ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(info.State.VerifiedChains) > 0 {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, errNoClientCert)
}

func unaryClientCert(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := requireClientCert(ctx); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func streamClientCert(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := requireClientCert(ss.Context()); err != nil {
		return err
	}
	return handler(srv, ss)
}

// servingCert parses its source's certificate when it changes.
type servingCert struct {
	src CertKeyContent

	mu              sync.Mutex
	certPEM, keyPEM []byte
	cert            *tls.Certificate
}

func (c *servingCert) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	certPEM, keyPEM := c.src.CurrentCertKeyContent()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil && bytes.Equal(certPEM, c.certPEM) && bytes.Equal(keyPEM, c.keyPEM) {
		return c.cert, nil
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	switch {
	case err != nil && c.cert != nil:
		return c.cert, nil // a pair caught half written: the previous one until it is whole
	case err != nil:
		return nil, fmt.Errorf("the serving certificate: %w", err)
	}
	c.cert, c.certPEM, c.keyPEM = &pair, certPEM, keyPEM
	return c.cert, nil
}

// ClientCAs reads the CAs whose client certificates the scaler accepts
// from a PEM file.
func ClientCAs(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file) //nolint:gosec // the operator names the file
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}

// NewServer is a gRPC server serving s over tlsConfig to clients with a
// certificate, counting its calls.
func (s *Scaler) NewServer(tlsConfig *tls.Config) *grpc.Server {
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsConfig)),
		grpc.MaxRecvMsgSize(maxMessageBytes),
		grpc.ChainUnaryInterceptor(s.countUnary, unaryClientCert),
		grpc.ChainStreamInterceptor(s.countStream, streamClientCert),
	)
	externalscaler.RegisterExternalScalerServer(srv, s)
	return srv
}

// newCleartextServer answers every call errCleartext, counted by method.
func (s *Scaler) newCleartextServer() *grpc.Server {
	return grpc.NewServer(
		grpc.MaxRecvMsgSize(maxMessageBytes),
		grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
			return status.Error(codes.Unauthenticated, errCleartext)
		}),
		grpc.ChainStreamInterceptor(s.countStream),
	)
}

// Serve serves s on ln over tlsConfig until ctx ends (nil) or serving
// fails; then it ends the streams and lets the calls in flight finish for
// up to httpserver.DrainTimeout, and returns once they have. A client
// that dials ln in cleartext is answered errCleartext.
func (s *Scaler) Serve(ctx context.Context, ln net.Listener, tlsConfig *tls.Config) error {
	tlsLn, cleartextLn := splitTLS(ln)
	cleartext := s.newCleartextServer()
	go func() { _ = cleartext.Serve(cleartextLn) }()
	defer cleartext.Stop()
	srv := s.NewServer(tlsConfig)
	served := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		select {
		case <-ctx.Done():
		case <-served:
		}
		s.stop()
		graceful := make(chan struct{})
		go func() { srv.GracefulStop(); close(graceful) }()
		select {
		case <-graceful:
		case <-time.After(httpserver.DrainTimeout):
			srv.Stop()
			<-graceful
		}
	}()
	err := srv.Serve(tlsLn)
	close(served)
	<-drained
	if err != nil {
		return fmt.Errorf("serving KEDA's external scaler on %s: %w", ln.Addr(), err)
	}
	return nil
}
