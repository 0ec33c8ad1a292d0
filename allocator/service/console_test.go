package service

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/inventory"
)

func ratio(v float64) *float64 { return &v }

// consolePool is two servers, s1 (2 GPUs) and s2 (1 GPU), with a lease
// of 50% of one GPU in team-a and a whole GPU in team-b.
func consolePool(t *testing.T) (a *testAllocator, admin *client.Client, la, lb api.Lease) {
	t.Helper()
	a = startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, map[string]allocator.Share{"team-a": 2 * allocator.WholeGPU})
	ctx := context.Background()
	admin = a.client(t, adminToken)
	for _, s := range []api.Server{gpuServer("s1", 2), gpuServer("s2", 1)} {
		if err := admin.RegisterServer(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	if la, err = admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 50, UntilReleased: true, Owner: api.Owner{Pod: "train-0", Labels: map[string]string{"app": "train"}}}); err != nil {
		t.Fatal(err)
	}
	if lb, err = admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-b", GPUAmount: 1, UntilReleased: true, Owner: api.Owner{Pod: "batch-0"}}); err != nil {
		t.Fatal(err)
	}
	return a, admin, la, lb
}

// heartbeatUse reports a lease's SM use (of the whole GPU) and the GPU's.
func heartbeatUse(t *testing.T, c *client.Client, l api.Lease, sm float64, at time.Time) {
	t.Helper()
	gpu := l.GPUs[0].Index
	hb := api.Heartbeat{Use: &api.ServerUse{SampledAt: at,
		GPUs:   []api.GPUUse{{Index: gpu, Utilization: ratio(sm), MemoryUsedBytes: 1 << 30}},
		Leases: []api.LeaseUse{{Lease: l.ID, GPU: gpu, SMUtilization: ratio(sm), MemoryUsedBytes: 1 << 30}}}}
	if err := c.Heartbeat(context.Background(), l.Server, hb); err != nil {
		t.Fatal(err)
	}
}

