package e2e

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/procstat"
	"github.com/gpupool/gpupool/internal/soak"
)

// soakServers are the demo's simulated GPU servers (cmd/gpupool-demo's
// demoServers), each a gpupool-server here, and soakQuotas its namespace
// quotas, in percent of one GPU.
var (
	soakServers = []struct{ name, gpus string }{{"sim-h100-0", "H100:80Gi:8"}, {"sim-a100-0", "A100:40Gi:4"}, {"sim-t4-0", "T4:16Gi:4"}}
	soakQuotas  = map[string]int64{"ml": 400, "team-b": 300}
)

// The soak's goals: resident memory limits, and how far past the
// baseline's highest value a later sample may go before it counts as
// growth.
const (
	soakDaemonMaxRSS   = 30 << 20
	soakAdapterMaxRSS  = 40 << 20
	soakTolerance      = 0.10
	soakGoroutineSlack = 5
	// soakLeaseTTL is the lifetime of the churn's leases: the ones left
	// alone expire after it.
	soakLeaseTTL = 15 * time.Second
	// soakQueryEvery is the adapter's query rate, an HPA's poll many times over.
	soakQueryEvery = 100 * time.Millisecond
)

// soakSettings are the soak's environment: SOAK_DURATION (the test runs
// only where it is set), SOAK_EVERY between samples, SOAK_BASELINE the
// start whose range later samples are judged by, SOAK_RESTART_EVERY
// between GPU-server restarts, SOAK_OUT where the CSV, the PNG and the
// verdicts go.
type soakSettings struct {
	duration, every, baseline, restartEvery time.Duration
	out                                     string
}

func soakSettingsFromEnv(t *testing.T) soakSettings {
	t.Helper()
	if os.Getenv("SOAK_DURATION") == "" {
		t.Skip("SOAK_DURATION is not set: `make soak` runs the soak")
	}
	s := soakSettings{out: os.Getenv("SOAK_OUT")}
	if s.out == "" {
		s.out = filepath.Join(os.TempDir(), "gpupool-soak")
	}
	for _, d := range []struct {
		env  string
		into *time.Duration
		def  time.Duration
	}{{"SOAK_DURATION", &s.duration, 0}, {"SOAK_EVERY", &s.every, time.Minute}, {"SOAK_BASELINE", &s.baseline, 10 * time.Minute},
		{"SOAK_RESTART_EVERY", &s.restartEvery, 3 * time.Minute}} {
		*d.into = d.def
		if v := os.Getenv(d.env); v != "" {
			var err error
			if *d.into, err = time.ParseDuration(v); err != nil || *d.into <= 0 {
				t.Fatalf("%s=%q: want a positive duration such as 1m", d.env, v)
			}
		}
	}
	if s.baseline >= s.duration {
		t.Fatalf("SOAK_BASELINE %v is not shorter than SOAK_DURATION %v: no sample would be judged", s.baseline, s.duration)
	}
	return s
}

// TestSoak runs the demo-sized pool, every part a real binary with tokens
// on as deployed, under churn for SOAK_DURATION: a lease acquired every
// second (some released soon, some renewed a while, some left to
// expire), a GPU server's daemon killed and started again every
// SOAK_RESTART_EVERY, the adapter queried 10 times a second. Every
// SOAK_EVERY it samples each process's resident memory and goroutines,
// and at the end writes them to SOAK_OUT (soak.csv, soak.png, verdicts.md)
// and fails where a process grew past its baseline or its limit.
func TestSoak(t *testing.T) {
	settings := soakSettingsFromEnv(t)
	if err := os.MkdirAll(settings.out, 0o755); err != nil {
		t.Fatal(err)
	}
	config := writePoolConfig(t, soakQuotas)
	a := startAllocator(t, "--data-dir", t.TempDir(), "--config", config.Path)
	logs := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("allocator:\n%s\ndaemons and adapter:\n%s", tail(a.logs.String(), 30), tail(logs.String(), 60))
		}
	})
	daemons := make([]*soakDaemon, len(soakServers))
	for i, s := range soakServers {
		addr := "127.0.0.1:" + freePort(t)
		daemons[i] = &soakDaemon{name: s.name, metrics: "http://" + addr + "/metrics", args: []string{"--allocator", a.URL, "--name", s.name,
			"--listen", addr, "--probe-listen", "127.0.0.1:0", "--simulate-gpus", s.gpus, "--seed", fmt.Sprint(i + 1),
			"--interval", "1s", "--process-every", "2", "--heartbeat", "2s"}}
		daemons[i].start(t, logs, config.Servers)
	}
	adapter := startAdapter(t, logs, a.URL, config.adminTokenFile(t))
	admin := newClient(t, a.URL, config.Admin)
	waitFor(t, func() bool {
		p, err := admin.Pool(context.Background())
		return err == nil && len(p.Servers) == len(soakServers)
	})

	ctx, stop := context.WithCancel(context.Background())
	var running sync.WaitGroup
	// Seeded, and the namespaces in order: every soak churns alike.
	churn := &leaseChurn{tenants: map[string]*client.Client{}, rng: rand.New(rand.NewPCG(1, 2)),
		namespaces: slices.Sorted(maps.Keys(soakQuotas))}
	for _, ns := range churn.namespaces {
		churn.tenants[ns] = newClient(t, a.URL, config.Tenant[ns])
	}
	queries := &adapterQueries{client: newAdapterClient(), api: adapter.API}
	running.Go(func() {
		everyUntilDone(ctx, time.Second, func(n int, now time.Time) { churn.step(ctx, n, now) })
	})
	running.Go(func() { everyUntilDone(ctx, soakQueryEvery, func(int, time.Time) { queries.query() }) })

	start := time.Now()
	sampleTick, restartTick := time.NewTicker(settings.every), time.NewTicker(settings.restartEvery)
	defer sampleTick.Stop()
	defer restartTick.Stop()
	var samples []soak.Sample
	restarts, end := 0, time.After(settings.duration)
