package service

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/inventory"
)

// maxPendingReasons bounds the waiting requests whose reason one view
// works out: each is a placement tried, under the lock every request
// needs. Requests past it say "capacity" with no message.
const maxPendingReasons = 200

// consoleMaxAge is how long one view of the pool serves every console
// page that asks: building it reads every lease under the lock every
// request needs (about 20 ms at 10,000 leases, BenchmarkConsoleView), so
// that open pages cost one build a second between them, not one each.
const consoleMaxAge = time.Second

// maxEncodedScopes bounds the encoded views kept for one build: one a
// scope (the admin's, a namespace's) and encoding asked for within the
// second.
const maxEncodedScopes = 64

// Console is the pool as the console shows it to p: servers, GPUs, models
// and the history to every token; leases, pending requests and tenants
// to those who may use their namespace.
func (s *Service) Console(p Principal) api.Console {
	s.consoleMu.Lock()
	defer s.consoleMu.Unlock()
	return scopeConsole(*s.wholeConsoleLocked(), p)
}

// ConsoleJSON is Console's view as JSON, gzip-compressed when gzipped
// (what a browser reads). Each scope's is encoded once per build in each
// encoding, and every read of it shares those bytes, so that a burst of
// reads costs one encoding a second and no memory per reader.
func (s *Service) ConsoleJSON(p Principal, gzipped bool) []byte {
	s.consoleMu.Lock()
	defer s.consoleMu.Unlock()
	whole := s.wholeConsoleLocked()
	key := consoleKey{scope: "*", gzipped: gzipped} // the admin's and the readers'
	if !p.seesAll() {
		key.scope = "ns/" + p.Namespace // a server's token: no namespace, no leases
	}
	if b, ok := s.consoleEncoded[key]; ok {
		return b
	}
	var buf bytes.Buffer
	w := io.Writer(&buf)
	var zw *gzip.Writer
	if gzipped {
		zw, _ = gzip.NewWriterLevel(&buf, gzip.BestSpeed)
		w = zw
	}
	_ = json.NewEncoder(w).Encode(scopeConsole(*whole, p))
	if zw != nil {
		_ = zw.Close()
	}
	if len(s.consoleEncoded) < maxEncodedScopes {
		s.consoleEncoded[key] = buf.Bytes()
	}
	return buf.Bytes()
}

// consoleKey names one encoded view of a build.
type consoleKey struct {
	scope   string
	gzipped bool
}

// scopeConsole is v as p may see it.
func scopeConsole(v api.Console, p Principal) api.Console {
	if p.seesAll() {
		return v
	}
	v.Namespace = p.Namespace
	v.Leases = slices.DeleteFunc(slices.Clone(v.Leases), func(l api.ConsoleLease) bool { return !p.mayUse(l.Namespace) })
	v.Tenants = slices.DeleteFunc(slices.Clone(v.Tenants), func(t api.ConsoleTenant) bool { return !p.mayUse(t.Namespace) })
	v.Pending = slices.DeleteFunc(slices.Clone(v.Pending), func(r api.ConsolePending) bool { return !p.mayUse(r.Namespace) })
	return v
}

