package httpserver

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestServe: Serve answers on every endpoint until a task fails, returns
// that failure, and has stopped the servers by then; a task that ends
// without an error ends nothing.
func TestServe(t *testing.T) {
	endpoints := make([]Endpoint, 2)
	for i := range endpoints {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		endpoints[i] = Endpoint{Name: "test", Listener: ln,
			Server: New(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }), Default)}
	}
	broken := errors.New("the task broke")
	fail := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Serve(t.Context(), endpoints,
			func(context.Context) error { return nil },
			func(ctx context.Context) error {
				select {
				case <-fail:
					return broken
				case <-ctx.Done():
					return nil
				}
			})
	}()
	for _, e := range endpoints {
		resp, err := http.Get("http://" + e.Listener.Addr().String())
		if err != nil {
			t.Fatalf("while serving: %v", err)
		}
		_ = resp.Body.Close()
	}
	close(fail)
	select {
	case err := <-done:
		if !errors.Is(err, broken) {
			t.Fatalf("Serve returned %v, want the task's failure", err)
		}
	case <-time.After(DrainTimeout + 5*time.Second):
		t.Fatal("Serve did not return after a task failed")
	}
	for _, e := range endpoints {
		if _, err := http.Get("http://" + e.Listener.Addr().String()); err == nil {
			t.Errorf("%s still answers after Serve returned", e.Listener.Addr())
		}
	}
}

// TestServeStopsWithTheContext: Serve returns nil when its context ends.
func TestServeStopsWithTheContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := Serve(ctx, []Endpoint{{Name: "test", Listener: ln, Server: New(http.NotFoundHandler(), Default)}}); err != nil {
		t.Fatalf("Serve after its context ended: %v", err)
	}
}
