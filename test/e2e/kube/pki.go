package kube

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// certValidity is long enough for any test run; every run makes new keys.
const certValidity = 24 * time.Hour

// authority is a certificate authority kept in memory.
type authority struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

// newAuthority makes a self-signed CA with a new key.
func newAuthority(commonName string) (*authority, error) {
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: commonName},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, key, err := newCert(tmpl, nil)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &authority{cert: cert, key: key, certPEM: encodePEM("CERTIFICATE", der)}, nil
}

// leaf describes a certificate for a server or a client to present.
type leaf struct {
	subject  pkix.Name
	dnsNames []string
	ips      []net.IP
	usages   []x509.ExtKeyUsage
}

// issue makes a new key and a certificate for it signed by a.
func (a *authority) issue(l leaf) (certPEM, keyPEM []byte, err error) {
	tmpl := &x509.Certificate{
		Subject:     l.subject,
		DNSNames:    l.dnsNames,
		IPAddresses: l.ips,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: l.usages,
	}
	der, key, err := newCert(tmpl, a)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return encodePEM("CERTIFICATE", der), keyPEM, nil
}

// newCert makes a key and a certificate for it from tmpl, signed by parent,
// or self-signed when parent is nil.
func newCert(tmpl *x509.Certificate, parent *authority) ([]byte, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber, err = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Minute), now.Add(certValidity)
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, key.Public(), signerKey)
	return der, key, err
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return encodePEM("PRIVATE KEY", der), nil
}

func encodePEM(blockType string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
}

// files writes keys, certificates and kubeconfigs into one directory. It
// keeps the first error, so that a run of writes is checked once, at its end.
type files struct {
	dir string
	err error
}

// write writes data to the file name and returns its path.
func (f *files) write(name string, data []byte) string {
	path := filepath.Join(f.dir, name)
	if f.err == nil {
		f.err = os.WriteFile(path, data, 0o600)
	}
	return path
}

// issue has ca issue l, and writes name.crt and name.key.
func (f *files) issue(ca *authority, name string, l leaf) (certFile, keyFile string) {
	certPEM, keyPEM, err := ca.issue(l)
	if f.err == nil {
		f.err = err
	}
	return f.write(name+".crt", certPEM), f.write(name+".key", keyPEM)
}

// kubeconfig has ca issue l, a client certificate, and writes
// name.kubeconfig, which presents it to the apiserver at server.
func (f *files) kubeconfig(name, server string, ca *authority, l leaf) string {
	certPEM, keyPEM, err := ca.issue(l)
	if f.err == nil {
		f.err = err
	}
	data, err := clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"e2e": {Server: server, CertificateAuthorityData: ca.certPEM}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{name: {ClientCertificateData: certPEM, ClientKeyData: keyPEM}},
		Contexts:       map[string]*clientcmdapi.Context{"e2e": {Cluster: "e2e", AuthInfo: name}},
		CurrentContext: "e2e",
	})
	if f.err == nil {
		f.err = err
	}
	return f.write(name+".kubeconfig", data)
}
