// Command gpupool-allocator serves the GPU pool's allocator over HTTP.
package main

import (
	"context"
	"crypto/tls"
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
	listen := fs.String("listen", "127.0.0.1:8470", "address to serve the API and /metrics on; off loopback it needs --tls-cert-file (or --insecure-http)")
	certFile := fs.String("tls-cert-file", "", "serving certificate (PEM) for HTTPS; read again when it changes, as when cert-manager renews it")
	keyFile := fs.String("tls-private-key-file", "", "the certificate's private key (PEM)")
	insecureHTTP := fs.Bool("insecure-http", false, "serve plain HTTP on a --listen address off loopback: every client's bearer token then crosses the network in clear text")
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
	maxWaiting := fs.Int("max-waiting", service.DefaultMaxWaiting, "most acquisitions queued at once for capacity or quota (\"wait\"); past it one is refused with 429")
	maxWaitingPerNamespace := fs.Int("max-waiting-per-namespace", service.DefaultMaxWaitingPerNamespace, "most acquisitions of one namespace queued at once; past it one is refused with 429")
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
		if warning := cli.PrivateFileWarning(*configFile); warning != "" {
			log.Warn(warning)
		}
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
	tlsConfig, err := httpserver.ServingTLS(*listen, *certFile, *keyFile, *insecureHTTP, log)
	if err != nil {
		log.Error("bad flag", "err", err)
		return cli.ExitUsage
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("listening", "err", err)
		return 1
	}
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
		ln = tls.NewListener(ln, tlsConfig)
	}
	srv := httpserver.New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*current.Load()).ServeHTTP(w, r) }), httpserver.Default)
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving", "err", err)
			stop()
		}
	}()
	// Said once the store opened sound: until then the address answers
	// 503, and a refused store ends the process without it.
	serving := func() {
		log.Info("allocator serving", "address", scheme+"://"+ln.Addr().String(), "store", *storeKind, "policy", *policy)
	}
	// Stop taking requests and finish those in flight before the service
	// and the store close (and an etcd leader resigns).
	drain := func() {
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}
	defer drain()
	finish := func(st store.Store, code int) int {
		drain()
		_ = st.Close()
		return code
	}
	term := leadership{
		cfg: service.Config{Policy: *policy, DefaultTTL: *defaultTTL, MaxTTL: *maxTTL,
			HeartbeatTimeout: *heartbeatTimeout, MaxWaiting: *maxWaiting, MaxWaitingPerNamespace: *maxWaitingPerNamespace,
			Quotas: quotas, Registry: reg, Logger: log},
		auth: auth, gatherer: reg, tick: *tick, log: log, leader: leader, current: &current, standby: standby, drain: drain,
	}
	switch *storeKind {
	case "bolt":
		b, err := store.OpenBolt(*dataDir, 10*time.Second)
		if err != nil {
			log.Error("opening the store", "err", err)
			return 1
		}
		serving()
		if err := term.serve(ctx, b, nil); err != nil {
			return finish(b, 1)
		}
		return finish(b, 0)
	case "etcd":
		e, err := store.OpenEtcd(ctx, strings.Split(*etcdEndpoints, ","), *etcdPrefix, *sessionTTL)
		if err != nil {
			log.Error("opening the store", "err", err)
			return 1
		}
		serving()
		host, _ := os.Hostname()
		id := fmt.Sprintf("%s/%d/%s", host, os.Getpid(), ln.Addr())
		for ctx.Err() == nil {
			log.Info("standing by for leadership", "etcd", *etcdEndpoints)
			if err := e.Campaign(ctx, id); err != nil {
				if ctx.Err() == nil {
					log.Error("campaigning for leadership; trying again", "err", err)
					sleep(ctx, time.Second)
				}
				continue
			}
			log.Info("leading")
			if err := term.serve(ctx, e, e.Lost()); err != nil && ctx.Err() == nil {
				// Whatever ended the term, the next one starts from what
				// etcd holds: this replica's memory may be behind it.
				log.Error("stepping down; campaigning again", "err", err)
				_ = e.StepDown()
				sleep(ctx, time.Second)
			}
		}
		return finish(e, 0)
	default:
		log.Error("bad flag", "err", fmt.Sprintf("--store %q is not one of bolt, etcd", *storeKind))
		return cli.ExitUsage
	}
}

// leadership serves the API while this replica leads: from a service
// recovered from the store to the end of the term.
type leadership struct {
	cfg      service.Config
	auth     *service.Authenticator
	gatherer prometheus.Gatherer
	tick     time.Duration
	log      *slog.Logger
	leader   prometheus.Gauge
	current  *atomic.Pointer[http.Handler]
	standby  http.Handler
	// drain stops the HTTP server once its requests are answered.
	drain func()
}

// errLostLeadership ends a term whose etcd session ended.
var errLostLeadership = errors.New("lost leadership (etcd session ended)")

// serve recovers a service from st and serves it until ctx ends (nil),
// the store fails or lost is closed (why). Then the standby answer is
// back, and the service is closed: requests it had not made durable are
// told to try again, elsewhere.
func (l *leadership) serve(ctx context.Context, st store.Store, lost <-chan struct{}) error {
	cfg := l.cfg
	cfg.Store = st
	svc, err := service.New(ctx, cfg)
	if err != nil {
		l.log.Error("starting the allocator", "err", err)
		return err
	}
	termCtx, endTerm := context.WithCancel(ctx)
	defer endTerm()
	go svc.Run(termCtx, l.tick)
	serving := service.Handler(svc, l.auth, l.gatherer, l.log)
	l.current.Store(&serving)
	l.leader.Set(1)
	l.log.Info("allocator ready", "store", st.Name())

	select {
	case <-ctx.Done():
		l.drain() // the requests in flight are answered before the service closes
	case <-svc.Failed():
		err = errors.New("the service failed (its log says why)")
	case <-lost:
		err = errLostLeadership
	}
	l.leader.Set(0)
	l.current.Store(&l.standby)
	svc.Close()
	return err
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
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
