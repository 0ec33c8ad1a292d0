// Package gpuserver is the GPU-server daemon's logic: it registers the
// host's GPUs with the allocator and heart-beats their health, follows the
// leases placed on the host, attributes GPU processes to those leases (by
// the pod they run in, or by the PID `gpupool run` reported), and exports
// per-lease use next to the per-GPU telemetry of the collector package.
package gpuserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/collector"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/inventory"
)

// Config configures a Daemon.
type Config struct {
	// Inventory is the server as it registers: name, GPUs, CPU, memory, labels.
	Inventory inventory.Server
	Client    *client.Client
	// AllocatorURLs are the allocator's replicas, where a process report is
	// checked with the reporter's own token.
	AllocatorURLs []string
	Samplers      []*collector.Sampler
	// Fabric, when set, samples the host's RDMA ports (a collector.Fabric).
	Fabric *collector.Sampler
	// Heartbeat is how often the daemon checks in and refreshes its leases.
	Heartbeat time.Duration
	// LabelAllowlist names the pod labels copied onto per-lease series.
	LabelAllowlist []string
	// Parent returns a process's parent PID, so that children of a PID
	// registered by `gpupool run` are attributed too; nil skips that.
	Parent func(pid int) (int, bool)
	// PodOf returns the Kubernetes pod UID a process runs in ("" for
	// none), for sources that do not tell; nil skips that.
	PodOf func(pid int) string
	// StartTime returns when a process started (ProcStartTime), false
	// when there is no such process: a registered process is the PID and
	// its start time, so reports of gone processes are refused and pruned,
	// and a later process that reuses the PID is not attributed to the
	// lease. nil counts every process as running.
	StartTime func(pid int) (uint64, bool)
	// Clock is the daemon's time: it judges the snapshots' age, dates
	// process reports and scrapes and moves the latency window; time.Now
	// when nil. NewHost gives the same clock to the samplers (the GPUs'
	// and the RDMA ports') and to a simulated source.
	Clock func() time.Time
	Log   *slog.Logger
}

// Daemon runs one GPU host.
type Daemon struct {
	cfg     Config
	latency *prometheus.HistogramVec
	window  *latencyWindow
	// report is the usage report the last sampling round rendered.
	report atomic.Pointer[gpuapi.Usage]
	// useRefused is set once the allocator refused a heartbeat's use (one
	// older than the field): heartbeats then carry health alone.
	useRefused atomic.Bool

	mu     sync.Mutex
	leases []allocator.Lease
	// seen is, per lease, the rounds each sampler had started when the
	// daemon learned of it (setLeases).
	seen map[string][]int
	pids map[int]pidEntry // as `gpupool run` reported
	// pods caches PodOf per PID until the leases next change, or it holds
	// maxPIDs entries.
	pods map[int]string
}

// The process registry holds at most maxPIDs processes, maxPIDsPerLease of
// one lease: `gpupool run` reports one per lease (its children count
// through their ancestry), so the caps only stop a reporter from crowding
// out the others.
const (
	maxPIDs         = 4096
	maxPIDsPerLease = 64
	// maxAncestry bounds the walks up a process's ancestors.
	maxAncestry = 32
)

// registryFullError refuses a report when the registry is at a cap.
type registryFullError struct{ limit string }

func (e *registryFullError) Error() string { return "the process registry is full: " + e.limit }

// pidEntry is a reported process: its lease, when it was reported, so
// that a lease list fetched before the report does not drop it, and when
// it started (Config.StartTime; 0 when not known), so that a later process
// with its PID is not taken for it.
type pidEntry struct {
	lease string
	at    time.Time
	start uint64
}

// New returns a daemon; Run starts it.
func New(cfg Config) *Daemon {
	cfg.setDefaults()
	latency := gpuapi.LatencyFamily.NewHistogramVec()
	return &Daemon{cfg: cfg, pids: map[int]pidEntry{}, latency: latency,
		window: &latencyWindow{hist: latency, started: cfg.Clock()}}
}

// setDefaults fills in the logger and the clock when they are unset.
func (c *Config) setDefaults() {
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
}

func (d *Daemon) now() time.Time { return d.cfg.Clock() }

// ServeProbes answers clients' latency probes on ln until ctx ends.
func (d *Daemon) ServeProbes(ctx context.Context, ln net.Listener, interval time.Duration) {
	ServeProbes(ctx, ln, d.cfg.Inventory.Name, interval, d.latency, d.cfg.Log)
}

// Leases returns the leases on this server as last fetched, nil before
// the first fetch.
func (d *Daemon) Leases() []allocator.Lease {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.leases
}

