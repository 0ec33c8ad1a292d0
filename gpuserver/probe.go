package gpuserver

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// LabelProbeAddress is the server label that tells clients where the
// daemon answers latency probes.
const LabelProbeAddress = "gpupool.io/probe-address"

// TransportTCP labels latencies measured over TCP; `rdma` is for verbs,
// which need RDMA hardware this project's tests do not have.
const TransportTCP = "tcp"

// NewLatencyHistogram is bitfusion_rdma_latency_seconds, the round trip
// between a client and a GPU server on the data path, as either side
// measures it.
func NewLatencyHistogram() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "bitfusion_rdma_latency_seconds",
		Help: "Round trip between a client and a GPU server on the data path, by transport (rdma where verbs exist, tcp otherwise).",
		// 5 us .. 80 ms: Bitfusion asks for 50 us on RDMA.
		Buckets: prometheus.ExponentialBuckets(5e-6, 2, 15),
	}, []string{"server", "client_node", "transport"})
}

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
)

// probe pings over conn every interval and answers the other side's
// pings, observing each round trip, until ctx ends or conn fails.
func probe(ctx context.Context, conn net.Conn, interval time.Duration, observe func(time.Duration)) error {
	start := time.Now() // a monotonic base for the payloads
	var wmu sync.Mutex
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
				observe(time.Since(start) - time.Duration(v))
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
			if err := write(framePing, uint64(time.Since(start))); err != nil {
				_ = conn.Close()
				return err
			}
		}
	}
}

// ServeProbes answers clients' latency probes on ln and records the round
// trips the server measures, until ctx ends.
func ServeProbes(ctx context.Context, ln net.Listener, server string, interval time.Duration, hist *prometheus.HistogramVec, log *slog.Logger) {
	go func() { <-ctx.Done(); _ = ln.Close() }()
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			node, err := readHello(conn)
			if err != nil {
				log.Debug("probe hello", "remote", conn.RemoteAddr(), "err", err)
				_ = conn.Close()
				return
			}
			_ = conn.SetReadDeadline(time.Time{})
			obs := hist.WithLabelValues(server, node, TransportTCP)
			if err := probe(ctx, conn, interval, func(d time.Duration) { obs.Observe(d.Seconds()) }); err != nil {
				log.Debug("probe ended", "client_node", node, "err", err)
			}
		}()
	}
}

// DialProbe connects to a server's probe address as clientNode and probes
// until ctx ends, observing the round trips the client measures.
func DialProbe(ctx context.Context, addr, clientNode string, interval time.Duration, observe func(time.Duration)) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	if len(clientNode) > maxNameLen {
		clientNode = clientNode[:maxNameLen]
	}
	hello := append([]byte{frameHello, byte(len(clientNode))}, clientNode...)
	if _, err := conn.Write(hello); err != nil {
		_ = conn.Close()
		return err
	}
	return probe(ctx, conn, interval, observe)
}

func readHello(r io.Reader) (string, error) {
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
	return string(name), nil
}