// wholeConsoleLocked is the view of every namespace, built at most once
// per consoleMaxAge; callers share it and change nothing in it.
// s.consoleMu is held.
func (s *Service) wholeConsoleLocked() *api.Console {
	if now := s.clock(); s.console != nil && !now.Before(s.console.At) && now.Sub(s.console.At) < consoleMaxAge {
		return s.console
	}
	v := s.buildConsole()
	// Sorted out of the pool's lock.
	slices.SortFunc(v.Leases, func(a, b api.ConsoleLease) int {
		return cmp.Or(cmp.Compare(len(a.ID), len(b.ID)), cmp.Compare(a.ID, b.ID))
	})
	slices.SortFunc(v.Servers, func(a, b api.ConsoleServer) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(v.Models, func(a, b api.ModelSummary) int { return cmp.Compare(a.Model, b.Model) })
	slices.SortFunc(v.Tenants, func(a, b api.ConsoleTenant) int { return cmp.Compare(a.Namespace, b.Namespace) })
	s.console, s.consoleEncoded = &v, map[consoleKey][]byte{}
	return s.console
}

// buildConsole reads the view of every namespace, unsorted.
func (s *Service) buildConsole() api.Console {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	v := api.Console{At: now, Policy: s.cfg.Policy, History: s.history.all(),
		Models: []api.ModelSummary{}, Servers: []api.ConsoleServer{}, Tenants: []api.ConsoleTenant{}, Leases: []api.ConsoleLease{}, Pending: []api.ConsolePending{}}
	models := map[string]*api.ModelSummary{}
	model := func(name string) *api.ModelSummary {
		m := models[name]
		if m == nil {
			m = &api.ModelSummary{Model: name}
			models[name] = m
		}
		return m
	}

	onServer := map[string]int{}
	tenants := map[string]*tenant{}
	tenantOf := func(ns string) *tenant {
		t := tenants[ns]
		if t == nil {
			t = &tenant{ConsoleTenant: api.ConsoleTenant{Namespace: ns}, pods: map[string]bool{}, apps: map[string]bool{}}
			tenants[ns] = t
		}
		return t
	}
	s.pool.EachLease(now, func(l *allocator.Lease) {
		onServer[l.Server]++
		cl := s.consoleLease(l, now)
		if cl.Idle {
			for _, g := range l.GPUs {
				model(g.Model).IdleHeldGPUs += g.Share.GPUs()
			}
		}
		v.Leases = append(v.Leases, cl)
		t := tenantOf(l.Namespace)
		t.Leases++
		t.LeasedGPUs += cl.ShareGPUs
		if cl.Use != nil {
			t.UsedGPUs += *cl.Use * cl.ShareGPUs
		}
		if l.Owner.Pod != "" {
			t.pods[l.Owner.Pod] = true
		}
		if cl.App != "" {
			t.apps[cl.App] = true
		}
	})

	workload := s.estimate.Current()
	for _, st := range s.pool.ServerStates() {
		cs := s.consoleServer(&st, workload)
		cs.Leases = onServer[cs.Name]
		for gi, g := range cs.GPUs {
			m := model(g.Model)
			m.GPUs++
			leased := g.LeasedPercent / 100
			m.LeasedGPUs += leased
			if g.Utilization != nil {
				m.UsedGPUs += *g.Utilization
			}
			if g.Healthy && st.Node.Schedulable {
				m.Healthy++
				m.FreeGPUs += st.Node.GPUs[gi].Free.GPUs()
			}
		}
		v.FragmentationGPUs += cs.FragmentationGPUs
		v.Servers = append(v.Servers, cs)
	}

	for _, q := range s.pool.Quotas(now) {
		t := tenantOf(q.Namespace)
		t.HardGPUs, t.QuotaUsedGPUs = q.Hard.GPUs(), q.Used.GPUs()
	}
	for _, pr := range s.pendingLocked() {
		for name, m := range models {
			if len(pr.Models) == 0 || slices.Contains(pr.Models, name) {
				m.PendingGPUs += pr.ShareGPUs
			}
		}
		v.Pending = append(v.Pending, pr)
		tenantOf(pr.Namespace).Pending++
	}

	for _, m := range models {
		v.Models = append(v.Models, *m)
	}
	for _, t := range tenants {
		t.Pods = len(t.pods)
		for app := range t.apps {
			t.Apps = append(t.Apps, app)
		}
		slices.Sort(t.Apps)
		v.Tenants = append(v.Tenants, t.ConsoleTenant)
	}
	return v
}

// tenant is a ConsoleTenant being summed up.
type tenant struct {
	api.ConsoleTenant
	pods, apps map[string]bool
}

// consoleServer is one server's view; s.mu is held. Its fragmentation is
// the policy's measure against the workload the allocator expects.
func (s *Service) consoleServer(st *allocator.ServerState, workload allocator.Workload) api.ConsoleServer {
	srv, n := &st.Server, &st.Node
	cs := api.ConsoleServer{Name: srv.Name, Schedulable: n.Schedulable, Healthy: n.Schedulable, LastHeartbeat: s.lastSeen[srv.Name]}
	if n.Schedulable {
		// FGD counts a silent server's whole free share as fragmented; it
		// is not stranded by packing but unreachable, which the server's
		// health shows.
		cs.FragmentationGPUs = workload.Fragmentation(n) / float64(allocator.WholeGPU)
	}
	use := s.use[srv.Name]
	if use != nil {
		cs.SampledAt = use.sampledAt
	}
	for gi, g := range srv.GPUs {
		ng := &n.GPUs[gi]
		cg := api.ConsoleGPU{Index: g.Index, UUID: g.UUID, Model: g.Model, Healthy: ng.Healthy, MemoryBytes: g.MemoryBytes,
			LeasedPercent: (allocator.WholeGPU - ng.Free).Percent()}
		cs.Healthy = cs.Healthy && ng.Healthy
		if len(g.Links) > 0 {
			for j := range srv.GPUs {
				if j != gi {
					cg.Links = append(cg.Links, srv.LinkBetween(gi, j).String())
				}
			}
		}
		if use != nil {
			for _, u := range use.gpus {
				if u.Index == gi {
					cg.Utilization, cg.MemoryUsedBytes = u.Utilization, u.MemoryUsedBytes
				}
			}
		}
		cs.GPUs = append(cs.GPUs, cg)
	}
	return cs
}

// consoleLease is one lease's row at now; s.mu is held.
func (s *Service) consoleLease(l *allocator.Lease, now time.Time) api.ConsoleLease {
	cl := api.ConsoleLease{ID: l.ID, Namespace: l.Namespace, Pod: l.Owner.Pod, App: l.Owner.Labels["app"], Server: l.Server,
		ShareGPUs: l.Share().GPUs(), GrantedAt: l.GrantedAt}
	for _, g := range l.GPUs {
		cl.GPUs = append(cl.GPUs, g.Index)
		cl.MemoryBytes += g.MemoryBytes
	}
	if use, ok := s.useOf(l, now); ok {
		cl.Use = &use
	}
	if v := s.idleVerdict(l, now); v != nil {
		cl.IdleSeconds, cl.Idle = &v.Seconds, v.Whole
		if !v.ReclaimAt.IsZero() {
			cl.ReclaimAt = &v.ReclaimAt
		}
	}
	if l.TTL > 0 {
		expires := l.ExpiresAt
		cl.ExpiresAt, cl.TTL = &expires, l.TTL.String()
	}
	return cl
}

// pendingLocked is every waiting request with the reason it waits, oldest
// first; s.mu is held.
func (s *Service) pendingLocked() []api.ConsolePending {
	var out []api.ConsolePending
	reasons := map[shape][2]string{}
	for r, w := range s.waiting {
		pr := api.ConsolePending{Namespace: r.Namespace, Pod: r.Owner.Pod, GPUs: r.GPUs, ShareGPUs: pendingShare(r),
			Models: r.Models, Since: w.since, Reason: api.WaitCapacity}
		if r.Topology != inventory.LinkAny {
			pr.Topology = r.Topology.String()
		}
		reason, tried := reasons[w.shape]
		if !tried && len(reasons) < maxPendingReasons {
			reason = [2]string{}
			reason[0], reason[1] = s.waitReason(*r)
			reasons[w.shape] = reason
		}
		if reason[0] != "" {
			pr.Reason, pr.Message = reason[0], reason[1]
		}
		out = append(out, pr)
	}
	slices.SortFunc(out, func(a, b api.ConsolePending) int { return a.Since.Compare(b.Since) })
	return out
}

// pendingShare is the share a waiting request asks for, in GPUs: a
// request by memory counts whole GPUs, as it may take them.
func pendingShare(r *allocator.Request) float64 {
	if r.Percent > 0 {
		return float64(r.GPUs*r.Percent) / 100
	}
	return float64(r.GPUs)
}

// waitReason is why r does not fit now: its quota, else a model or a
// topology no server can give while the rest of the pool could, else
// capacity; and the allocator's words. s.mu is held.
func (s *Service) waitReason(r allocator.Request) (reason, message string) {
	err := s.pool.Fits(r)
	if err == nil {
		return api.WaitCapacity, "it fits now, and is being woken"
	}
	if _, quota := errors.AsType[*allocator.QuotaExceededError](err); quota {
		return api.WaitQuota, err.Error()
	}
	if r.Topology != inventory.LinkAny {
		anyLink := r
		anyLink.Topology = inventory.LinkAny
		if s.pool.Fits(anyLink) == nil {
			return api.WaitTopology, err.Error()
		}
	}
	if len(r.Models) > 0 {
		anyModel := r
		anyModel.Models = nil
		if s.pool.Fits(anyModel) == nil {
			return api.WaitModel, err.Error()
		}
	}
	return api.WaitCapacity, err.Error()
}
