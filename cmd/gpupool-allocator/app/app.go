// Package app runs gpupool-allocator from its Options: the allocator's
// service (allocator/service) on its store, over HTTP, as the leader of its
// replicas or standing by; or, with --check, a check of the store (Check).
package app

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/gpupool/gpupool/allocator/service"
	"github.com/gpupool/gpupool/allocator/store"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/httpserver"
	"github.com/gpupool/gpupool/internal/metricdef"
)

// Usage is what --help says above the flags.
const Usage = `Usage: gpupool-allocator [flags]

Serves the GPU pool's allocator: GPU servers register and heart-beat, clients
acquire, renew and release leases on whole or fractional GPUs, within
namespace quotas. Every grant and release is durable (fsync) before it is
acknowledged; on start the state is recovered and leases that expired while
the allocator was down are ended. /metrics serves the pool's state.

A damaged store file is never replaced by an empty one: the allocator
refuses to start and says how to restore it or move it aside. Verify a store
(a backup, or the live one while the allocator is stopped) with

  gpupool-allocator --check --data-dir /var/lib/gpupool
`

// Run serves the allocator until ctx ends or serving fails: the API
// (with /metrics) while this replica leads, which on bolt is from the
// moment the store opens, and 503 while it stands by.
func Run(ctx context.Context, o *Options, log *slog.Logger) error {
	cfg, err := loadConfig(o.ConfigFile, log)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	var auth *service.Authenticator // nil: open
	if cfg != nil {
		auth = service.NewAuthenticator(cfg)
	}
	tlsConfig, err := httpserver.ServingTLS(o.listenAddress(), o.CertFile, o.KeyFile, o.InsecureHTTP, log)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	reg := metricdef.NewProcessRegistry()
	api := httpserver.Endpoint{Name: "the API", Server: httpserver.New(nil, httpserver.Default)}
	term, err := service.NewLeadership(service.LeadershipConfig{
		Service: service.Config{Policy: o.Policy, Seed: o.Seed, DefaultTTL: o.DefaultTTL, MaxTTL: o.MaxTTL,
			HeartbeatTimeout: o.HeartbeatTimeout, MaxWaiting: o.MaxWaiting, MaxWaitingPerNamespace: o.MaxWaitingPerNamespace,
			Quotas: cfg.Quotas(), IdlePolicies: cfg.IdlePolicies(), Registry: reg, Logger: log},
		Auth: auth, Gatherer: reg, Tick: o.Tick, Drain: func() { drain(api.Server) }})
	if err != nil {
		return err
	}
	api.Server.Handler = term
	if api.Listener, err = httpserver.Listen(o.Listener, o.Listen); err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	r := &replica{o: o, term: term, log: log, addr: api.Listener.Addr(), scheme: "http"}
	if tlsConfig != nil {
		// A TLS listener rather than the server's TLSConfig, as the API
		// has always been served: ServeTLS would add HTTP/2.
		r.scheme, api.Listener = "https", tls.NewListener(api.Listener, tlsConfig)
	}
	// Serve drains the API when it stops; the store closes only once the
	// terms on it have ended (and an etcd leader resigned).
	stopped := make(chan struct{})
	err = httpserver.Serve(ctx, []httpserver.Endpoint{api}, func(ctx context.Context) error {
		defer close(stopped)
		return r.serveStore(ctx)
	})
	<-stopped
	return err
}

// loadConfig reads the tokens, quotas and idle policies of --config.
// Without one, every request acts as admin (NewAuthenticator(nil)), no
// namespace has a quota and every namespace has the default idle policy.
func loadConfig(path string, log *slog.Logger) (*service.FileConfig, error) {
	if path == "" {
		log.Warn("no --config: authentication is OFF and namespaces have no quota; serve on loopback only")
		return nil, nil
	}
	cfg, err := service.LoadConfig(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	if warning := cli.PrivateFileWarning(path); warning != "" {
		log.Warn(warning)
	}
	return cfg, nil
}

// drain stops srv taking requests and lets those in flight finish.
func drain(srv *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), httpserver.DrainTimeout)
	defer cancel()
	_ = srv.Shutdown(ctx)
}

// replica is this allocator process: its terms and where it serves them.
type replica struct {
	o      *Options
	term   *service.Leadership
	log    *slog.Logger
	addr   net.Addr
	scheme string
}

// serveStore opens the store and serves the allocator's terms on it until
// ctx ends: one term on bolt, a term each time this replica is elected on
// etcd. Until the store opens the API answers 503, and a store that does
// not open ends the process before "allocator serving" is said.
func (r *replica) serveStore(ctx context.Context) error {
	serving := func() {
		r.log.Info("allocator serving", "address", r.scheme+"://"+r.addr.String(), "store", r.o.Store, "policy", r.o.Policy)
	}
	if r.o.Store == "bolt" {
		b, err := store.OpenBolt(r.o.DataDir, 10*time.Second)
		if err != nil {
			return fmt.Errorf("opening the store: %w", err)
		}
		defer func() { _ = b.Close() }()
		serving()
		return r.term.Serve(ctx, b, nil)
	}
	e, err := store.OpenEtcd(ctx, r.o.etcdEndpoints(), r.o.EtcdPrefix, r.o.EtcdSessionTTL)
	if err != nil {
		return fmt.Errorf("opening the store: %w", err)
	}
	defer func() { _ = e.Close() }()
	serving()
	host, _ := os.Hostname()
	r.term.ServeTerms(ctx, service.Election{Elector: e, ID: fmt.Sprintf("%s/%d/%s", host, os.Getpid(), r.addr), Endpoints: r.o.EtcdEndpoints})
	return nil
}

// Command is gpupool-allocator's command line: its options, and Run on them.
func Command() cli.Service {
	o := NewOptions()
	return cli.Service{Name: "gpupool-allocator", Usage: Usage, Options: o,
		OneShot: func(stdout, stderr io.Writer) (int, bool) { return Check(o, stdout, stderr) },
		Run:     func(ctx context.Context, log *slog.Logger) error { return Run(ctx, o, log) }}
}
