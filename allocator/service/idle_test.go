package service

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
)

func minutes(n float64) metav1.Duration {
	return metav1.Duration{Duration: time.Duration(n * float64(time.Minute))}
}

// TestIdlePolicyIsChecked: nonsense in the config file is refused naming
// the field, the value and the limit.
func TestIdlePolicyIsChecked(t *testing.T) {
	for _, tc := range []struct {
		policy IdlePolicy
		want   string
	}{
		{IdlePolicy{UseBelow: 0, Window: minutes(30)}, "namespaces.ml.idle.useBelow 0 out of range (0, 1]"},
		{IdlePolicy{UseBelow: 1.5, Window: minutes(30)}, "namespaces.ml.idle.useBelow 1.5 out of range (0, 1]"},
		{IdlePolicy{UseBelow: -0.1, Window: minutes(30)}, "namespaces.ml.idle.useBelow -0.1"},
		{IdlePolicy{UseBelow: 0.1, Window: minutes(0.5)}, "namespaces.ml.idle.window 30s out of range 1m0s..168h0m0s"},
		{IdlePolicy{UseBelow: 0.1}, "namespaces.ml.idle.window 0s out of range"},
		{IdlePolicy{UseBelow: 0.1, Window: minutes(60 * 24 * 8)}, "namespaces.ml.idle.window 192h0m0s out of range"},
		{IdlePolicy{UseBelow: 0.1, Window: minutes(30), Grace: minutes(-1)}, "namespaces.ml.idle.grace -1m0s out of range 0..168h0m0s"},
		{IdlePolicy{UseBelow: 0.1, Window: minutes(30), Action: "delete"}, `namespaces.ml.idle.action "delete" must be report or reclaim`},
	} {
		err := tc.policy.validate("namespaces.ml.idle")
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.policy, err, tc.want)
		}
	}
	p := IdlePolicy{UseBelow: 0.1, Window: minutes(30), Grace: minutes(15)}
	if err := p.validate("namespaces.ml.idle"); err != nil || p.Action != IdleReport {
		t.Errorf("a sane policy: %v, action %q, want report by default", err, p.Action)
	}
}

