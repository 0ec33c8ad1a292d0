package api

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// TestReadProbeHello: a hello names a valid node, or it is refused, so a
// label value from the network cannot be anything.
func TestReadProbeHello(t *testing.T) {
	for _, tc := range []struct {
		hello []byte
		node  string // "" when refused
	}{
		{[]byte{frameHello, 6, 'n', 'o', 'd', 'e', '-', '1'}, "node-1"},
		{[]byte{frameHello, 2, 0xff, 0xfe}, ""},
		{[]byte{frameHello, 3, 'a', ' ', 'b'}, ""},
		{[]byte{frameHello, 0}, ""},
		{[]byte{frameHello, 9, 'n', 'o', 'd', 'e'}, ""}, // cut short
		{[]byte{'X', 1, 'a'}, ""},
	} {
		node, err := ReadProbeHello(bytes.NewReader(tc.hello))
		if node != tc.node || (err == nil) != (tc.node != "") {
			t.Errorf("hello %q: node %q, error %v; want node %q", tc.hello, node, err, tc.node)
		}
	}
}

// TestProbeIgnoresForgedEchoes: an echo of a ping never sent is not a
// round trip, while the other side's pings are still answered.
func TestProbeIgnoresForgedEchoes(t *testing.T) {
	ours, theirs := net.Pipe()
	defer func() { _ = theirs.Close() }()
	ctx, cancel := context.WithCancel(context.Background())
	var observed atomic.Int64
	done := make(chan error, 1)
	go func() { done <- Probe(ctx, ours, time.Hour, func(time.Duration) { observed.Add(1) }) }()
	frame := func(kind byte, v uint64) []byte {
		b := make([]byte, frameSize)
		b[0] = kind
		binary.BigEndian.PutUint64(b[1:], v)
		return b
	}
	if _, err := theirs.Write(frame(frameEcho, 1)); err != nil { // an echo of nothing sent
		t.Fatal(err)
	}
	// Frames are read in order: once the ping is echoed, the forged echo
	// before it was handled.
	if _, err := theirs.Write(frame(framePing, 42)); err != nil {
		t.Fatal(err)
	}
	echo := make([]byte, frameSize)
	if _, err := io.ReadFull(theirs, echo); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(echo, frame(frameEcho, 42)) {
		t.Errorf("the ping came back as %x, want its echo", echo)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Probe ended with %v, want nil when its context ends", err)
	}
	if n := observed.Load(); n != 0 {
		t.Errorf("a forged echo was observed as %d round trips", n)
	}
}

// TestDialProbeRefusesBadNodeName: the client checks its own node name, as
// the daemon would refuse it, before it connects.
func TestDialProbeRefusesBadNodeName(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	if err := DialProbe(context.Background(), ln.Addr().String(), "bad name", time.Second, func(time.Duration) {}); err == nil {
		t.Error("DialProbe accepted an invalid node name")
	}
	// A connection DialProbe made would be queued by now.
	_ = ln.(*net.TCPListener).SetDeadline(time.Now())
	if conn, err := ln.Accept(); err == nil {
		_ = conn.Close()
		t.Error("DialProbe connected before refusing its node name")
	}
}