// TestConsoleShowsEachTokenItsOwn: servers, GPUs and shares are
// everyone's; leases, pending requests and tenants are the namespace's, or
// all of them for the admin; a GPU server's token sees none.
func TestConsoleShowsEachTokenItsOwn(t *testing.T) {
	a, admin, la, lb := consolePool(t)
	ctx := context.Background()
	for _, tc := range []struct {
		token      string
		namespace  string
		leases     []string
		namespaces []string
	}{
		{adminToken, "", []string{la.ID, lb.ID}, []string{"team-a", "team-b"}},
		{teamAToken, "team-a", []string{la.ID}, []string{"team-a"}},
		{teamBToken, "team-b", []string{lb.ID}, []string{"team-b"}},
		{serverToken, "", nil, nil},
	} {
		v, err := a.client(t, tc.token).Console(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var leases, namespaces []string
		for _, l := range v.Leases {
			leases = append(leases, l.ID)
		}
		for _, n := range v.Tenants {
			namespaces = append(namespaces, n.Namespace)
		}
		if v.Namespace != tc.namespace || !slices.Equal(leases, tc.leases) || !slices.Equal(namespaces, tc.namespaces) || len(v.Servers) != 2 {
			t.Errorf("%s: namespace %q, leases %v, tenants %v, %d servers; want %q, %v, %v, 2",
				tc.token, v.Namespace, leases, namespaces, len(v.Servers), tc.namespace, tc.leases, tc.namespaces)
		}
	}
	if code, body := send(t, http.MethodGet, a.url+"/v1/console", "not-a-token", ""); code != http.StatusUnauthorized || strings.Contains(body, la.ID) {
		t.Errorf("a bad token: %d %s", code, body)
	}
	_ = admin
}

// TestConsoleSumsThePool: each panel's figures from the leases, the
// quotas and the use the daemons reported.
func TestConsoleSumsThePool(t *testing.T) {
	a, _, la, lb := consolePool(t)
	ctx := context.Background()
	server := a.client(t, serverToken)
	heartbeatUse(t, server, la, 0.25, a.clock.Now())
	v, err := a.client(t, adminToken).Console(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Models) != 1 {
		t.Fatalf("models %+v, want A100 alone", v.Models)
	}
	m := v.Models[0]
	if m.GPUs != 3 || m.Healthy != 3 || !near(m.LeasedGPUs, 1.5) || !near(m.UsedGPUs, 0.25) || !near(m.FreeGPUs, 1.5) || m.IdleHeldGPUs != 0 {
		t.Errorf("A100: %+v; want 3 GPUs, 1.5 leased, 0.25 used, 1.5 free", m)
	}
	byID := map[string]api.ConsoleLease{}
	for _, l := range v.Leases {
		byID[l.ID] = l
	}
	if l := byID[la.ID]; l.Use == nil || !near(*l.Use, 0.5) || l.Pod != "train-0" || l.App != "train" || !near(l.ShareGPUs, 0.5) {
		t.Errorf("team-a's lease: %+v; want use 0.5 of its share (0.25 of the GPU), pod train-0, app train", l)
	}
	if l := byID[lb.ID]; l.Use != nil {
		t.Errorf("team-b's lease has use %v, which no daemon reported", *l.Use)
	}
	ta := v.Tenants[0]
	if ta.Namespace != "team-a" || !near(ta.HardGPUs, 2) || !near(ta.QuotaUsedGPUs, 0.5) || ta.Leases != 1 || ta.Pods != 1 || !slices.Equal(ta.Apps, []string{"train"}) || !near(ta.UsedGPUs, 0.25) {
		t.Errorf("team-a: %+v", ta)
	}
	var frag float64
	for _, s := range v.Servers {
		frag += s.FragmentationGPUs
		for _, g := range s.GPUs {
			if s.Name == la.Server && g.Index == la.GPUs[0].Index && (g.Utilization == nil || !near(*g.Utilization, 0.25) || !near(g.LeasedPercent, 50)) {
				t.Errorf("%s GPU %d: %+v; want 50%% leased, 0.25 used", s.Name, g.Index, g)
			}
		}
	}
	if !near(frag, v.FragmentationGPUs) {
		t.Errorf("fragmentation %v, the servers' sum %v", v.FragmentationGPUs, frag)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestIdleButHeld: a lease whose use stays under a tenth of its share for
// five minutes of samples is idle but held; one that used more, or has
// not been measured that long, is not.
func TestIdleButHeld(t *testing.T) {
	a, _, la, lb := consolePool(t)
	server := a.client(t, serverToken)
	for i := range windowSamples {
		// team-a's lease uses 5% of its share, team-b's 50%.
		heartbeatUse(t, server, la, 0.025, a.clock.Now())
		heartbeatUse(t, server, lb, 0.5, a.clock.Now())
		a.clock.Add(api.HistoryInterval)
		a.svc.tick()
		v := a.svc.Console(Principal{Admin: true})
		idle := v.Models[0].IdleHeldGPUs
		if want := 0.0; i == windowSamples-1 {
			if want = 0.5; !near(idle, want) {
				t.Errorf("after %d samples: %v idle but held, want %v (team-a's half GPU)", i+1, idle, want)
			}
		} else if idle != want {
			t.Errorf("after %d samples, short of the window: %v idle but held", i+1, idle)
		}
	}
	// One busy sample brings the mean over the window above the bar.
	heartbeatUse(t, server, la, 1, a.clock.Now())
	a.clock.Add(api.HistoryInterval)
	a.svc.tick()
	for _, l := range a.svc.Console(Principal{Admin: true}).Leases {
		if l.Idle {
			t.Errorf("lease %s idle after a busy sample: %+v", l.ID, l)
		}
	}
}

// TestUnknownIsNeverIdle: a lease is idle only after a whole window of
// measured samples. A heartbeat with no reading (its source failed), a
// reading older than maxUseAge (a source stuck on its last round), a
// lease's GPU missing from the reading, or a daemon gone silent each
// start the window again; none of them is idle.
func TestUnknownIsNeverIdle(t *testing.T) {
	ctx := context.Background()
	for name, gap := range map[string]func(a *testAllocator, server *client.Client, l api.Lease){
		"a heartbeat with no reading": func(a *testAllocator, server *client.Client, l api.Lease) {
			if err := server.Heartbeat(ctx, l.Server, api.Heartbeat{}); err != nil {
				t.Fatal(err)
			}
		},
		"a reading past maxUseAge": func(a *testAllocator, server *client.Client, l api.Lease) {
			heartbeatUse(t, server, l, 0.025, a.clock.Now().Add(-maxUseAge-api.HistoryInterval))
		},
		"the lease's GPU not read": func(a *testAllocator, server *client.Client, l api.Lease) {
			hb := api.Heartbeat{Use: &api.ServerUse{SampledAt: a.clock.Now(), GPUs: []api.GPUUse{{Index: l.GPUs[0].Index}}}}
			if err := server.Heartbeat(ctx, l.Server, hb); err != nil {
				t.Fatal(err)
			}
		},
		"a silent daemon": func(a *testAllocator, _ *client.Client, _ api.Lease) {
			a.clock.Add(a.svc.cfg.HeartbeatTimeout + time.Second)
			a.svc.tick()
		},
	} {
		t.Run(name, func(t *testing.T) {
			a, _, la, _ := consolePool(t)
			server := a.client(t, serverToken)
			idleSample := func() bool {
				heartbeatUse(t, server, la, 0.025, a.clock.Now()) // 5% of its share
				a.clock.Add(api.HistoryInterval)
				a.svc.tick()
				return a.svc.Console(Principal{Admin: true}).Models[0].IdleHeldGPUs > 0
			}
			for i := range windowSamples - 1 {
				if idleSample() {
					t.Fatalf("idle after %d samples, short of the window", i+1)
				}
			}
			gap(a, server, la)
			a.clock.Add(api.HistoryInterval)
			a.svc.tick()
			for i := range windowSamples - 1 {
				if idleSample() {
					t.Fatalf("idle %d samples after the gap: the window did not start again", i+1)
				}
			}
			if !idleSample() {
				t.Errorf("not idle after a whole window measured after the gap")
			}
		})
	}
}

// TestHistoryKeepsTheLastHour: one point per interval, the oldest dropped
// past an hour, in order.
func TestHistoryKeepsTheLastHour(t *testing.T) {
	a, _, _, _ := consolePool(t)
	for range api.HistoryLength + 5 {
		a.clock.Add(api.HistoryInterval)
		a.svc.tick()
		a.clock.Add(time.Second) // a tick inside the interval adds nothing
		a.svc.tick()
	}
	h := a.svc.Console(Principal{Admin: true}).History
	if len(h) != api.HistoryLength {
		t.Fatalf("%d points, want %d", len(h), api.HistoryLength)
	}
	for i := 1; i < len(h); i++ {
		if !h[i].At.After(h[i-1].At) {
			t.Fatalf("point %d at %v, after %v", i, h[i].At, h[i-1].At)
		}
	}
	if last := h[len(h)-1]; last.GPUs != 3 || !near(last.LeasedGPUs, 1.5) {
		t.Errorf("last point %+v, want 3 GPUs, 1.5 leased", last)
	}
}

// TestPendingSaysWhy: each waiting request with the first reason that
// keeps it from fitting.
func TestPendingSaysWhy(t *testing.T) {
	a, admin, _, _ := consolePool(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // before the allocator stops: the waiting requests hold connections
	if err := admin.RegisterServer(ctx, linkedServer("s3", inventory.Topology{{inventory.LinkNVLink, inventory.LinkPCIeSwitch}, {inventory.LinkPCIeSwitch, inventory.LinkNVLink}})); err != nil {
		t.Fatal(err)
	}
	for _, r := range []api.AcquireRequest{
		{Namespace: "team-a", GPUAmount: 2, Wait: "1m", Owner: api.Owner{Pod: "over-quota"}},                           // 0.5 used of 2: 2 more is over
		{Namespace: "team-b", GPUAmount: 1, Models: []string{"H100"}, Wait: "1m", Owner: api.Owner{Pod: "wants-h100"}}, // no H100 at all
		{Namespace: "team-b", GPUAmount: 2, Topology: "nvlink", Wait: "1m", Owner: api.Owner{Pod: "wants-nvlink"}},     // two free GPUs, not linked so
		{Namespace: "team-b", GPUAmount: 4, Wait: "1m", Owner: api.Owner{Pod: "wants-four"}},                           // no server has four
	} {
		go func() { _, _ = admin.Acquire(ctx, r) }()
	}
	waitFor(t, func() bool { return a.svc.pendingCount() == 4 })
	got := map[string]string{}
	for _, p := range a.svc.Console(Principal{Admin: true}).Pending {
		got[p.Pod] = p.Reason
		if p.Message == "" {
			t.Errorf("%s waits for %s with no message", p.Pod, p.Reason)
		}
	}
	want := map[string]string{"over-quota": api.WaitQuota, "wants-h100": api.WaitModel, "wants-nvlink": api.WaitTopology, "wants-four": api.WaitCapacity}
	for pod, reason := range want {
		if got[pod] != reason {
			t.Errorf("%s waits for %q, want %q (all: %v)", pod, got[pod], reason, got)
		}
	}
	teamA := a.svc.Console(Principal{Namespace: "team-a"})
	if len(teamA.Pending) != 1 || teamA.Pending[0].Pod != "over-quota" {
		t.Errorf("team-a sees pending %+v, want its own request alone", teamA.Pending)
	}
	if !near(teamA.Models[0].PendingGPUs, 2+2+4) {
		t.Errorf("A100 pending demand %v, want 8 (the H100 request is not the A100's)", teamA.Models[0].PendingGPUs)
	}
}

// TestHeartbeatUseIsChecked: readings out of range are refused naming the
// field; a reading of a lease not placed on the server is dropped, so a
// daemon speaks for its own server's leases only.
func TestHeartbeatUseIsChecked(t *testing.T) {
	a, _, la, lb := consolePool(t)
	ctx := context.Background()
	server := a.client(t, serverToken)
	now := a.clock.Now()
	for _, tc := range []struct {
		use  api.ServerUse
		want string
	}{
		{api.ServerUse{SampledAt: now, GPUs: []api.GPUUse{{Index: 7}}}, "use.gpus.index"},
		{api.ServerUse{SampledAt: now, GPUs: []api.GPUUse{{Index: 0, Utilization: ratio(1.5)}}}, "use.gpus.utilization"},
		{api.ServerUse{SampledAt: now, GPUs: []api.GPUUse{{Index: 0, MemoryUsedBytes: -1}}}, "use.gpus.memoryUsedBytes"},
		{api.ServerUse{SampledAt: now, Leases: []api.LeaseUse{{Lease: la.ID, GPU: 0, SMUtilization: ratio(-0.1)}}}, "use.leases.smUtilization"},
		{api.ServerUse{SampledAt: now, Leases: make([]api.LeaseUse, 100*2+1)}, "use.leases"},
		// What a probe sent: each GPU read twice, 2 TiB used of an 80Gi
		// GPU, a reading from the year 2999, or of no time at all.
		{api.ServerUse{SampledAt: now, GPUs: []api.GPUUse{{Index: 0}, {Index: 0}}}, `use.gpus.index 0 is read twice`},
		{api.ServerUse{SampledAt: now, GPUs: []api.GPUUse{{Index: 1, MemoryUsedBytes: 2 << 40}}}, `use.gpus.memoryUsedBytes 2199023255552 out of range 0..85899345920 (GPU 1's memory)`},
		{api.ServerUse{SampledAt: now, Leases: []api.LeaseUse{{Lease: la.ID, GPU: 0, MemoryUsedBytes: 80<<30 + 1}}}, "use.leases.memoryUsedBytes"},
		{api.ServerUse{SampledAt: now, Leases: []api.LeaseUse{{Lease: la.ID, GPU: 0}, {Lease: la.ID, GPU: 0}}}, "is read twice: one reading per lease and GPU"},
		{api.ServerUse{SampledAt: time.Date(2999, 1, 1, 0, 0, 0, 0, time.UTC)}, `use.sampledAt 2999-01-01T00:00:00Z is `},
		{api.ServerUse{SampledAt: now.Add(-maxUseSkew - time.Second)}, "use.sampledAt"},
		{api.ServerUse{}, `use.sampledAt "" is required`},
	} {
		err := server.Heartbeat(ctx, "s1", api.Heartbeat{Use: &tc.use})
		if !client.IsReason(err, api.ReasonInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%d GPU and %d lease readings at %v: %v, want Invalid naming %s", len(tc.use.GPUs), len(tc.use.Leases), tc.use.SampledAt, err, tc.want)
		}
	}
	// At the edges of the skew, and memory of the whole GPU: taken.
	for _, at := range []time.Time{now.Add(maxUseSkew), now.Add(-maxUseSkew)} {
		use := api.ServerUse{SampledAt: at, GPUs: []api.GPUUse{{Index: 0, MemoryUsedBytes: 80 << 30}, {Index: 1}}}
		if err := server.Heartbeat(ctx, "s1", api.Heartbeat{Use: &use}); err != nil {
			t.Errorf("a reading at %v, its GPU's memory all used: %v", at, err)
		}
	}
	// The lease on s1, of 2 GPUs, and the other one, on s2.
	mine, other := la, lb
	if mine.Server != "s1" {
		mine, other = lb, la
	}
	if mine.Server != "s1" || other.Server != "s2" {
		t.Fatalf("leases on %s and %s, want one on each server", la.Server, lb.Server)
	}
	// s1 reports a reading for the lease on s2, and one for its own lease
	// on the GPU it does not hold.
	hb := api.Heartbeat{Use: &api.ServerUse{SampledAt: a.clock.Now(), Leases: []api.LeaseUse{
		{Lease: other.ID, GPU: 0, SMUtilization: ratio(0.9)}, {Lease: mine.ID, GPU: 1 - mine.GPUs[0].Index, SMUtilization: ratio(0.9)}}}}
	if err := server.Heartbeat(ctx, "s1", hb); err != nil {
		t.Fatal(err)
	}
	for _, l := range a.svc.Console(Principal{Admin: true}).Leases {
		if l.Use != nil {
			t.Errorf("lease %s on %s took a use s1 reported for a GPU it does not hold: %v", l.ID, l.Server, *l.Use)
		}
	}
}

// TestConsolePageHoldsNoData: the page is served to anyone, with a policy
// that loads nothing from elsewhere; what it shows comes from the API.
func TestConsolePageHoldsNoData(t *testing.T) {
	a, _, la, _ := consolePool(t)
	for _, path := range []string{"/console/", "/console/app.js", "/console/style.css"} {
		resp, err := http.Get(a.url + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if csp := resp.Header.Get("Content-Security-Policy"); resp.StatusCode != http.StatusOK || !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("%s: %d, policy %q", path, resp.StatusCode, csp)
		}
	}
	if code, body := send(t, http.MethodGet, a.url+"/console/", "", ""); code != http.StatusOK || strings.Contains(body, la.ID) || strings.Contains(body, "team-a") {
		t.Errorf("the page: %d, holds data: %s", code, body)
	}
}

// TestSilentServerShowsNoUse: a server past the heartbeat timeout takes no
// lease, so its GPUs are not counted healthy or free, its free share is
// not stranded by packing, and its daemon's last reading is forgotten.
func TestSilentServerShowsNoUse(t *testing.T) {
	a, _, la, lb := consolePool(t)
	if la.Server == lb.Server {
		t.Fatal("both leases on one server")
	}
	server := a.client(t, serverToken)
	heartbeatUse(t, server, lb, 0.9, a.clock.Now())
	a.clock.Add(11 * time.Second) // past the 10 s timeout
	heartbeatUse(t, server, la, 0.25, a.clock.Now())
	a.svc.tick()
	v := a.svc.Console(Principal{Admin: true})
	healthy := 0
	for _, s := range v.Servers {
		if s.Name == lb.Server {
			if s.Healthy || s.Schedulable || s.FragmentationGPUs != 0 || s.GPUs[0].Utilization != nil {
				t.Errorf("silent %s: %+v; want unhealthy, no fragmentation, no use", s.Name, s)
			}
			continue
		}
		healthy += len(s.GPUs)
	}
	if m := v.Models[0]; m.Healthy != healthy || !near(m.UsedGPUs, 0.25) {
		t.Errorf("A100: %+v; want %d healthy (the silent server's left out) and 0.25 used", m, healthy)
	}
	for _, l := range v.Leases {
		if l.ID == lb.ID && l.Use != nil {
			t.Errorf("the silent server's lease shows use %v", *l.Use)
		}
	}
}

// TestConsoleEncodedOncePerScope: within one build, a burst of reads of
// one scope gets the bytes encoded for the first, and each scope its own.
func TestConsoleEncodedOncePerScope(t *testing.T) {
	a, _, _, _ := consolePool(t)
	for _, gzipped := range []bool{true, false} {
		admin := a.svc.ConsoleJSON(Principal{Admin: true}, gzipped)
		teamA := a.svc.ConsoleJSON(Principal{Namespace: "team-a"}, gzipped)
		if again := a.svc.ConsoleJSON(Principal{Admin: true}, gzipped); &again[0] != &admin[0] {
			t.Errorf("gzip %v: the admin's second read in the same second was encoded again", gzipped)
		}
		if again := a.svc.ConsoleJSON(Principal{Namespace: "team-a"}, gzipped); &again[0] != &teamA[0] || bytes.Equal(teamA, admin) {
			t.Errorf("gzip %v: team-a's reads: encoded again, or the admin's bytes", gzipped)
		}
		if other := a.svc.ConsoleJSON(Principal{Admin: true}, !gzipped); bytes.Equal(other, admin) {
			t.Errorf("gzip %v: the other encoding's read got these bytes", gzipped)
		}
		a.clock.Add(consoleMaxAge)
		if next := a.svc.ConsoleJSON(Principal{Admin: true}, gzipped); &next[0] == &admin[0] {
			t.Errorf("gzip %v: a read a second later got the old build's bytes", gzipped)
		}
	}
}

// TestConsoleAcceptEncoding: gzip only where the client accepts it, as
// RFC 9110 reads the header; "gzip;q=0" refuses it.
func TestConsoleAcceptEncoding(t *testing.T) {
	for _, tc := range []struct {
		headers []string
		want    bool
	}{
		{nil, false},
		{[]string{""}, false},
		{[]string{"gzip"}, true},
		{[]string{"gzip, deflate, br"}, true},
		{[]string{"br", "GZIP;q=0.5"}, true},
		{[]string{"*"}, true},
		{[]string{"gzip;q=0"}, false},
		{[]string{"gzip; q=0.000"}, false},
		{[]string{"gzip;q=bogus"}, false},
		{[]string{"identity, deflate"}, false},
		{[]string{"x-gzip-not"}, false},
		{[]string{"nogzip"}, false},
	} {
		if got := acceptsGzip(tc.headers); got != tc.want {
			t.Errorf("Accept-Encoding %q: gzip %v, want %v", tc.headers, got, tc.want)
		}
	}
}

// TestConsoleReadsBoundedPerToken: past consoleReadsPerSecond reads of
// one token within a second, the next is answered 429 with Retry-After,
// after that second; another token's read is not.
func TestConsoleReadsBoundedPerToken(t *testing.T) {
	a, _, _, _ := consolePool(t)
	h := &handler{s: a.svc, auth: NewAuthenticator(testConfig()), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	read := func(token string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/v1/console", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp := httptest.NewRecorder()
		h.console(resp, req)
		return resp
	}
	for i := range consoleReadsPerSecond {
		if resp := read(adminToken); resp.Code != http.StatusOK {
			t.Fatalf("read %d of the admin's, within the bound: %d %s", i+1, resp.Code, resp.Body)
		}
	}
	start := time.Now()
	resp := read(adminToken)
	if resp.Code != http.StatusTooManyRequests || resp.Header().Get("Retry-After") != "1" || !strings.Contains(resp.Body.String(), api.ReasonTooManyRequests) {
		t.Errorf("past the bound: %d, Retry-After %q, %s; want 429", resp.Code, resp.Header().Get("Retry-After"), resp.Body)
	}
	if waited := time.Since(start); waited < consoleRetryAfter {
		t.Errorf("the 429 came after %v, want after %v: a client that retries at once must not spin", waited, consoleRetryAfter)
	}
	if resp := read(teamAToken); resp.Code != http.StatusOK {
		t.Errorf("team-a's read beside the admin's: %d %s", resp.Code, resp.Body)
	}
	// Open mode (no --config): a forged header is no token of its own,
	// and keeps nothing in memory.
	open := &handler{s: a.svc, log: h.log}
	for i := range consoleReadsPerSecond {
		req := httptest.NewRequest(http.MethodGet, "/v1/console", nil)
		req.Header.Set("Authorization", fmt.Sprint("Bearer forged-", i))
		open.console(httptest.NewRecorder(), req)
	}
	if n := len(open.consoleReads.by); n != 1 {
		t.Errorf("open mode paces %d callers, want 1", n)
	}
}

// windowSamples is how many samples the default idle policy's window is.
const windowSamples = int(api.IdleWindow / api.HistoryInterval)