soaking:
	for {
		select {
		case <-sampleTick.C:
			samples = append(samples, sampleSoak(t, time.Since(start), admin, a.cmd, a.URL+"/metrics", adapter, daemons)...)
		case <-restartTick.C:
			daemons[restarts%len(daemons)].restart(t, logs, config.Servers)
			restarts++
		case <-end:
			break soaking
		}
	}
	t.Logf("%d GPU-server restarts in %v", restarts, settings.duration)
	stop()
	running.Wait()
	t.Logf("leases: %s", churn)
	t.Logf("adapter: %s", queries)
	if queries.unanswered > queries.total/100 {
		t.Errorf("the adapter left %d of %d queries unanswered", queries.unanswered, queries.total)
	}
	judgeSoak(t, settings, samples)
}

// judgeSoak writes the samples and the verdicts to settings.out and
// fails the test for each goal missed.
func judgeSoak(t *testing.T, settings soakSettings, samples []soak.Sample) {
	t.Helper()
	goals := soak.Goals{Baseline: settings.baseline, Tolerance: soakTolerance, GoroutineSlack: soakGoroutineSlack,
		MaxRSS: map[string]int64{"adapter": soakAdapterMaxRSS}, GrowsWithLeases: "allocator"}
	for _, s := range soakServers {
		goals.MaxRSS[s.name] = soakDaemonMaxRSS
	}
	verdicts := soak.Judge(samples, goals)
	var report strings.Builder
	if err := soak.WriteReport(&report, verdicts); err != nil {
		t.Fatal(err)
	}
	t.Logf("over %v, sampled every %v, judged against the first %v (+%.0f%%, goroutines +%d at least):\n%s",
		settings.duration, settings.every, settings.baseline, 100*soakTolerance, soakGoroutineSlack, report.String())
	writeSoakFile(t, filepath.Join(settings.out, "verdicts.md"), func(f *os.File) error { _, err := f.WriteString(report.String()); return err })
	writeSoakFile(t, filepath.Join(settings.out, "soak.csv"), func(f *os.File) error { return soak.WriteCSV(f, samples) })
	writeSoakFile(t, filepath.Join(settings.out, "soak.png"), func(f *os.File) error { return soak.Plot(f, samples) })
	t.Logf("samples, plot and verdicts in %s", settings.out)
	for _, v := range verdicts {
		for _, m := range v.Missed {
			t.Errorf("%s: %s", v.Process, m)
		}
	}
}

func writeSoakFile(t *testing.T, path string, write func(*os.File) error) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// soakDaemon is one GPU server's gpupool-server, started again with the
// same flags after each kill.
type soakDaemon struct {
	name, metrics string
	args          []string
	cmd           *exec.Cmd
}

func (d *soakDaemon) start(t *testing.T, logs *syncBuffer, token string) {
	t.Helper()
	d.cmd = startDaemon(t, logs, token, d.args...)
}

// restart kills the daemon, as a crash or an eviction does, and starts it
// again.
func (d *soakDaemon) restart(t *testing.T, logs *syncBuffer, token string) {
	t.Helper()
	_ = d.cmd.Process.Kill()
	_ = d.cmd.Wait()
	d.start(t, logs, token)
}

// sampleSoak reads each process's resident memory and goroutines, and the
// pool's live leases. A process that cannot be read fails the test: the
// soak must see all of them all the time.
func sampleSoak(t *testing.T, at time.Duration, admin *client.Client, allocator *exec.Cmd, allocatorMetrics string,
	adapter *adapterProcess, daemons []*soakDaemon) []soak.Sample {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	leases, err := admin.Leases(ctx, client.LeaseFilter{})
	if err != nil {
		t.Errorf("listing the live leases at %v: %v", at, err)
	}
	type process struct {
		name    string
		cmd     *exec.Cmd
		metrics string
	}
	processes := []process{{"allocator", allocator, allocatorMetrics}, {"adapter", adapter.cmd, adapter.Metrics + "/metrics"}}
	for _, d := range daemons {
		processes = append(processes, process{d.name, d.cmd, d.metrics})
	}
	var samples []soak.Sample
	for _, p := range processes {
		s := soak.Sample{At: at, Process: p.name, PID: p.cmd.Process.Pid, LiveLeases: len(leases)}
		var u procstat.Usage
		if u, err = procstat.Read(s.PID); err == nil {
			s.RSSBytes, s.AnonBytes = u.RSS, u.RSSAnon
			s.Goroutines, err = goroutinesOf(ctx, p.metrics)
		}
		if err != nil {
			t.Errorf("sampling %s at %v: %v", p.name, at, err)
			continue
		}
		samples = append(samples, s)
	}
	return samples
}

