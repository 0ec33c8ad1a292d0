package kedascaler

import (
	"bufio"
	"net"
	"sync"
	"time"
)

// handshakeRecord is the first byte of every TLS connection: a
// handshake record. A cleartext HTTP/2 client starts with "PRI * HTTP/2.0".
const handshakeRecord = 0x16

// firstByteTimeout bounds how long an accepted connection may send
// nothing before it is closed: the classification waits on it.
const firstByteTimeout = 10 * time.Second

// splitTLS splits ln's connections by their first byte: TLS handshakes to
// the first listener, anything else to the second. KEDA dials a trigger
// without an authenticationRef in cleartext; served by a server of its
// own, it gets an error that says what to set, not a failed handshake.
// Closing either listener closes ln, and both.
func splitTLS(ln net.Listener) (tlsLn, cleartextLn net.Listener) {
	s := &split{ln: ln, done: make(chan struct{})}
	tlsQ := &connQueue{split: s, conns: make(chan net.Conn)}
	clearQ := &connQueue{split: s, conns: make(chan net.Conn)}
	go s.accept(tlsQ, clearQ)
	return tlsQ, clearQ
}

type split struct {
	ln        net.Listener
	done      chan struct{}
	closeOnce sync.Once
	err       error // why accepting stopped, once done is closed
}

func (s *split) close(err error) {
	s.closeOnce.Do(func() {
		s.err = err
		close(s.done)
		_ = s.ln.Close()
	})
}

func (s *split) accept(tlsQ, clearQ *connQueue) {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			s.close(err)
			return
		}
		go func() {
			_ = c.SetReadDeadline(time.Now().Add(firstByteTimeout))
			r := bufio.NewReader(c)
			first, err := r.Peek(1)
			_ = c.SetReadDeadline(time.Time{})
			if err != nil {
				_ = c.Close()
				return
			}
			q := clearQ
			if first[0] == handshakeRecord {
				q = tlsQ
			}
			select {
			case q.conns <- &peekedConn{Conn: c, r: r}:
			case <-s.done:
				_ = c.Close()
			}
		}()
	}
}

// connQueue is one side of a split: a net.Listener of the connections
// classified to it.
type connQueue struct {
	split *split
	conns chan net.Conn
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.split.done:
		return nil, q.split.err
	}
}

func (q *connQueue) Close() error {
	q.split.close(net.ErrClosed)
	return nil
}

func (q *connQueue) Addr() net.Addr { return q.split.ln.Addr() }

// peekedConn reads first what was peeked.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