// RegisterPID records that pid, the process running now, runs under lease
// (from `gpupool run`), replacing what an earlier report said of pid. It
// refuses with a *registryFullError when the registry, pruned of gone
// processes, or the lease's part of it is at its cap.
func (d *Daemon) RegisterPID(pid int, lease string) error {
	start, ok := d.startTime(pid)
	if !ok {
		return fmt.Errorf("pid %d: no such process", pid)
	}
	return d.registerPID(pid, lease, start)
}

// registerPID is RegisterPID of the process that started at start.
func (d *Daemon) registerPID(pid int, lease string, start uint64) error {
	err := d.addPID(pid, lease, start)
	var full *registryFullError
	if errors.As(err, &full) {
		d.pruneGone()
		err = d.addPID(pid, lease, start)
	}
	return err
}

// startTime is when the process with pid started (Config.StartTime); 0
// and true when the daemon does not tell processes apart by it, false
// when the process is gone.
func (d *Daemon) startTime(pid int) (uint64, bool) {
	if d.cfg.StartTime == nil {
		return 0, true
	}
	return d.cfg.StartTime(pid)
}

// stillRuns reports whether the process registered as e still has its
// PID: a process with another start time is a later one.
func (d *Daemon) stillRuns(pid int, e pidEntry) bool {
	start, ok := d.startTime(pid)
	return ok && start == e.start
}

func (d *Daemon) addPID(pid int, lease string, start uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.pids[pid]; !ok || e.lease != lease {
		n := 0
		for _, e := range d.pids {
			if e.lease == lease {
				n++
			}
		}
		if n >= maxPIDsPerLease {
			return &registryFullError{limit: fmt.Sprintf("at most %d processes per lease", maxPIDsPerLease)}
		}
		if !ok && len(d.pids) >= maxPIDs {
			return &registryFullError{limit: fmt.Sprintf("at most %d processes on this server", maxPIDs)}
		}
	}
	d.pids[pid] = pidEntry{lease: lease, at: d.now(), start: start}
	return nil
}

