// Package testcert makes certificates for tests: a CA that issues serving
// and client certificates for loopback, and key pairs written as files, as
// a mounted Secret holds them.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// CA is a certificate authority valid for an hour around its creation.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA.
func NewCA(t testing.TB, commonName string) *CA {
	t.Helper()
	ca := &CA{key: newKey(t)}
	tmpl := &x509.Certificate{SerialNumber: serial(t), Subject: pkix.Name{CommonName: commonName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	ca.Cert = parse(t, sign(t, tmpl, tmpl, &ca.key.PublicKey, ca.key))
	return ca
}

// Issue makes a certificate for commonName and usage (server or client
// authentication), for 127.0.0.1 and localhost, signed by ca.
func (ca *CA) Issue(t testing.TB, commonName string, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{SerialNumber: serial(t), Subject: pkix.Name{CommonName: commonName},
		NotBefore: ca.Cert.NotBefore, NotAfter: ca.Cert.NotAfter, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}}
	leaf := parse(t, sign(t, tmpl, ca.Cert, &key.PublicKey, ca.key))
	return tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
}

// Pool is a certificate pool holding ca alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// WriteFile writes ca's certificate as ca.crt (PEM) in dir.
func (ca *CA) WriteFile(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "ca.crt")
	write(t, path, &pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
	return path
}

// WritePair writes c's certificate and key as tls.crt and tls.key (PEM)
// in dir, dated later than any file this package wrote or touched before,
// so that a reader comparing modification times sees the change whatever
// the file system's time resolution.
func WritePair(t testing.TB, dir string, c tls.Certificate) (certFile, keyFile string) {
	t.Helper()
	keyDER, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	write(t, certFile, &pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]})
	write(t, keyFile, &pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	Touch(t, certFile)
	Touch(t, keyFile)
	return certFile, keyFile
}

var (
	mu         sync.Mutex
	generation = time.Now()
)

// Touch dates path a second after the last file dated by this package.
func Touch(t testing.TB, path string) {
	t.Helper()
	mu.Lock()
	generation = generation.Add(time.Second)
	when := generation
	mu.Unlock()
	if err := os.Chtimes(path, when, when); err != nil {
		t.Fatal(err)
	}
}

func write(t testing.TB, path string, b *pem.Block) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(b), 0o600); err != nil {
		t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func sign(t testing.TB, tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, parentKey *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func parse(t testing.TB, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
