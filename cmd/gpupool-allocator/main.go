// Command gpupool-allocator serves the GPU pool's allocator over HTTP.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/service"
	"github.com/gpupool/gpupool/allocator/store"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/httpserver"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpupool-allocator", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8470", "address to serve the API and /metrics on")
	storeKind := fs.String("store", "bolt", "where state lives: bolt (embedded, one file in --data-dir) or etcd (replicas with leader election)")
	dataDir := fs.String("data-dir", "gpupool-data", "directory of the embedded store (one bbolt file)")
	etcdEndpoints := fs.String("etcd-endpoints", "http://127.0.0.1:2379", "etcd endpoints, comma-separated (--store etcd)")
	etcdPrefix := fs.String("etcd-prefix", "/gpupool", "key prefix in etcd (--store etcd)")
	sessionTTL := fs.Duration("etcd-session-ttl", 5*time.Second, "how long after a leader dies a standby takes over (--store etcd)")
	configFile := fs.String("config", "", "config file with namespace quotas and bearer tokens; without one, no quotas and NO AUTHENTICATION (loopback demos only)")
	policy := fs.String("policy", "fgd-cpu", "placement policy: "+strings.Join(allocator.PolicyNames(), ", "))
	defaultTTL := fs.Duration("default-ttl", 30*time.Second, "lifetime of a lease whose request names none")
	maxTTL := fs.Duration("max-ttl", time.Hour, "longest lease lifetime a request may ask for")
	heartbeatTimeout := fs.Duration("heartbeat-timeout", 15*time.Second, "silence after which a server's GPUs take no new leases")
	tick := fs.Duration("tick", time.Second, "how often leases are expired and heartbeats checked")
	check := fs.Bool("check", false, "verify the store (--store, --data-dir or --etcd-*) without changing it, print what it holds, and exit: 0 sound, 1 damaged or inconsistent")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: gpupool-allocator [flags]

Serves the GPU pool's allocator: GPU servers register and heart-beat, clients
acquire, renew and release leases on whole or fractional GPUs, within
namespace quotas. Every grant and release is durable (fsync) before it is
acknowledged; on start the state is recovered and leases that expired while
the allocator was down are ended. /metrics serves the pool's state.

A damaged store file is never replaced by an empty one: the allocator
refuses to start and says how to restore it or move it aside. Verify a store
(a backup, or the live one while the allocator is stopped) with

  gpupool-allocator --check --data-dir /var/lib/gpupool

