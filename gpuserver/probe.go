package gpuserver

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
)

// Limits on the probe connections a daemon serves.
const (
	// maxProbeClients bounds the connections (and client_node series) a
	// daemon serves.
	maxProbeClients = 512
	// maxProbesPerAddress bounds the connections from one address, so that
	// one client cannot take every slot: it would need 128 addresses.
	// Probes from one address measure one path (`gpupool run` opens one per
	// command), so a few carry all there is to measure.
	maxProbesPerAddress = 4
	// forgetAfter is how long a gone client node's series stays.
	forgetAfter = 10 * time.Minute
)

// ServeProbes answers clients' latency probes on ln and records the round
// trips the server measures, until ctx ends.
//
// A client node's series is dropped forgetAfter its last connection ended
// (long enough for Prometheus to scrape its last counts), so nodes that
// come and go do not pile up series.
func ServeProbes(ctx context.Context, ln net.Listener, server string, interval time.Duration, hist *prometheus.HistogramVec, log *slog.Logger) {
	go func() { <-ctx.Done(); _ = ln.Close() }()
	var mu sync.Mutex
	conns := map[string]int{}   // connections per client node
	perAddr := map[string]int{} // connections per remote address
	total := 0
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("accepting probes", "err", err)
			time.Sleep(100 * time.Millisecond) // e.g. out of file descriptors
			continue
		}
		// A slot is taken from the connection on, so that connections
		// that never say hello count too.
		addr := remoteHost(conn)
		mu.Lock()
		full := total >= maxProbeClients || perAddr[addr] >= maxProbesPerAddress
		if !full {
			total++
			perAddr[addr]++
		}
		mu.Unlock()
		if full {
			log.Debug("probe refused: no slot", "remote", conn.RemoteAddr())
			_ = conn.Close()
			continue
		}
		go func() {
			defer func() {
				mu.Lock()
				defer mu.Unlock()
				total--
				if perAddr[addr]--; perAddr[addr] == 0 {
					delete(perAddr, addr)
				}
			}()
			// A socket's deadline is real time, whatever the daemon's clock.
			_ = conn.SetReadDeadline(time.Now().Add(time.Duration(helloTimeout.Load())))
			node, err := gpuapi.ReadProbeHello(conn)
			if err != nil {
				log.Debug("probe refused", "remote", conn.RemoteAddr(), "err", err)
				_ = conn.Close()
				return
			}
			mu.Lock()
			conns[node]++
			mu.Unlock()
			defer func() {
				mu.Lock()
				defer mu.Unlock()
				if conns[node]--; conns[node] == 0 {
					time.AfterFunc(forgetAfter, func() {
						mu.Lock()
						defer mu.Unlock()
						if conns[node] == 0 {
							delete(conns, node)
							hist.DeleteLabelValues(server, node, gpuapi.TransportTCP)
						}
					})
				}
			}()
			_ = conn.SetReadDeadline(time.Time{})
			obs := hist.WithLabelValues(server, node, gpuapi.TransportTCP)
			if err := gpuapi.Probe(ctx, conn, interval, func(d time.Duration) { obs.Observe(d.Seconds()) }); err != nil {
				log.Debug("probe ended", "client_node", node, "err", err)
			}
		}()
	}
}

// helloTimeout is how long a probe connection may hold its slot before it
// says hello (a time.Duration); a variable so that tests need not race it.
var helloTimeout atomic.Int64

func init() { helloTimeout.Store(int64(5 * time.Second)) }

// remoteHost is a connection's remote address without the port.
func remoteHost(c net.Conn) string {
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}
