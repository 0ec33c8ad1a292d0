package api

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/internal/metricdef"
)

// LabelProbeAddress is the server label that tells clients where the
// daemon answers latency probes.
const LabelProbeAddress = "gpupool.io/probe-address"

// TransportTCP labels latencies measured over TCP; `rdma` is for verbs,
// which need RDMA hardware this project's tests do not have.
const TransportTCP = "tcp"

// LatencyFamily is bitfusion_rdma_latency_seconds, the round trip between
// a client and a GPU server on the data path, as either side measures it:
// the daemon serves it, `gpupool run` pushes its own.
var LatencyFamily = metricdef.Histogram("bitfusion_rdma_latency_seconds", "seconds",
	metricdef.Labels{"server", "client_node", "transport"},
	"Round trip between a client and a GPU server on the data path, by transport (rdma where verbs exist, tcp otherwise).",
	// 5 us .. 80 ms: Bitfusion asks for 50 us on RDMA.
	prometheus.ExponentialBuckets(5e-6, 2, 15))

// Probe frames are 9 bytes: a kind and 8 bytes of payload. A ping carries
// the sender's clock; the other side echoes it back unchanged, so each side
// measures its own round trips. A connection opens with a hello naming the
// client node.
const (
	framePing  = 'P'
	frameEcho  = 'E'
	frameHello = 'H'
	frameSize  = 9
	maxNameLen = 253
	// maxRTT bounds what counts as a round trip; a forged or corrupt echo
	// must not poison the histogram's sum.
	maxRTT = 10 * time.Second
)

// IsNameToken reports whether s is 1..maxLen letters, digits, '.', '_'
// and '-': what names and IDs that peers send and labels carry are made of.
func IsNameToken(s string, maxLen int) bool {
	if s == "" || len(s) > maxLen {
		return false
	}
	for _, c := range []byte(s) {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && c != '-' && c != '.' && c != '_' {
			return false
		}
	}
	return true
}

// validNodeName accepts what Kubernetes node names and hostnames are made
// of, so a client cannot smuggle invalid label values in.
func validNodeName(s string) bool { return IsNameToken(s, maxNameLen) }

// DialProbe connects to a server's probe address as clientNode and probes
// until ctx ends, observing the round trips the client measures.
func DialProbe(ctx context.Context, addr, clientNode string, interval time.Duration, observe func(time.Duration)) error {
	if !validNodeName(clientNode) {
		return fmt.Errorf("probe: client node name %q is not a host name of at most %d characters", clientNode, maxNameLen)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	hello := append([]byte{frameHello, byte(len(clientNode))}, clientNode...)
	if _, err := conn.Write(hello); err != nil {
		_ = conn.Close()
		return err
	}
	return Probe(ctx, conn, interval, observe)
}

// ReadProbeHello reads the hello a probe connection opens with and returns
// the client node it names.
func ReadProbeHello(r io.Reader) (string, error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return "", err
	}
	if h[0] != frameHello {
		return "", fmt.Errorf("probe: want a hello, got %q", h[0])
	}
	name := make([]byte, h[1])
	if _, err := io.ReadFull(r, name); err != nil {
		return "", err
	}
	if !validNodeName(string(name)) {
		return "", fmt.Errorf("probe: client node name %q is not a host name", name)
	}
	return string(name), nil
}

// Probe pings over conn every interval and answers the other side's
// pings, observing each round trip, until ctx ends or conn fails; both
// ends of a connection run it after the hello.
func Probe(ctx context.Context, conn net.Conn, interval time.Duration, observe func(time.Duration)) error {
	start := time.Now() // a monotonic base for the payloads
	var wmu sync.Mutex
	// sent holds the pings awaiting their echo: only those count.
	var smu sync.Mutex
	sent := map[uint64]bool{}
	write := func(kind byte, v uint64) error {
		var b [frameSize]byte
		b[0] = kind
		binary.BigEndian.PutUint64(b[1:], v)
		wmu.Lock()
		defer wmu.Unlock()
		_, err := conn.Write(b[:])
		return err
	}
	errc := make(chan error, 2)
	go func() {
		r := bufio.NewReader(conn)
		var b [frameSize]byte
		for {
			if _, err := io.ReadFull(r, b[:]); err != nil {
				errc <- err
				return
			}
			v := binary.BigEndian.Uint64(b[1:])
			switch b[0] {
			case framePing:
				if err := write(frameEcho, v); err != nil {
					errc <- err
					return
				}
			case frameEcho:
				smu.Lock()
				ours := sent[v]
				delete(sent, v)
				smu.Unlock()
				if rtt := time.Since(start) - time.Duration(v); ours && rtt > 0 && rtt < maxRTT {
					observe(rtt)
				}
			default:
				errc <- fmt.Errorf("probe: unexpected frame %q", b[0])
				return
			}
		}
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = conn.Close()
			return nil
		case err := <-errc:
			_ = conn.Close()
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		case <-t.C:
			v := uint64(time.Since(start))
			smu.Lock()
			if len(sent) > 64 { // echoes that never came: forget them
				clear(sent)
			}
			sent[v] = true
			smu.Unlock()
			if err := write(framePing, v); err != nil {
				_ = conn.Close()
				return err
			}
		}
	}
}