Flags:
`)
		fs.PrintDefaults()
	}
	if exit, ok := cli.Parse(fs, args, stdout, stderr); !ok {
		return exit
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if *check {
		return checkStore(*storeKind, *dataDir, strings.Split(*etcdEndpoints, ","), *etcdPrefix, *sessionTTL, stdout, stderr)
	}

	var auth *service.Authenticator
	quotas := map[string]allocator.Share{}
	if *configFile != "" {
		cfg, err := service.LoadConfig(*configFile)
		if err != nil {
			log.Error("bad config", "err", err)
			return cli.ExitUsage
		}
		auth, quotas = service.NewAuthenticator(cfg), cfg.Quotas()
	} else {
		log.Warn("no --config: authentication is OFF and namespaces have no quota; serve on loopback only")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	reg := prometheus.NewRegistry()
	leaders := service.LeaderFamily.NewGaugeVec()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), leaders)
	leader := leaders.WithLabelValues()

	// Until this replica leads, it answers 503 so clients try the others.
	var current atomic.Pointer[http.Handler]
	standby := service.StandbyHandler(reg, log)
	current.Store(&standby)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("listening", "err", err)
		return 1
	}
	srv := httpserver.New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*current.Load()).ServeHTTP(w, r) }), httpserver.Default)
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving", "err", err)
			stop()
		}
	}()
	log.Info("allocator serving", "address", "http://"+ln.Addr().String(), "store", *storeKind, "policy", *policy)
	defer func() {
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()

	var st store.Store
	var lost <-chan struct{}
	switch *storeKind {
	case "bolt":
		b, err := store.OpenBolt(*dataDir, 10*time.Second)
		if err != nil {
			log.Error("opening the store", "err", err)
			return 1
		}
		st = b
	case "etcd":
		e, err := store.OpenEtcd(ctx, strings.Split(*etcdEndpoints, ","), *etcdPrefix, *sessionTTL)
		if err != nil {
			log.Error("opening the store", "err", err)
			return 1
		}
		st, lost = e, e.Lost()
		host, _ := os.Hostname()
		log.Info("standing by for leadership", "etcd", *etcdEndpoints)
		if err := e.Campaign(ctx, fmt.Sprintf("%s/%d/%s", host, os.Getpid(), ln.Addr())); err != nil {
			_ = st.Close()
			if ctx.Err() != nil {
				return 0
			}
			log.Error("campaigning for leadership", "err", err)
			return 1
		}
		log.Info("leading")
	default:
		log.Error("bad flag", "err", fmt.Sprintf("--store %q is not one of bolt, etcd", *storeKind))
		return cli.ExitUsage
	}
	svc, err := service.New(ctx, service.Config{
		Store: st, Policy: *policy, DefaultTTL: *defaultTTL, MaxTTL: *maxTTL,
		HeartbeatTimeout: *heartbeatTimeout, Quotas: quotas, Registry: reg, Logger: log,
	})
	if err != nil {
		_ = st.Close()
		log.Error("starting the allocator", "err", err)
		return 1
	}
	go svc.Run(ctx, *tick)
	serving := service.Handler(svc, auth, reg, log)
	current.Store(&serving)
	leader.Set(1)
	log.Info("allocator ready", "store", st.Name())

	code := 0
	select {
	case <-ctx.Done():
	case <-svc.Failed():
		code = 1
	case <-lost:
		log.Error("lost leadership (etcd session ended); exiting so a standby serves")
		code = 1
	}
	// Stop taking requests and finish those in flight before the store
	// closes (and an etcd leader resigns).
	leader.Set(0)
	current.Store(&standby)
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	_ = st.Close()
	return code
}

// checkStore loads a store without changing it, restores what it holds
// into a scratch pool as a starting allocator would, and says what it found.
func checkStore(kind, dataDir string, endpoints []string, prefix string, sessionTTL time.Duration, stdout, stderr io.Writer) int {
	var (
		st    store.State
		where string
		err   error
	)
	switch kind {
	case "bolt":
		where = dataDir
		st, err = store.CheckBolt(dataDir, time.Second)
	case "etcd":
		where = strings.Join(endpoints, ",") + prefix
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var e *store.Etcd
		if e, err = store.OpenEtcd(ctx, endpoints, prefix, sessionTTL); err == nil {
			st, err = e.Load(ctx)
			_ = e.Close()
		}
	default:
		fmt.Fprintf(stderr, "gpupool-allocator: --store %q is not one of bolt, etcd\n", kind)
		return cli.ExitUsage
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpupool-allocator: store %s: %v\n", where, err)
		return 1
	}
	report, err := service.CheckState(st, time.Now())
	if err != nil {
		fmt.Fprintf(stderr, "gpupool-allocator: store %s: %v\n", where, err)
		return 1
	}
	for _, m := range report.Misfits {
		fmt.Fprintf(stderr, "gpupool-allocator: store %s: lease %s does not fit its server: %v\n", where, m.ID, m.Err)
	}
	fmt.Fprintf(stdout, "store %s: %d servers, %d leases (%d expired: a start would end them), next lease ID %d\n",
		where, report.Servers, report.Leases, report.Expired, report.NextID+1)
	if len(report.Misfits) > 0 {
		fmt.Fprintf(stdout, "inconsistent: %d leases would be dropped on start\n", len(report.Misfits))
		return 1
	}
	fmt.Fprintln(stdout, "ok")
	return 0
}