// pruneGone drops the registered processes that no longer exist, or whose
// PID a later process took; it looks them up without holding the lock,
// which scrapes need.
func (d *Daemon) pruneGone() {
	if d.cfg.StartTime == nil {
		return
	}
	d.mu.Lock()
	entries := maps.Clone(d.pids)
	d.mu.Unlock()
	var gone []int
	for pid := range entries {
		if !d.stillRuns(pid, entries[pid]) {
			gone = append(gone, pid)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, pid := range gone {
		// A report registered since the look-up (a new process with the
		// PID, or the lease moved) replaced the entry: it stays.
		if d.pids[pid] == entries[pid] {
			delete(d.pids, pid)
		}
	}
}

// PIDOf returns a PID reported for the lease.
func (d *Daemon) PIDOf(lease string) (int, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for pid, e := range d.pids {
		if e.lease == lease {
			return pid, true
		}
	}
	return 0, false
}

// Run registers the server, then heart-beats and refreshes the leases
// until ctx ends. It retries while the allocator is unreachable.
func (d *Daemon) Run(ctx context.Context) {
	t := time.NewTicker(d.cfg.Heartbeat)
	defer t.Stop()
	registered := false
	for {
		if !registered {
			registered = d.register(ctx)
		} else {
			registered = d.heartbeat(ctx)
		}
		if registered {
			d.refreshLeases(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (d *Daemon) register(ctx context.Context) bool {
	inv := d.cfg.Inventory
	inv.GPUs = append([]inventory.GPU(nil), inv.GPUs...)
	health := d.health()
	for i := range inv.GPUs {
		if h, ok := health[inv.GPUs[i].UUID]; ok {
			inv.GPUs[i].Healthy = h
		}
	}
	if err := d.cfg.Client.RegisterServer(ctx, api.NewServer(inv)); err != nil {
		d.cfg.Log.Warn("registering with the allocator", "server", inv.Name, "err", err)
		return false
	}
	d.cfg.Log.Info("registered with the allocator", "server", inv.Name, "gpus", len(inv.GPUs))
	return true
}

// heartbeat reports health; false when the allocator forgot the server.
func (d *Daemon) heartbeat(ctx context.Context) bool {
	health := d.health()
	var hb api.Heartbeat
	for _, g := range d.cfg.Inventory.GPUs {
		h, ok := health[g.UUID]
		hb.GPUs = append(hb.GPUs, api.GPUHealth{Index: g.Index, Healthy: ok && h})
	}
	if !d.useRefused.Load() {
		hb.Use = heartbeatUse(d.UsageReport())
	}
	err := d.cfg.Client.Heartbeat(ctx, d.cfg.Inventory.Name, hb)
	if hb.Use != nil && client.IsReason(err, api.ReasonInvalid) {
		// Health gets through whatever the allocator makes of the use:
		// one older than the field refuses it, always; a newer one a
		// reading it finds out of range, this time.
		if strings.Contains(err.Error(), `unknown field "use"`) {
			d.cfg.Log.Warn("the allocator takes no use in heartbeats (older than this daemon): its console will show none", "err", err)
			d.useRefused.Store(true)
		} else {
			d.cfg.Log.Warn("the allocator refused this round's use; sending health alone", "err", err)
		}
		hb.Use = nil
		err = d.cfg.Client.Heartbeat(ctx, d.cfg.Inventory.Name, hb)
	}
	if client.IsReason(err, api.ReasonNotFound) {
		return false
	}
	if err != nil {
		d.cfg.Log.Warn("heartbeat", "err", err)
	}
	return true
}

// health is each GPU's health by UUID from the latest snapshots; a GPU a
// source no longer reports (off the bus) is missing, hence unhealthy.
//
// A source that failed, or whose snapshot is older than staleRounds
// intervals (a hung driver call), vouches for none of its GPUs.
func (d *Daemon) health() map[string]bool {
	out := map[string]bool{}
	now := d.now()
	for _, s := range d.cfg.Samplers {
		snap := s.Latest()
		fresh := snap.Err == nil && now.Sub(snap.Time) <= staleRounds*s.Interval
		for _, g := range snap.GPUs {
			out[g.UUID] = fresh && g.Healthy && g.Err == nil
		}
	}
	return out
}

// staleRounds is how many sampling intervals a snapshot may age before its
// GPUs count as unhealthy.
const staleRounds = 5

// refreshLeases fetches the leases on this server, and prunes the process
// registry of gone processes and, once the leases are known, of processes
// whose lease is gone.
func (d *Daemon) refreshLeases(ctx context.Context) {
	d.pruneGone()
	fetched := d.now()
	leases, err := d.cfg.Client.Leases(ctx, client.LeaseFilter{Server: d.cfg.Inventory.Name})
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			d.cfg.Log.Warn("fetching leases", "err", err)
		}
		return
	}
	live := map[string]bool{}
	for _, l := range leases {
		live[l.ID] = true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.setLeases(api.CoreLeases(leases))
	maps.DeleteFunc(d.pids, func(_ int, e pidEntry) bool { return !live[e.lease] && e.at.Before(fetched) })
	d.pods = nil
}

// registered is a copy of the PID registry for one attribution round,
// which looks up each registered PID's start time at most once.
type registered struct {
	d        *Daemon
	pids     map[int]pidEntry
	verified map[int]bool
}

// lease is the lease the process with pid runs under, if it is the one
// registered.
func (r *registered) lease(pid int) (string, bool) {
	e, ok := r.pids[pid]
	if !ok {
		return "", false
	}
	runs, checked := r.verified[pid]
	if !checked {
		runs = r.d.stillRuns(pid, e)
		if r.verified == nil {
			r.verified = map[int]bool{}
		}
		r.verified[pid] = runs
	}
	return e.lease, runs
}

// attribute finds who a process runs for: the lease ID the PID registry
// names (for it or its nearest registered ancestor), else its pod's UID. A
// registered PID that a later process took names no lease.
func (d *Daemon) attribute(p *collector.Process, pids *registered) (string, bool) {
	pid := p.PID
	for range maxAncestry {
		if lease, ok := pids.lease(pid); ok {
			return lease, true
		}
		if d.cfg.Parent == nil {
			break
		}
		parent, ok := d.cfg.Parent(pid)
		if !ok || parent <= 1 {
			break
		}
		pid = parent
	}
	pod := p.PodUID
	if pod == "" {
		pod = d.podOf(p.PID)
	}
	return pod, pod != ""
}

func (d *Daemon) podOf(pid int) string {
	if d.cfg.PodOf == nil {
		return ""
	}
	d.mu.Lock()
	uid, ok := d.pods[pid]
	d.mu.Unlock()
	if ok {
		return uid
	}
	uid = d.cfg.PodOf(pid)
	d.mu.Lock()
	if d.pods == nil || len(d.pods) >= maxPIDs {
		d.pods = map[int]string{}
	}
	d.pods[pid] = uid
	d.mu.Unlock()
	return uid
}
