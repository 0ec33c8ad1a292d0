package httpserver

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
)

// KeyPair serves a certificate from two files and reads them again when
// either changes, as when cert-manager renews the Secret they are mounted
// from. Each handshake compares the files' modification times and sizes
// with those it loaded (two stats, far cheaper than the handshake); a pair
// that does not load, such as a certificate written before its key, keeps
// the previous one until the next handshake finds them whole.
type KeyPair struct {
	certFile, keyFile string
	log               *slog.Logger

	mu     sync.Mutex
	cert   *tls.Certificate
	loaded [2]fileStamp
}

type fileStamp struct {
	modified int64 // nanoseconds since the epoch
	size     int64
}

// LoadKeyPair loads the pair, which must load now.
func LoadKeyPair(certFile, keyFile string, log *slog.Logger) (*KeyPair, error) {
	k := &KeyPair{certFile: certFile, keyFile: keyFile, log: log}
	stamps, err := k.stamps()
	if err != nil {
		return nil, err
	}
	return k, k.load(stamps)
}

// GetCertificate is tls.Config's.
func (k *KeyPair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	stamps, err := k.stamps()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err == nil && stamps != k.loaded {
		if err := k.load(stamps); err != nil {
			k.log.Warn("the certificate files changed but do not load; serving the previous certificate", "err", err)
		} else {
			k.log.Info("certificate reloaded", "file", k.certFile, "not_after", k.cert.Leaf.NotAfter)
		}
	}
	return k.cert, nil
}

// load reads the pair; the caller holds mu, or k is not shared yet.
func (k *KeyPair) load(stamps [2]fileStamp) error {
	cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		return fmt.Errorf("the serving certificate (%s, %s): %w", k.certFile, k.keyFile, err)
	}
	k.cert, k.loaded = &cert, stamps
	return nil
}

func (k *KeyPair) stamps() ([2]fileStamp, error) {
	var s [2]fileStamp
	for i, f := range []string{k.certFile, k.keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return s, fmt.Errorf("the serving certificate: %w", err)
		}
		s[i] = fileStamp{fi.ModTime().UnixNano(), fi.Size()}
	}
	return s, nil
}
