// Package servicetest runs a real allocator for other packages' tests as it
// is deployed: the service on a bolt store behind its HTTP API, with
// tokens on, so that what a test sees through the client is what a
// Kubernetes component sees in a cluster.
package servicetest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/allocator/service"
	"github.com/gpupool/gpupool/allocator/store"
)

// AdminToken is the allocator's admin token: every namespace, every
// operation, as the Kubernetes components hold it.
const AdminToken = "servicetest-admin-token"

// Allocator is a running allocator.
type Allocator struct {
	URL     string
	Service *service.Service

	t      testing.TB
	quotas map[string]allocator.Share
	dir    string
	srv    *httptest.Server
	st     *store.Bolt
}

// Start serves an allocator with the given namespace quotas until the test
// ends.
func Start(t testing.TB, quotas map[string]allocator.Share) *Allocator {
	t.Helper()
	a := &Allocator{t: t, quotas: quotas, dir: t.TempDir()}
	a.serve()
	t.Cleanup(a.Stop)
	return a
}

// serve recovers the allocator from its store and serves it, at its URL
// once it has one, so that clients made before find it again.
func (a *Allocator) serve() {
	a.t.Helper()
	st, err := store.OpenBolt(a.dir, time.Second)
	if err != nil {
		a.t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := prometheus.NewRegistry()
	svc, err := service.New(context.Background(), service.Config{
		Store: st, Policy: "best-fit", DefaultTTL: time.Minute, MaxTTL: time.Hour, HeartbeatTimeout: time.Hour,
		Quotas: a.quotas, Registry: reg, Logger: log,
	})
	if err != nil {
		a.t.Fatal(err)
	}
	auth := service.NewAuthenticator(&service.FileConfig{Admin: service.TokenSet{Tokens: []string{AdminToken}}})
	a.srv = httptest.NewUnstartedServer(service.Handler(svc, auth, reg, log))
	if a.URL != "" {
		l, err := net.Listen("tcp", strings.TrimPrefix(a.URL, "http://"))
		if err != nil {
			a.t.Fatal(err)
		}
		_ = a.srv.Listener.Close()
		a.srv.Listener = l
	}
	a.srv.Start()
	a.URL, a.Service, a.st = a.srv.URL, svc, st
}

// Stop stops the allocator as a crash leaves it: what it acknowledged is
// in its store, and its address refuses connections.
func (a *Allocator) Stop() {
	if a.srv != nil {
		a.srv.Close()
		_ = a.st.Close()
		a.srv = nil
	}
}

// Restart serves the stopped allocator again, recovered from its store,
// at the same URL.
func (a *Allocator) Restart() {
	a.t.Helper()
	a.serve()
}

// Client is an admin client that tries once: a test sees a failure as it
// happens.
func (a *Allocator) Client(t testing.TB) *client.Client {
	t.Helper()
	c, err := client.New([]string{a.URL}, AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	c.Retries = 1
	return c
}

// Server is a GPU server of gpus A100s of 80 GiB, with 16 cores and 64
// GiB of memory to give.
func Server(name string, gpus int) api.Server {
	s := api.Server{Name: name, CPUMilli: 16000, MemoryBytes: 64 << 30}
	for i := range gpus {
		s.GPUs = append(s.GPUs, api.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", name, i), Model: "A100", MemoryBytes: 80 << 30, Healthy: true})
	}
	return s
}

// registerers is how many servers Register registers at once: the
// allocator commits concurrent writes in one batch, and this many
// connections stay well within a test process's open files.
const registerers = 32

// Register registers the servers and fails the test on the first error.
func (a *Allocator) Register(t testing.TB, servers []api.Server) {
	t.Helper()
	c := a.Client(t)
	next := make(chan api.Server)
	errs := make(chan error, len(servers))
	var wg sync.WaitGroup
	for range registerers {
		wg.Go(func() {
			for s := range next {
				errs <- c.RegisterServer(context.Background(), s)
			}
		})
	}
	for _, s := range servers {
		next <- s
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}
