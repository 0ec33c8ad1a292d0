package httpserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// DrainTimeout is how long Serve lets requests in flight finish once it
// stops: kubelet's default grace period is 30 s, and no request of the
// project's servers takes as long as a third of it.
const DrainTimeout = 10 * time.Second

// Endpoint is a server on its listener; it serves TLS when the server's
// TLSConfig is set.
type Endpoint struct {
	// Name says what it serves ("extender", "metrics"), for the error
	// that ends it.
	Name     string
	Server   *http.Server
	Listener net.Listener
}

// Serve serves every endpoint and runs every task until ctx ends (nil) or
// one of them fails (its error); then it stops taking requests and lets
// those in flight finish for up to DrainTimeout. A task that returns nil
// before ctx ends is done, not failed.
func Serve(ctx context.Context, endpoints []Endpoint, tasks ...func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	failed := make(chan error, len(endpoints)+len(tasks)) // none waits to send
	for _, e := range endpoints {
		go func() {
			var err error
			if e.Server.TLSConfig != nil {
				err = e.Server.ServeTLS(e.Listener, "", "")
			} else {
				err = e.Server.Serve(e.Listener)
			}
			if !errors.Is(err, http.ErrServerClosed) {
				failed <- fmt.Errorf("serving %s on %s: %w", e.Name, e.Listener.Addr(), err)
			}
		}()
	}
	for _, task := range tasks {
		go func() {
			if err := task(ctx); err != nil && ctx.Err() == nil {
				failed <- err
			}
		}()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-failed:
	}
	cancel()
	shutdown, done := context.WithTimeout(context.WithoutCancel(ctx), DrainTimeout)
	defer done()
	for _, e := range endpoints {
		_ = e.Server.Shutdown(shutdown)
	}
	return err
}

// Scheme is "https" for a server that serves TLS, else "http".
func Scheme(s *http.Server) string {
	if s.TLSConfig != nil {
		return "https"
	}
	return "http"
}
