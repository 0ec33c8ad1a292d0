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
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/service"
	"github.com/gpupool/gpupool/allocator/store"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpupool-allocator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:8470", "address to serve the API and /metrics on")
	dataDir := fs.String("data-dir", "gpupool-data", "directory of the embedded store (one bbolt file)")
	configFile := fs.String("config", "", "config file with namespace quotas and bearer tokens; without one, no quotas and NO AUTHENTICATION (loopback demos only)")
	policy := fs.String("policy", "fgd-cpu", "placement policy: "+strings.Join(allocator.PolicyNames(), ", "))
	defaultTTL := fs.Duration("default-ttl", 30*time.Second, "lifetime of a lease whose request names none")
	maxTTL := fs.Duration("max-ttl", time.Hour, "longest lease lifetime a request may ask for")
	heartbeatTimeout := fs.Duration("heartbeat-timeout", 15*time.Second, "silence after which a server's GPUs take no new leases")
	tick := fs.Duration("tick", time.Second, "how often leases are expired and heartbeats checked")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: gpupool-allocator [flags]

Serves the GPU pool's allocator: GPU servers register and heart-beat, clients
acquire, renew and release leases on whole or fractional GPUs, within
namespace quotas. Every grant and release is durable (fsync) before it is
acknowledged; on start the state is recovered and leases that expired while
the allocator was down are ended. /metrics serves the pool's state.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))

	var auth *service.Authenticator
	quotas := map[string]int64{}
	if *configFile != "" {
		cfg, err := service.LoadConfig(*configFile)
		if err != nil {
			log.Error("bad config", "err", err)
			return 2
		}
		auth, quotas = service.NewAuthenticator(cfg), cfg.Quotas()
	} else {
		log.Warn("no --config: authentication is OFF and namespaces have no quota; serve on loopback only")
	}

	st, err := store.OpenBolt(*dataDir, 10*time.Second)
	if err != nil {
		log.Error("opening the store", "err", err)
		return 1
	}
	defer st.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	svc, err := service.New(ctx, service.Config{
		Store: st, Policy: *policy, DefaultTTL: *defaultTTL, MaxTTL: *maxTTL,
		HeartbeatTimeout: *heartbeatTimeout, Quotas: quotas, Registry: reg, Logger: log,
	})
	if err != nil {
		log.Error("starting the allocator", "err", err)
		return 1
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("listening", "err", err)
		return 1
	}
	srv := &http.Server{Handler: service.Handler(svc, auth, reg, log), ReadHeaderTimeout: 10 * time.Second}
	go svc.Run(ctx, *tick)
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving", "err", err)
			stop()
		}
	}()
	log.Info("allocator serving", "address", "http://"+ln.Addr().String(), "store", st.Name(), "data_dir", *dataDir, "policy", *policy)

	code := 0
	select {
	case <-ctx.Done():
	case <-svc.Failed():
		code = 1
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	return code
}
