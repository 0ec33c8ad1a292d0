package httpserver

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
)

// IsLoopback is whether listen (host:port) serves this host alone.
func IsLoopback(listen string) (bool, error) {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false, fmt.Errorf("--listen %q: %w", listen, err)
	}
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback(), nil
}

// ServingTLS is the TLS of a server whose clients send bearer tokens, or
// nil for plain HTTP: on loopback, or off it only when insecure says the
// operator wants tokens in clear text on the network (and the log says
// so). The certificate is read again when its files change.
func ServingTLS(listen, certFile, keyFile string, insecure bool, log *slog.Logger) (*tls.Config, error) {
	loopback, err := IsLoopback(listen)
	switch {
	case err != nil:
		return nil, err
	case (certFile == "") != (keyFile == ""):
		return nil, errors.New("--tls-cert-file and --tls-private-key-file go together")
	case certFile == "" && loopback:
		return nil, nil
	case certFile == "" && !insecure:
		return nil, fmt.Errorf("--listen %s is not a loopback address, and plain HTTP there would carry every client's bearer token in clear text: "+
			"give --tls-cert-file and --tls-private-key-file (deploy/certs.sh or cert-manager issue them), or --insecure-http to serve it anyway", listen)
	case certFile == "":
		log.Warn("INSECURE: serving plain HTTP off loopback (--insecure-http): bearer tokens cross the network in clear text", "listen", listen)
		return nil, nil
	}
	pair, err := LoadKeyPair(certFile, keyFile, log)
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: pair.GetCertificate}, nil
}