func goroutinesOf(ctx context.Context, metricsURL string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", metricsURL, resp.Status)
	}
	return soak.Goroutines(resp.Body)
}

// leaseFate is what the churn does with a lease it acquired.
type leaseFate int

const (
	releaseSoon   leaseFate = iota // released after a few seconds
	renewAWhile                    // renewed a few times, then released
	leaveToExpire                  // never touched again: the allocator expires it
)

// The churn's timings: a lease released soon lives releaseAfter; one
// renewed a while is renewed every renewEvery, renewals times.
const (
	releaseAfter = 5 * time.Second
	renewEvery   = 5 * time.Second
	renewals     = 3
)

type heldLease struct {
	id, namespace string
	fate          leaseFate
	since         time.Time
	renewed       int
}

// leaseChurn acquires a lease each step, in turn in each namespace with
// its token, and renews, releases or leaves to expire the ones it holds.
type leaseChurn struct {
	tenants    map[string]*client.Client
	namespaces []string
	rng        *rand.Rand
	held       []heldLease
	// What it did, and the calls the allocator refused (quota or capacity
	// after a daemon restart) or that failed.
	acquired, refused, renewed, released, leftToExpire, failed int
}

func (c *leaseChurn) String() string {
	return fmt.Sprintf("%d acquired, %d refused, %d renewals, %d released, %d left to expire, %d calls failed",
		c.acquired, c.refused, c.renewed, c.released, c.leftToExpire, c.failed)
}

// step acquires a lease and deals with those it holds, at now.
func (c *leaseChurn) step(ctx context.Context, step int, now time.Time) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ns := c.namespaces[step%len(c.namespaces)]
	lease, err := c.tenants[ns].Acquire(ctx, api.AcquireRequest{Namespace: ns, GPUAmount: 1, GPUPercent: 10 * (1 + c.rng.IntN(5)),
		TTL: soakLeaseTTL.String(), Owner: api.Owner{Pod: fmt.Sprintf("soak-%d", step), UID: fmt.Sprintf("uid-soak-%d", step),
			Labels: map[string]string{"app": "soak"}}})
	switch {
	case err == nil:
		c.acquired++
		c.held = append(c.held, heldLease{id: lease.ID, namespace: ns, fate: leaseFate(c.rng.IntN(3)), since: now})
	case client.IsReason(err, api.ReasonQuotaExceeded), client.IsReason(err, api.ReasonNoCapacity):
		c.refused++
	default:
		c.failed++
	}
	kept := c.held[:0]
	for _, l := range c.held {
		switch {
		case l.fate == leaveToExpire:
			c.leftToExpire++
			continue
		case l.fate == releaseSoon && now.Sub(l.since) >= releaseAfter,
			l.fate == renewAWhile && l.renewed == renewals && now.Sub(l.since) >= renewEvery:
			if err := c.tenants[l.namespace].Release(ctx, l.id); err != nil {
				c.failed++
			} else {
				c.released++
			}
			continue
		case l.fate == renewAWhile && now.Sub(l.since) >= renewEvery:
			if _, err := c.tenants[l.namespace].Renew(ctx, l.id, soakLeaseTTL); err != nil {
				c.failed++
				continue
			}
			c.renewed++
			l.renewed++
			l.since = now
		}
		kept = append(kept, l)
	}
	c.held = kept
}

// adapterQueries asks the adapter for the soak's app's GPU utilization
// in namespace ml, as an HPA does, one query a call of query.
type adapterQueries struct {
	client *http.Client
	api    string
	// total queries, answered with a value, and that got no answer.
	total, withValue, unanswered int
}

func (q *adapterQueries) String() string {
	return fmt.Sprintf("%d queries, %d answered with a value, %d unanswered", q.total, q.withValue, q.unanswered)
}

func (q *adapterQueries) query() {
	q.total++
	value, _, err := queryExternal(q.client, q.api, "ml", "bitfusion_gpu_utilization", "app=soak")
	switch {
	case err != nil:
		q.unanswered++
	case value != "":
		q.withValue++
	}
}

// everyUntilDone calls step every interval, with the step's number and
// time, until ctx ends.
func everyUntilDone(ctx context.Context, interval time.Duration, step func(n int, now time.Time)) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			step(n, now)
		}
	}
}
