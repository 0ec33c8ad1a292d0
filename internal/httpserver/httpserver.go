// Package httpserver builds the project's HTTP servers with timeouts, so
// that a client that sends slowly, or opens connections and leaves them
// idle, cannot hold a server's connections and goroutines forever.
package httpserver

import (
	"net/http"
	"time"
)

// Timeouts bound each phase of a connection's life.
type Timeouts struct {
	// ReadHeader bounds reading a request's headers.
	ReadHeader time.Duration
	// Read bounds reading a whole request, body included.
	Read time.Duration
	// Write bounds the handler and writing its answer, from the end of the
	// headers. A handler that must take longer (a long poll) extends its
	// own with http.ResponseController.SetWriteDeadline.
	Write time.Duration
	// Idle bounds how long a keep-alive connection waits for its next
	// request.
	Idle time.Duration
}

// Default suits the project's servers: requests are small (the largest, a
// server registering 64 GPUs, is a few KiB and at most 1 MiB: 10 s to read
// is 100 KiB/s), and a scrape of the largest /metrics renders in
// milliseconds, so a minute to answer is generous even for a client on a
// slow link, and Prometheus's scrape timeout (10 s by default) ends first.
var Default = Timeouts{ReadHeader: 5 * time.Second, Read: 10 * time.Second, Write: time.Minute, Idle: 2 * time.Minute}

// New returns a server for h with the timeouts t.
func New(h http.Handler, t Timeouts) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read, WriteTimeout: t.Write, IdleTimeout: t.Idle}
}