// TestIdlePolicyOfTheNamespace: a namespace's own policy decides its
// leases: under its bar for its whole window is idle, with the deadline
// its grace gives; any sample at or above the bar starts the run again (a
// bursty job whose gaps are shorter than the window is never idle); the
// other namespace keeps the default.
func TestIdlePolicyOfTheNamespace(t *testing.T) {
	policy := IdlePolicy{UseBelow: 0.3, Window: minutes(1), Grace: minutes(2), Action: IdleReclaim}
	a := startAllocatorWith(t, t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, func(c *Config) {
		c.IdlePolicies = map[string]IdlePolicy{"team-a": policy}
	})
	ctx := context.Background()
	admin := a.client(t, adminToken)
	for _, s := range []api.Server{gpuServer("s1", 2), gpuServer("s2", 1)} {
		if err := admin.RegisterServer(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	la, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, UntilReleased: true, Servers: []string{"s1"}})
	if err != nil {
		t.Fatal(err)
	}
	lb, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-b", GPUAmount: 1, UntilReleased: true, Servers: []string{"s2"}})
	if err != nil {
		t.Fatal(err)
	}
	server := a.client(t, serverToken)
	// sample reports both leases' use and takes one sample.
	sample := func(useA, useB float64) (api.ConsoleLease, api.ConsoleLease) {
		heartbeatUse(t, server, la, useA, a.clock.Now())
		heartbeatUse(t, server, lb, useB, a.clock.Now())
		a.clock.Add(api.HistoryInterval)
		a.svc.tick()
		var ca, cb api.ConsoleLease
		for _, l := range a.svc.Console(Principal{Admin: true}).Leases {
			switch l.ID {
			case la.ID:
				ca = l
			case lb.ID:
				cb = l
			}
		}
		return ca, cb
	}
	// 20% of the lease is idle under team-a's bar of 30%, not under the
	// default's 10% (team-b).
	windowA := int(policy.Window.Duration / api.HistoryInterval)
	start := a.clock.Now()
	for i := range windowA {
		ca, cb := sample(0.2, 0.2)
		if ca.Idle != (i == windowA-1) || cb.Idle || cb.IdleSeconds != nil {
			t.Fatalf("sample %d: team-a idle %v, team-b %+v", i+1, ca.Idle, cb)
		}
	}
	ca, _ := sample(0.2, 0.2)
	if want := start.Add(policy.Window.Duration + policy.Grace.Duration); ca.ReclaimAt == nil || !ca.ReclaimAt.Equal(want) ||
		ca.IdleSeconds == nil || *ca.IdleSeconds != policy.Window.Seconds()+api.HistoryInterval.Seconds() {
		t.Errorf("idle past the window: reclaim at %v, idle %v s; want %v, %v s", ca.ReclaimAt, ca.IdleSeconds, want, policy.Window.Seconds()+10)
	}
	if got := idleHeldOf(t, a, "team-a"); got != 1 {
		t.Errorf("bitfusion_namespace_idle_held_gpus{team-a} = %v, want 1", got)
	}
	// GET /v1/leases?idle=true: team-a's lease alone, with its verdict.
	idle, err := admin.Leases(ctx, client.LeaseFilter{Idle: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(idle) != 1 || idle[0].ID != la.ID || idle[0].Idle == nil || !idle[0].Idle.Whole || idle[0].Idle.Action != IdleReclaim ||
		idle[0].Idle.UseBelow != 0.3 || !idle[0].Idle.ReclaimAt.Equal(*ca.ReclaimAt) || idle[0].Idle.Seconds != *ca.IdleSeconds {
		t.Errorf("idle leases %+v; want team-a's %s alone, whole, reclaimed at %v", idle, la.ID, ca.ReclaimAt)
	}
	// A burst every 50 s: its gaps are shorter than the window.
	for range 3 {
		for i := range windowA - 1 {
			if ca, _ := sample(map[bool]float64{true: 0.9, false: 0.2}[i == 0], 0.5); ca.Idle || ca.ReclaimAt != nil && i == 0 {
				t.Fatalf("a bursty lease is idle: %+v", ca)
			}
		}
	}
}

// idleHeldOf is bitfusion_namespace_idle_held_gpus of ns, as a's
// registry exports it.
func idleHeldOf(t *testing.T, a *testAllocator, ns string) float64 {
	t.Helper()
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "bitfusion_namespace_idle_held_gpus" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "namespace" && l.GetValue() == ns {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no bitfusion_namespace_idle_held_gpus{namespace=%q}", ns)
	return 0
}

// TestRestartStartsIdleRunsAgain: the runs of idle samples are in memory
// only, so that a restarted allocator, which did not measure the time it
// was down, starts each lease's run again: a lease idle for its whole
// window before the restart is not idle after it until it has been
// measured idle for a whole window again.
func TestRestartStartsIdleRunsAgain(t *testing.T) {
	dir := t.TempDir()
	a, l := startWithOneLease(t, dir, nil)
	ctx, clock := context.Background(), a.clock
	idleFor := func(a *testAllocator, samples int) []api.Lease {
		server := a.client(t, serverToken)
		for range samples {
			heartbeatUse(t, server, l, 0, a.clock.Now())
			a.clock.Add(api.HistoryInterval)
			a.svc.tick()
		}
		idle, err := a.client(t, adminToken).Leases(ctx, client.LeaseFilter{Idle: true})
		if err != nil {
			t.Fatal(err)
		}
		return idle
	}
	if idle := idleFor(a, windowSamples); len(idle) != 1 || !idle[0].Idle.Whole {
		t.Fatalf("before the restart: %+v, want the lease idle", idle)
	}
	a.close()
	b := startAllocator(t, dir, clock, nil)
	if idle := idleFor(b, 1); len(idle) != 1 || idle[0].Idle.Whole || idle[0].Idle.Seconds != api.HistoryInterval.Seconds() {
		t.Errorf("one sample after the restart: %+v, want a run of one sample", idle)
	}
}

// TestReadingsBetweenSamplesCount: a daemon heart-beats every 5 s and the
// allocator samples every 10, so a reading can be replaced before a
// sample sees it. One that shows the lease in use, or does not read it,
// or a heartbeat with no reading at all, ends its idle run all the same,
// and the run that follows starts after it: a lease whose every other
// reading says busy or unknown is never idle. (BenchmarkIdleReclaim's
// bursty pods, busy between two samples, were reclaimed without it.)
func TestReadingsBetweenSamplesCount(t *testing.T) {
	for name, between := range map[string]func(*testing.T, *client.Client, api.Lease, time.Time){
		"busy": func(t *testing.T, c *client.Client, l api.Lease, at time.Time) { heartbeatUse(t, c, l, 0.9, at) },
		"the lease unread": func(t *testing.T, c *client.Client, l api.Lease, at time.Time) {
			hb := api.Heartbeat{Use: &api.ServerUse{SampledAt: at, GPUs: []api.GPUUse{{Index: l.GPUs[0].Index, Utilization: ratio(0)}}}}
			if err := c.Heartbeat(context.Background(), l.Server, hb); err != nil {
				t.Fatal(err)
			}
		},
		"no reading": func(t *testing.T, c *client.Client, l api.Lease, _ time.Time) {
			if err := c.Heartbeat(context.Background(), l.Server, api.Heartbeat{}); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			policy := IdlePolicy{UseBelow: 0.1, Window: minutes(1), Grace: minutes(0.25), Action: IdleReclaim}
			a, l := startWithOneLease(t, t.TempDir(), map[string]IdlePolicy{"team-a": policy})
			ctx, admin := context.Background(), a.client(t, adminToken)
			server := a.client(t, serverToken)
			idle := func() *api.LeaseIdle {
				ls, err := admin.Leases(ctx, client.LeaseFilter{Idle: true})
				if err != nil {
					t.Fatal(err)
				}
				if len(ls) == 0 {
					return nil
				}
				return ls[0].Idle
			}
			a.svc.tick()
			for i := range 9 { // 90 s: each sample reads the idle reading alone
				between(t, server, l, a.clock.Now())
				a.clock.Add(5 * time.Second)
				a.svc.tick()
				heartbeatUse(t, server, l, 0.01, a.clock.Now())
				a.clock.Add(5 * time.Second)
				a.svc.tick()
				if v := idle(); v != nil && (v.Whole || v.Seconds > 10) {
					t.Fatalf("sample %d: every other reading %s, yet idle: %+v", i+1, name, *v)
				}
			}
			// Idle from now on: a run since the last reading that was not
			// (the last sample's run goes on), whole after its window.
			last := a.clock.Now().Add(-10 * time.Second)
			for range 7 {
				heartbeatUse(t, server, l, 0.01, a.clock.Now())
				a.clock.Add(5 * time.Second)
				a.svc.tick()
				heartbeatUse(t, server, l, 0.01, a.clock.Now())
				a.clock.Add(5 * time.Second)
				a.svc.tick()
			}
			if v := idle(); v == nil || !v.Whole || !v.Since.Equal(last) {
				t.Errorf("idle for 80 s since the last reading that was not (%v): %+v", last, v)
			}
		})
	}
}

// startWithOneLease starts an allocator in dir on a fake clock with these
// idle policies, a server s1 of one GPU and team-a's lease of it.
func startWithOneLease(t *testing.T, dir string, policies map[string]IdlePolicy) (*testAllocator, api.Lease) {
	t.Helper()
	a := startAllocatorWith(t, dir, &fakeClock{now: time.Unix(1e9, 0)}, func(c *Config) { c.IdlePolicies = policies })
	admin := a.client(t, adminToken)
	if err := admin.RegisterServer(context.Background(), gpuServer("s1", 1)); err != nil {
		t.Fatal(err)
	}
	l, err := admin.Acquire(context.Background(), api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, UntilReleased: true})
	if err != nil {
		t.Fatal(err)
	}
	return a, l
}
