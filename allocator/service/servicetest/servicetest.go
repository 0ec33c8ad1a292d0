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
	"net/http/httptest"
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
}

// Start serves an allocator with the given namespace quotas until the test
// ends.
func Start(t testing.TB, quotas map[string]allocator.Share) *Allocator {
	t.Helper()
	st, err := store.OpenBolt(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := prometheus.NewRegistry()
	svc, err := service.New(context.Background(), service.Config{
		Store: st, Policy: "best-fit", DefaultTTL: time.Minute, MaxTTL: time.Hour, HeartbeatTimeout: time.Hour,
		Quotas: quotas, Registry: reg, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	auth := service.NewAuthenticator(&service.FileConfig{Admin: service.TokenSet{Tokens: []string{AdminToken}}})
	srv := httptest.NewServer(service.Handler(svc, auth, reg, log))
	t.Cleanup(func() { srv.Close(); _ = st.Close() })
	return &Allocator{URL: srv.URL, Service: svc}
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
