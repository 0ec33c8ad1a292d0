// Package app is gpupool-load: it plays many GPU servers and clients
// against a running allocator (and adapter) to measure how it holds up.
package app

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/internal/httpserver"
)

// Usage is what gpupool-load --help says above the flags.
const Usage = `Usage: gpupool-load [flags]

Plays --servers GPU servers and --leases clients against a running allocator
for --duration. Each server registers, heart-beats every --heartbeat and lists
its leases after each heartbeat, as gpupool-server does, and serves simulated
usage (GET /v1/usage) on --usage-listen for the adapter's direct backend. Each
client acquires a lease of one GPU at --percent, renews it every third of
--ttl as gpupool run does, and releases it at the end (unless --keep). The
tokens are those of --pool-config, the allocator's own config: the servers
token for the servers, each namespace's token for its clients.

Every --progress it prints a line; at the end a summary: call latencies
(p50/p99, as measured here), errors by call and reason, live leases, the
allocator's /metrics size and scrape time, its CPU seconds per second and
resident memory (with --allocator-pid), and the adapter's answer time for the
first group of leases (with --adapter). Exits 1 when any call failed.
`

// Run plays the load until --duration is over or ctx ends, printing
// progress, then the summary, which it also writes to --summary-json. It
// returns cli.ErrReported when a call failed: the summary counts them.
func Run(ctx context.Context, o *Options, stdout io.Writer) error {
	s, err := runLoad(ctx, o, stdout)
	if err != nil {
		return err
	}
	s.write(stdout)
	if o.SummaryJSON != "" {
		b, _ := json.MarshalIndent(s, "", "  ")
		if err := os.WriteFile(o.SummaryJSON, append(b, '\n'), 0o600); err != nil {
			return fmt.Errorf("--summary-json: %w", err)
		}
	}
	if len(s.Errors) > 0 {
		return cli.ErrReported
	}
	return nil
}

// newClient is a client that fails a call at once rather than retrying it
// for seconds, so that every failure is counted.
func newClient(url, caFile, token string) (*client.Client, error) {
	c, err := client.New([]string{url}, token)
	if err != nil {
		return nil, fmt.Errorf("--allocator: %w", err)
	}
	if err := c.TrustCAFile(caFile); err != nil {
		return nil, fmt.Errorf("--allocator-ca-file: %w", err)
	}
	c.Retries = 1
	return c, nil
}

// runLoad runs the servers and the clients until the duration is over or
// ctx ends, printing progress, and returns the summary.
func runLoad(ctx context.Context, o *Options, stdout io.Writer) (*summary, error) {
	serversClient, err := newClient(o.Allocator, o.AllocatorCA, o.tokens.servers)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", o.UsageListen)
	if err != nil {
		return nil, fmt.Errorf("--usage-listen: %w", err)
	}
	var st stats
	servers := map[string]*simServer{}
	var order []*simServer
	for i := range o.Servers {
		name := fmt.Sprintf("%s%05d", o.NamePrefix, i)
		s := newSimServer(name, o.GPUsPerServer, "http://"+ln.Addr().String()+"/servers/"+name)
		servers[name] = s
		order = append(order, s)
	}
	usageSrv := httpserver.New(usageHandler(servers, &st.servers), httpserver.Default)
	go func() { _ = usageSrv.Serve(ln) }()
	defer func() { _ = usageSrv.Close() }()

	holders, err := newHolders(o)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "gpupool-load: %d servers (%d GPUs), %d leases of %d%% in %d namespaces, for %s against %s\n",
		o.Servers, o.Servers*o.GPUsPerServer, o.Leases, o.Percent, min(len(o.tokens.namespaces), (o.Leases+o.Group-1)/o.Group), o.Duration, o.Allocator)
	runCtx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	w := newWatcher(o, &st, stdout)
	if o.Leases > 0 {
		w.adapterQuery = adapterQuery{base: o.Adapter, namespace: holders[0].namespace, selector: groupLabel + "=" + holders[0].group, insecure: o.AdapterInsecure}
	}
	done := make(chan struct{})
	go func() { w.watch(runCtx); close(done) }()
	start := time.Now()
	st.run(runCtx, o, order, serversClient, holders)
	<-done
	return w.summarize(o, time.Since(start)), nil
}

// newHolders are the clients, in groups of --group leases that take the
// namespaces in turn, one allocator client for each namespace.
func newHolders(o *Options) ([]*holder, error) {
	holders := make([]*holder, o.Leases)
	clients := map[string]*client.Client{}
	for i := range holders {
		g := i / o.Group
		nt := o.tokens.namespaces[g%len(o.tokens.namespaces)]
		if clients[nt.namespace] == nil {
			var err error
			if clients[nt.namespace], err = newClient(o.Allocator, o.AllocatorCA, nt.token); err != nil {
				return nil, err
			}
		}
		holders[i] = &holder{client: clients[nt.namespace], namespace: nt.namespace, group: fmt.Sprintf("load-%d", g), index: i}
	}
	return holders, nil
}

// stats are everything the run counts.
type stats struct {
	servers serverStats
	clients clientStats
	errors  errorCounts
	// liveAtEnd is the live leases when the duration ended, before any
	// release.
	liveAtEnd int64
}

// run starts the servers, then, once they all registered, the clients, and
// waits for them all after ctx ends.
func (st *stats) run(ctx context.Context, o *Options, servers []*simServer, c *client.Client, holders []*holder) {
	registering := make(chan struct{}, o.Concurrency)
	done := make(chan struct{}, len(servers)+len(holders))
	var registrations sync.WaitGroup
	for _, s := range servers {
		registrations.Add(1)
		go func() {
			defer func() { done <- struct{}{} }()
			registering <- struct{}{}
			ok := s.register(ctx, c, &st.servers, &st.errors)
			<-registering
			registrations.Done()
			if ok {
				s.beat(ctx, c, o.Heartbeat, &st.servers, &st.errors)
			}
		}()
	}
	registered := make(chan struct{})
	go func() { registrations.Wait(); close(registered) }()
	select {
	case <-registered:
	case <-ctx.Done():
	}
	acquiring := make(chan struct{}, o.Concurrency)
	for _, h := range holders {
		go func() {
			defer func() { done <- struct{}{} }()
			h.hold(ctx, o, acquiring, &st.clients, &st.errors)
		}()
	}
	<-ctx.Done()
	st.liveAtEnd = st.clients.live.Load()
	for range len(servers) + len(holders) {
		<-done
	}
}

// adapterClient is the HTTP client of the adapter's API.
func adapterClient(insecure bool) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{InsecureSkipVerify: insecure} //nolint:gosec // only with --adapter-insecure, for a self-signed loopback adapter
	return &http.Client{Transport: t, Timeout: 10 * time.Second}
}

// Main is gpupool-load's main. Interrupted, the load still releases its
// leases and sums up.
func Main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	exit := Exec(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(exit)
}

// Exec runs gpupool-load's command line on args until done or ctx ends,
// and returns its exit status.
func Exec(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o := NewOptions()
	return cli.RunTool(ctx, cli.Tool{Name: "gpupool-load", Usage: Usage, Options: o,
		Run: func(ctx context.Context, stdout, _ io.Writer) error { return Run(ctx, o, stdout) }}, args, stdout, stderr)
}
