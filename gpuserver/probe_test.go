package gpuserver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
)

// probeHello is the hello a probe client opens with, in gpuserver/api's
// wire format: 'H', the node name's length, the name.
func probeHello(node string) []byte { return append([]byte{'H', byte(len(node))}, node...) }

// TestProbeMeasuresBothSides: a client and a server probe each other over
// loopback TCP; both record round trips, labelled with the transport.
func TestProbeMeasuresBothSides(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	server := gpuapi.LatencyFamily.NewHistogramVec()
	go ServeProbes(ctx, ln, "gpu-a", 5*time.Millisecond, server, slog.Default())
	client := gpuapi.LatencyFamily.NewHistogramVec()
	obs := client.WithLabelValues("gpu-a", "node-7", gpuapi.TransportTCP)
	go func() {
		_ = gpuapi.DialProbe(ctx, ln.Addr().String(), "node-7", 5*time.Millisecond, func(d time.Duration) { obs.Observe(d.Seconds()) })
	}()
	count := func(h *prometheus.HistogramVec) uint64 {
		reg := prometheus.NewRegistry()
		reg.MustRegister(h)
		fams, _ := reg.Gather()
		for _, f := range fams {
			for _, m := range f.GetMetric() {
				return m.GetHistogram().GetSampleCount()
			}
		}
		return 0
	}
	deadline := time.Now().Add(5 * time.Second)
	for count(server) < 5 || count(client) < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("after 5s: %d server and %d client round trips, want at least 5 each", count(server), count(client))
		}
		time.Sleep(10 * time.Millisecond)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(server)
	fams, _ := reg.Gather()
	labels := fams[0].GetMetric()[0].GetLabel()
	got := map[string]string{}
	for _, l := range labels {
		got[l.GetName()] = l.GetValue()
	}
	if got["server"] != "gpu-a" || got["client_node"] != "node-7" || got["transport"] != "tcp" {
		t.Errorf("server-side labels = %v", got)
	}
	if sum := fams[0].GetMetric()[0].GetHistogram().GetSampleSum(); sum <= 0 || sum > 5 {
		t.Errorf("round trips sum to %vs: not a loopback latency", sum)
	}
}

// TestServeProbesRefusesBadHellos: a connection whose hello names no
// valid node (a label value must not crash the daemon), or that opens with
// something else, is closed.
func TestServeProbesRefusesBadHellos(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go ServeProbes(ctx, ln, "gpu-a", time.Hour, gpuapi.LatencyFamily.NewHistogramVec(), slog.Default())
	for _, hello := range [][]byte{probeHello("\xff\xfe"), probeHello("a b"), []byte("GET / HTTP/1.1\r\n\r\n")} {
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = conn.Write(hello)
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); err == nil {
			t.Errorf("hello %q was not refused", hello)
		}
		_ = conn.Close()
	}
}

// TestProbeSlotsPerAddress: one address gets maxProbesPerAddress slots,
// whether or not its connections say hello, so a client that opens more
// connections than the port has slots does not lock the others out.
//
// No outcome hangs on a short deadline: the connections are all opened
// first, half of them mute, then each says hello and is served (a ping
// comes) or was refused (closed: EOF or reset), however long that takes.
func TestProbeSlotsPerAddress(t *testing.T) {
	defer helloTimeout.Store(helloTimeout.Swap(int64(time.Hour))) // mute connections keep their slots while the test runs
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go ServeProbes(ctx, ln, "gpu-a", 10*time.Millisecond, gpuapi.LatencyFamily.NewHistogramVec(), slog.New(slog.DiscardHandler))
	dial := func(local string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
		conn, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	hello := probeHello("node-1")
	// served says hello on conn unless it did already, and reports whether
	// a ping comes back (served) rather than the end of the connection
	// (refused).
	served := func(i int, conn net.Conn, greeted bool) bool {
		if !greeted {
			_, _ = conn.Write(hello) // fails on a closed one: the read tells
		}
		_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
		var b [9]byte // a frame: its kind and 8 bytes
		if _, err := io.ReadFull(conn, b[:]); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("connection %d: neither served nor closed in a minute", i+1)
			}
			return false // EOF or reset: refused
		}
		if b[0] != 'P' {
			t.Fatalf("connection %d: got frame %q, want a ping", i+1, b[0])
		}
		return true
	}
	// The attacker opens more connections than its address has slots,
	// every other one never saying hello (until the test asks).
	conns := make([]net.Conn, maxProbesPerAddress+3)
	for i := range conns {
		conns[i] = dial("127.0.0.1")
		if i%2 == 0 {
			_, _ = conns[i].Write(hello)
		}
	}
	for i, conn := range conns {
		if got, want := served(i, conn, i%2 == 0), i < maxProbesPerAddress; got != want {
			t.Errorf("connection %d from one address (mute: %v): served %v, want %v", i+1, i%2 == 1, got, want)
		}
	}
	if !served(-1, dial("127.0.0.2"), false) {
		t.Error("a second client was locked out by the first")
	}
}
