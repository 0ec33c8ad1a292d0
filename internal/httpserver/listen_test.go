package httpserver

import (
	"net"
	"testing"
)

// TestListen: a listener given is the one served; without one, Listen
// listens on the address.
func TestListen(t *testing.T) {
	given, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = given.Close() }()
	if ln, err := Listen(given, "256.0.0.1:1"); ln != given || err != nil {
		t.Errorf("Listen(given, unusable address) = %v, %v; want the given listener", ln, err)
	}
	ln, err := Listen(nil, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	if ln == given || ln.Addr().(*net.TCPAddr).Port == 0 {
		t.Errorf("Listen(nil, 127.0.0.1:0) = %v, want a new listener on a port", ln.Addr())
	}
	if _, err := Listen(nil, "256.0.0.1:1"); err == nil {
		t.Error("Listen(nil, 256.0.0.1:1): no error")
	}
}
