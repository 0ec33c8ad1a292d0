package e2e

import (
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestSlowClientsAreCutOff: a client that trickles its request, or opens
// connections and sends nothing, cannot hold the allocator's or the
// daemon's connections: each is closed within the server's read timeout
// (10 s), while a well-behaved request is still answered.
func TestSlowClientsAreCutOff(t *testing.T) {
	cfg := writePoolConfig(t, map[string]int64{"ml": noQuota})
	alloc := startAllocator(t, "--data-dir", t.TempDir(), "--config", cfg.Path)
	daemonAddr := "127.0.0.1:" + freePort(t)
	startDaemon(t, &syncBuffer{}, cfg.Servers, "--allocator", alloc.URL, "--name", "gpu-0", "--listen", daemonAddr,
		"--probe-listen", "127.0.0.1:0", "--simulate-gpus", "A100:80Gi:1")
	for name, addr := range map[string]string{"allocator": alloc.URL[len("http://"):], "daemon": daemonAddr} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var wg sync.WaitGroup
			closedAfter := make([]time.Duration, 20)
			for i := range closedAfter {
				conn, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				wg.Go(func() {
					defer func() { _ = conn.Close() }()
					start := time.Now()
					if i%2 == 0 {
						// A body of 100 bytes at a byte a second.
						_, _ = io.WriteString(conn, "PUT /v1/servers/gpu-9 HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
						for range 100 {
							if _, err := conn.Write([]byte("x")); err != nil {
								break
							}
							time.Sleep(time.Second)
						}
					}
					// Nothing sent (or the rest of the body never comes):
					// the read ends when the server closes.
					_ = conn.SetReadDeadline(time.Now().Add(60 * time.Second))
					_, _ = io.Copy(io.Discard, conn)
					closedAfter[i] = time.Since(start)
				})
			}
			wg.Wait()
			for i, d := range closedAfter {
				if d > 20*time.Second {
					t.Errorf("connection %d stayed open %s; want it closed within the 10 s read timeout", i, d.Round(time.Second))
				}
			}
			resp, err := http.Get("http://" + addr + "/healthz") //nolint:noctx // a test's one request
			if err != nil {
				t.Fatalf("/healthz after the slow clients: %v", err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("/healthz after the slow clients: %s", resp.Status)
			}
		})
	}
}
