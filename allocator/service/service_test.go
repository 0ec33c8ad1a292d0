package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/allocator/store"
	"github.com/gpupool/gpupool/inventory"
)

const (
	adminToken  = "admin-token-0123456789"
	serverToken = "server-token-0123456789"
	teamAToken  = "team-a-token-0123456789"
	teamBToken  = "team-b-token-0123456789"
	s1Token     = "s1-only-token-0123456789"
	readerToken = "reader-token-0123456789"
)

// fakeClock is a settable clock for the service.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type testAllocator struct {
	svc   *Service
	url   string
	clock *fakeClock
	reg   *prometheus.Registry
	store store.Store
	dir   string
	close func()
}

func testConfig() *FileConfig {
	return &FileConfig{
		Admin:   TokenSet{Tokens: []string{adminToken}},
		Readers: TokenSet{Tokens: []string{readerToken}},
		Servers: ServersConfig{Tokens: []string{serverToken}, PerServer: map[string][]string{"s1": {s1Token}}},
		Namespaces: map[string]NamespaceConfig{
			"team-a": {Tokens: []string{teamAToken}},
			"team-b": {Tokens: []string{teamBToken}},
		},
	}
}

// startAllocator serves a service on a real bolt store in dir.
func startAllocator(t testing.TB, dir string, clock *fakeClock, quotas map[string]allocator.Share) *testAllocator {
	t.Helper()
	return startAllocatorWith(t, dir, clock, func(c *Config) { c.Quotas = quotas })
}

// startAllocatorWith is startAllocator with the service's config as
// configure leaves it.
func startAllocatorWith(t testing.TB, dir string, clock *fakeClock, configure func(*Config)) *testAllocator {
	t.Helper()
	st, err := store.OpenBolt(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := Config{
		Store: st, Policy: "best-fit", DefaultTTL: time.Minute, MaxTTL: time.Hour, HeartbeatTimeout: 10 * time.Second,
		Clock: clock.Now, Registry: reg, Logger: log,
	}
	configure(&cfg)
	svc, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(Handler(svc, NewAuthenticator(testConfig()), reg, log))
	a := &testAllocator{svc: svc, url: srv.URL, clock: clock, reg: reg, store: st, dir: dir}
	a.close = func() { srv.Close(); _ = st.Close() }
	t.Cleanup(a.close)
	return a
}

func (a *testAllocator) client(t testing.TB, token string) *client.Client {
	t.Helper()
	c, err := client.New([]string{a.url}, token)
	if err != nil {
		t.Fatal(err)
	}
	c.Retries = 1
	return c
}

func gpuServer(name string, gpus int) api.Server {
	s := api.Server{Name: name, CPUMilli: 64000, MemoryBytes: 256 << 30}
	for i := range gpus {
		s.GPUs = append(s.GPUs, api.GPU{Index: i, UUID: "GPU-" + name + "-" + string(rune('0'+i)), Model: "A100", MemoryBytes: 80 << 30, Healthy: true})
	}
	return s
}

// linkedServer is gpuServer with a GPU per row of top, linked by it.
func linkedServer(name string, top inventory.Topology) api.Server {
	s := gpuServer(name, len(top))
	for i, links := range top {
		s.GPUs[i].Links = links
	}
	return s
}

func TestAuthAndNamespaces(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, nil)
	ctx := context.Background()
	if err := a.client(t, serverToken).RegisterServer(ctx, gpuServer("s1", 2)); err != nil {
		t.Fatal(err)
	}
	if err := a.client(t, teamAToken).RegisterServer(ctx, gpuServer("s2", 2)); !client.IsReason(err, api.ReasonForbidden) {
		t.Errorf("a namespace token registered a server: %v", err)
	}
	if _, err := a.client(t, "").Pool(ctx); !client.IsReason(err, api.ReasonUnauthorized) {
		t.Errorf("no token: %v, want Unauthorized", err)
	}
	if _, err := a.client(t, "wrong-token-0123456789").Leases(ctx, client.LeaseFilter{}); !client.IsReason(err, api.ReasonUnauthorized) {
		t.Errorf("unknown token: %v, want Unauthorized", err)
	}
	teamA, teamB := a.client(t, teamAToken), a.client(t, teamBToken)
	l, err := teamA.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 50})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := teamA.Acquire(ctx, api.AcquireRequest{Namespace: "team-b", GPUAmount: 1}); !client.IsReason(err, api.ReasonForbidden) {
		t.Errorf("team-a acquired in team-b: %v", err)
	}
	// Another namespace's lease is NotFound, not Forbidden: a 403 would
	// tell which lease IDs other namespaces hold.
	if _, err := teamB.Lease(ctx, l.ID); !client.IsReason(err, api.ReasonNotFound) {
		t.Errorf("team-b read team-a's lease: %v", err)
	}
	_ = teamB.Release(ctx, l.ID)
	if _, err := teamA.Lease(ctx, l.ID); err != nil {
		t.Errorf("team-b released team-a's lease: %v", err)
	}
	if ls, err := teamB.Leases(ctx, client.LeaseFilter{}); err != nil || len(ls) != 0 {
		t.Errorf("team-b lists %d leases (%v), want none of team-a's", len(ls), err)
	}
	if _, err := teamB.Leases(ctx, client.LeaseFilter{Namespace: "team-a"}); !client.IsReason(err, api.ReasonForbidden) {
		t.Errorf("team-b listed team-a: %v", err)
	}
	if ls, err := a.client(t, adminToken).Leases(ctx, client.LeaseFilter{}); err != nil || len(ls) != 1 {
		t.Errorf("admin lists %d leases (%v), want 1", len(ls), err)
	}
	if err := teamA.Release(ctx, l.ID); err != nil {
		t.Errorf("team-a cannot release its own lease: %v", err)
	}
}

func TestBadInputNamesTheField(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, nil)
	for _, tc := range []struct {
		body, field, message string
	}{
		{`{"namespace":"team-a","gpuAmount":1,"gpuPercent":120}`, "gpu-percent", "gpu-percent 120 out of range 1..100"},
		{`{"namespace":"team-a","gpuAmount":1,"gpuMemory":"lots"}`, "gpu-memory", "gpu-memory lots is not a quantity"},
		{`{"namespace":"team-a","gpuAmount":1,"ttl":"forever"}`, "ttl", "ttl forever must be a duration"},
		{`{"namespace":"team-a","gpuAmount":1,"wait":"2h"}`, "wait", "wait 2h must be a duration such as 30s or 5m, in 0..1h0m0s"},
		{`{"namespace":"team-a","gpuAmount":1,"cpu":"-1"}`, "cpu", "cpu -1 out of range 0..1M"},
		{`{"namespace":"team-a","gpuAmount":-2}`, "gpu-amount", "gpu-amount -2 out of range 1..64"},
		{`{"namespace":"team-a","gpuAmount":1,"bogus":1}`, "", `unknown field`},
		{`not json`, "", "body is not valid JSON"},
		// Each of these was once accepted: a whole GPU for 0%, huge
		// quantities wrapped to 0, a lease expired on arrival, a lease of
		// no GPU outside every quota, bodies with more than one value.
		{`{"namespace":"team-a","gpuAmount":1,"gpuPercent":0}`, "gpu-percent", "gpu-percent 0 out of range 1..100"},
		{`{"namespace":"team-a","gpuAmount":1,"cpu":"1e30"}`, "cpu", "cpu 1e30 out of range 0..1M"},
		{`{"namespace":"team-a","gpuAmount":1,"cpu":"1e16"}`, "cpu", "cpu 1e16 out of range 0..1M"},
		{`{"namespace":"team-a","gpuAmount":1,"memory":"1e19"}`, "memory", "memory 1e19 out of range 0..1Ei"},
		{`{"namespace":"team-a","gpuAmount":1,"gpuMemory":"1Ei"}`, "gpu-memory", "gpu-memory 1Ei out of range 1..1Pi"},
		{`{"namespace":"team-a","gpuAmount":1,"gpuMemory":"8e18"}`, "gpu-memory", "gpu-memory 8e18 out of range 1..1Pi"},
		{`{"namespace":"team-a","gpuAmount":1,"ttl":"1ns"}`, "ttl", "ttl 1ns is shorter than 1s"},
		{`{"namespace":"team-a","gpuAmount":0,"cpu":"1"}`, "gpu-amount", "gpu-amount 0 out of range 1..64"},
		{`{"namespace":"team-a","gpuAmount":1,"owner":{"labels":{"app name":"x"}}}`, "owner.labels", "owner.labels app name is not a label key"},
		{`{"namespace":"team-a","gpuAmount":1,"owner":{"labels":{"app":"a b"}}}`, "owner.labels.app", "owner.labels.app a b is not a label value"},
		{`{"namespace":"team-a","gpuAmount":1,"ttl":"1m","untilReleased":true}`, "ttl", "ttl 1m0s cannot be combined with untilReleased"},
		{`{"namespace":"team-a","gpuAmount":2,"topology":"nvswitch"}`, "topology", "topology nvswitch is not one of any, socket, pcie-switch, nvlink"},
		{`{"namespace":"team-a","gpuAmount":1,"servers":["s1",""]}`, "servers", `servers \"\" must be 1..253 characters`},
		{`{"namespace":"team-a","gpuAmount":1} garbage`, "", "more than one JSON value"},
		{`{"namespace":"team-a","gpuAmount":1}{"namespace":"team-a","gpuAmount":1}`, "", "more than one JSON value"},
		{`{"namespace":"team-a","gpuAmount":1,"gpuAmount":8}`, "", `key \"gpuAmount\" given twice`},
		{`{"namespace":"team-a","GPUAmount":8}`, "", `key \"GPUAmount\": field names are case-sensitive; did you mean \"gpuAmount\"?`},
	} {
		status, body := send(t, http.MethodPost, a.url+"/v1/leases", teamAToken, tc.body)
		if status != http.StatusBadRequest || !strings.Contains(body, tc.message) || !strings.Contains(body, `"field":"`+tc.field+`"`) && tc.field != "" {
			t.Errorf("%s: %d %s; want 400 naming %q: %q", tc.body, status, body, tc.field, tc.message)
		}
	}
}

// send makes a request of the API as token, with body, as a client other
// than allocator/client would, and returns the answer's status and body.
func send(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(answer)
}

// TestAcquireOnAnEmptyPool: what a new install meets before its first
// daemon registers is a refusal that says so (it once was a panic in the
// handler, which the client saw as a dropped connection).
func TestAcquireOnAnEmptyPool(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Now()}, nil)
	code, body := send(t, http.MethodPost, a.url+"/v1/leases", teamAToken, `{"namespace":"team-a","gpuAmount":1}`)
	if code != http.StatusConflict || !strings.Contains(body, "no server has 1 free GPU") {
		t.Errorf("acquire on an empty pool: %d %s, want 409 no server has 1 free GPU", code, body)
	}
}

func TestWaitQueuesUntilShareFrees(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, map[string]allocator.Share{"team-a": allocator.WholeGPU})
	ctx := context.Background()
	admin := a.client(t, adminToken)
	if err := admin.RegisterServer(ctx, gpuServer("s1", 1)); err != nil {
		t.Fatal(err)
	}
	first, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 80})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 50}); !client.IsReason(err, api.ReasonQuotaExceeded) {
		t.Fatalf("over quota without --wait: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 50, Wait: "30s"})
		got <- err
	}()
	waitFor(t, func() bool { return a.svc.pendingCount() == 1 })
	select {
	case err := <-got:
		t.Fatalf("the queued request returned before anything was released: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := admin.Release(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Errorf("the queued request failed after the release: %v", err)
	}
}

// TestWaitingIsBounded: acquisitions queue for capacity up to the bound
// of their namespace and the bound of all; past either, one is refused at
// once, naming the bound, and a slot that frees takes a new one.
func TestWaitingIsBounded(t *testing.T) {
	svc, _ := newFailingService(t, Config{MaxWaiting: 3, MaxWaitingPerNamespace: 2})
	ctx := context.Background()
	whole := func(ns string) allocator.Request { return allocator.Request{Namespace: ns, GPUs: 2} }
	held, err := svc.Acquire(ctx, whole("team-a"), 0)
	if err != nil {
		t.Fatal(err)
	}
	queued := make(chan error, 4)
	wait := func(ns string) {
		go func() {
			_, err := svc.Acquire(ctx, whole(ns), time.Minute)
			queued <- err
		}()
	}
	wait("team-a")
	wait("team-a")
	waitFor(t, func() bool { return svc.pendingCount() == 2 })
	_, err = svc.Acquire(ctx, whole("team-a"), time.Minute)
	var tooMany *TooManyWaitingError
	if !errors.As(err, &tooMany) || tooMany.Limit != "max-waiting-per-namespace" || kindOf(err).status != http.StatusTooManyRequests ||
		err.Error() != "no server has 2 free GPUs; not queued: namespace team-a has 2 requests waiting, the most that max-waiting-per-namespace allows; retry later, or without waiting" {
		t.Errorf("a third of team-a's waiting: %v; want refused by max-waiting-per-namespace", err)
	}
	wait("team-b")
	waitFor(t, func() bool { return svc.pendingCount() == 3 })
	_, err = svc.Acquire(ctx, whole("team-c"), time.Minute)
	if !errors.As(err, &tooMany) || tooMany.Limit != "max-waiting" ||
		err.Error() != "no server has 2 free GPUs; not queued: the allocator has 3 requests waiting, the most that max-waiting allows; retry later, or without waiting" {
		t.Errorf("a fourth waiting: %v; want refused by max-waiting", err)
	}
	if _, err := svc.Acquire(ctx, whole("team-c"), 0); !isA[*allocator.NoCapacityError](err) {
		t.Errorf("an acquisition that does not wait: %v; want no capacity, as ever", err)
	}

	if _, err := svc.Release(ctx, Principal{Admin: true}, held.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-queued; err != nil {
		t.Fatalf("the first queued after the release: %v", err)
	}
	waitFor(t, func() bool { return svc.pendingCount() == 2 })
	wait("team-c")
	waitFor(t, func() bool { return svc.pendingCount() == 3 })
}

// TestRequiredLinkQueuesUntilLinkedGPUsFree: a request for GPUs behind
// one PCIe switch waits while the free GPUs are on different switches,
// rather than taking them, and gets a switch's pair once one frees.
func TestRequiredLinkQueuesUntilLinkedGPUsFree(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, nil)
	ctx := context.Background()
	admin := a.client(t, adminToken)
	if err := admin.RegisterServer(ctx, linkedServer("s1", inventory.PCIeTopology(4, 2, 1))); err != nil {
		t.Fatal(err)
	}
	var singles []api.Lease
	for range 3 {
		l, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1})
		if err != nil {
			t.Fatal(err)
		}
		singles = append(singles, l)
	}
	if err := admin.Release(ctx, singles[1].ID); err != nil { // gpu1 and gpu3 free, on two switches
		t.Fatal(err)
	}
	pair := api.AcquireRequest{Namespace: "team-a", GPUAmount: 2, Topology: "pcie-switch"}
	if _, err := admin.Acquire(ctx, pair); !client.IsReason(err, api.ReasonNoCapacity) || !strings.Contains(err.Error(), "linked by pcie-switch") {
		t.Fatalf("a pair behind one switch without --wait: %v", err)
	}
	got := make(chan api.Lease, 1)
	go func() {
		pair.Wait = "30s"
		l, err := admin.Acquire(ctx, pair)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitFor(t, func() bool { return a.svc.pendingCount() == 1 })
	if err := admin.Release(ctx, singles[0].ID); err != nil {
		t.Fatal(err)
	}
	if l := <-got; len(l.GPUs) != 2 || l.GPUs[0].Index != 0 || l.GPUs[1].Index != 1 {
		t.Errorf("the queued pair got %+v, want gpu0 and gpu1", l.GPUs)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 5s")
}

func TestRecoveryRestoresLeasesAndExpiresThoseThatRanOut(t *testing.T) {
	dir, clock := t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}
	a := startAllocator(t, dir, clock, nil)
	ctx := context.Background()
	admin := a.client(t, adminToken)
	if err := admin.RegisterServer(ctx, gpuServer("s1", 2)); err != nil {
		t.Fatal(err)
	}
	short, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 30, TTL: "10s"})
	if err != nil {
		t.Fatal(err)
	}
	long, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 60, TTL: "10m", IdempotencyKey: "job-1"})
	if err != nil {
		t.Fatal(err)
	}
	a.close()

	clock.Add(time.Minute) // down for a minute: the 10s lease ran out
	b := startAllocator(t, dir, clock, nil)
	admin = b.client(t, adminToken)
	leases, err := admin.Leases(ctx, client.LeaseFilter{})
	if err != nil || len(leases) != 1 || leases[0].ID != long.ID {
		t.Fatalf("after restart: %v leases (%v), want only %s (%s expired)", leases, err, long.ID, short.ID)
	}
	retry, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 60, TTL: "10m", IdempotencyKey: "job-1"})
	if err != nil || retry.ID != long.ID {
		t.Errorf("retry of job-1 after restart: %s (%v), want the same lease %s", retry.ID, err, long.ID)
	}
	next, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 10})
	if err != nil || next.ID == short.ID || next.ID == long.ID {
		t.Errorf("new lease after restart got ID %s (%v): IDs must not be reused", next.ID, err)
	}
	if err := b.svc.CheckInvariants(); err != nil {
		t.Error(err)
	}
}

// An allocator that starts on leases already granted (restarted, or a
// replica taking over) places against them from its first grant, not
// against an empty workload.
func TestRecoveryLearnsTheWorkloadFromTheLeases(t *testing.T) {
	dir, clock := t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}
	a := startAllocator(t, dir, clock, nil)
	ctx := context.Background()
	admin := a.client(t, adminToken)
	if err := admin.RegisterServer(ctx, gpuServer("s1", 4)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 25, TTL: "10m"}); err != nil {
			t.Fatal(err)
		}
	}
	a.close()

	b := startAllocator(t, dir, clock, nil)
	b.svc.mu.Lock()
	w := b.svc.estimate.Current()
	b.svc.mu.Unlock()
	if len(w) != 1 || w[0].GPUs != 1 || w[0].PerGPU != 250 {
		t.Errorf("after a restart the expected workload is %+v, want the leases' quarter GPUs", w)
	}
}

func TestSilentServerTakesNoNewLeases(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	a := startAllocator(t, t.TempDir(), clock, nil)
	ctx := context.Background()
	admin := a.client(t, adminToken)
	if err := admin.RegisterServer(ctx, gpuServer("s1", 1)); err != nil {
		t.Fatal(err)
	}
	clock.Add(11 * time.Second)
	a.svc.tick()
	if _, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1}); !client.IsReason(err, api.ReasonNoCapacity) {
		t.Errorf("placed on a server silent for 11s: %v", err)
	}
	if err := admin.Heartbeat(ctx, "s1", api.Heartbeat{GPUs: []api.GPUHealth{{Index: 0, Healthy: true}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1}); err != nil {
		t.Errorf("heartbeat did not bring the server back: %v", err)
	}
	if err := admin.Heartbeat(ctx, "nope", api.Heartbeat{}); !client.IsReason(err, api.ReasonNotFound) {
		t.Errorf("heartbeat of an unknown server: %v, want NotFound (the daemon then registers)", err)
	}
}

// TestServerStatus: GET /v1/servers/{name} answers one server as the
// pool's status shows it, to every token, with a GPU the daemon reports
// unhealthy and a server gone silent as such.
func TestServerStatus(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	a := startAllocator(t, t.TempDir(), clock, nil)
	ctx := context.Background()
	admin := a.client(t, adminToken)
	for _, s := range []api.Server{gpuServer("s1", 2), gpuServer("s2", 1)} {
		if err := admin.RegisterServer(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 50, Servers: []string{"s1"}}); err != nil {
		t.Fatal(err)
	}
	if err := admin.Heartbeat(ctx, "s1", api.Heartbeat{GPUs: []api.GPUHealth{{Index: 1, Healthy: false}}}); err != nil {
		t.Fatal(err)
	}
	pool, err := admin.Pool(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{adminToken, serverToken, s1Token, teamBToken} {
		got, err := a.client(t, token).Server(ctx, "s1")
		if err != nil || !reflect.DeepEqual(got, pool.Servers[0]) {
			t.Errorf("token %s reads s1 as %+v (%v), want the pool's %+v", token[:6], got, err, pool.Servers[0])
		}
	}
	if got := pool.Servers[0]; got.Leases != 1 || got.GPUs[1].Healthy || !got.Schedulable {
		t.Errorf("s1: %+v, want one lease, GPU 1 unhealthy, schedulable", got)
	}
	if _, err := admin.Server(ctx, "nope"); !client.IsReason(err, api.ReasonNotFound) {
		t.Errorf("an unknown server: %v, want NotFound", err)
	}
	clock.Add(11 * time.Second)
	a.svc.tick()
	if got, err := admin.Server(ctx, "s2"); err != nil || got.Schedulable {
		t.Errorf("s2 silent for 11s: %+v (%v), want not schedulable", got, err)
	}
}

func podOwner(pod string) api.Owner {
	return api.Owner{Pod: pod, UID: "uid-" + pod, Labels: map[string]string{"app": "tf-training"}}
}

// failingStore fails every Apply once told to, the next unavailable ones
// as a store that may come back, holds them while held is open, and
// records what it wrote.
type failingStore struct {
	store.Store
	mu          sync.Mutex
	failing     bool
	unavailable int
	held        chan struct{}
	written     int
}

func (f *failingStore) Apply(ctx context.Context, changes []store.Change) error {
	f.mu.Lock()
	held := f.held
	f.mu.Unlock()
	if held != nil {
		<-held
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failing {
		return errors.New("disk on fire")
	}
	if f.unavailable > 0 {
		f.unavailable--
		return fmt.Errorf("%w: etcdserver: request timed out", store.ErrUnavailable)
	}
	f.written += len(changes)
	return f.Store.Apply(ctx, changes)
}

// TestStoreFailureStopsEverything: after a failed write nothing more is
// written or acknowledged (a later change could depend on the lost one),
// every operation answers 503, and Failed tells the process to restart.
func TestStoreFailureStopsEverything(t *testing.T) {
	svc, st := newFailingService(t, Config{})
	ctx := context.Background()
	st.mu.Lock()
	st.failing = true
	st.mu.Unlock()
	if _, err := svc.Acquire(ctx, allocator.Request{Namespace: "ml", GPUs: 1}, 0); !errors.Is(err, errUnavailable) {
		t.Fatalf("acquire during the failure: %v, want unavailable", err)
	}
	select {
	case <-svc.Failed():
	case <-time.After(5 * time.Second):
		t.Fatal("Failed() not closed after the store failed")
	}
	st.mu.Lock()
	st.failing, st.written = false, 0 // the disk comes back: still nothing may be written
	st.mu.Unlock()
	if err := svc.RegisterServer(ctx, gpuServer("s2", 2).Core()); !errors.Is(err, errUnavailable) {
		t.Errorf("register after the failure: %v, want unavailable", err)
	}
	if _, err := svc.Acquire(ctx, allocator.Request{Namespace: "ml", GPUs: 1}, 0); !errors.Is(err, errUnavailable) {
		t.Errorf("acquire after the failure: %v, want unavailable", err)
	}
	if st.written != 0 {
		t.Errorf("%d changes written after the store failed", st.written)
	}
	if n := testutil.ToFloat64(svc.metrics.acquisitions.WithLabelValues("rejected", "unavailable")); n != 2 {
		t.Errorf("%v acquisitions counted unavailable, want the 2 answered so", n)
	}
}

// TestEveryWriteEndsTheLeasesDue: a heartbeat, like every write, ends the
// leases whose time ran out and makes their end durable, before any tick.
func TestEveryWriteEndsTheLeasesDue(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, nil)
	ctx := context.Background()
	admin := a.client(t, adminToken)
	if err := admin.RegisterServer(ctx, gpuServer("s1", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, TTL: "10s"}); err != nil {
		t.Fatal(err)
	}
	a.clock.Add(11 * time.Second)
	if err := admin.Heartbeat(ctx, "s1", api.Heartbeat{}); err != nil {
		t.Fatal(err)
	}
	st, err := a.store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Leases) != 0 {
		t.Errorf("the store still holds %d leases whose time ran out before the heartbeat", len(st.Leases))
	}
	if n := testutil.ToFloat64(a.svc.metrics.expirations); n != 1 {
		t.Errorf("%v expirations counted, want 1", n)
	}
}

// TestPanickingChangeFailsTheService: a change that panics halfway (here
// after taking a lease in the pool) is answered unavailable, not with a
// dropped connection; the service then writes nothing more, and a service
// recovered from the store has every acknowledged change and none of the
// half-made one.
func TestPanickingChangeFailsTheService(t *testing.T) {
	svc, _ := newFailingService(t, Config{})
	ctx := context.Background()
	kept, err := svc.Acquire(ctx, allocator.Request{Namespace: "ml", GPUs: 1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = svc.write(ctx, func(now time.Time) (store.Change, error) {
		if _, err := svc.pool.Acquire(now, allocator.Request{Namespace: "ml", GPUs: 1}); err != nil {
			t.Errorf("the half-made change: %v", err)
		}
		panic("a bug halfway through a change")
	})
	if !errors.Is(err, errUnavailable) {
		t.Fatalf("a panicking change answered %v, want unavailable", err)
	}
	select {
	case <-svc.Failed():
	default:
		t.Fatal("Failed() not closed after a change panicked")
	}
	if _, err := svc.Acquire(ctx, allocator.Request{Namespace: "ml", GPUs: 1}, 0); !errors.Is(err, errUnavailable) {
		t.Errorf("acquire after the panic: %v, want unavailable", err)
	}
	svc.Close()

	recovered, err := New(ctx, svc.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer recovered.Close()
	leases := recovered.Leases(LeaseFilter{})
	if len(leases) != 1 || leases[0].ID != kept.ID {
		t.Errorf("recovered leases %v, want the acknowledged %s alone", leases, kept.ID)
	}
	if err := recovered.CheckInvariants(); err != nil {
		t.Error(err)
	}
}

// newFailingService serves a failingStore over bolt with one server of two
// GPUs registered.
func newFailingService(t *testing.T, cfg Config) (*Service, *failingStore) {
	t.Helper()
	bolt, err := store.OpenBolt(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bolt.Close() })
	st := &failingStore{Store: bolt}
	cfg.Store, cfg.Policy, cfg.DefaultTTL, cfg.MaxTTL, cfg.HeartbeatTimeout = st, "best-fit", time.Minute, time.Hour, time.Minute
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.RegisterServer(context.Background(), gpuServer("s1", 2).Core()); err != nil {
		t.Fatal(err)
	}
	return svc, st
}

// TestUnavailableStoreIsRetried: a store error that may pass (an etcd
// leader election) is retried; the request waits and is acknowledged only
// once its grant is durable, and the service goes on serving.
func TestUnavailableStoreIsRetried(t *testing.T) {
	svc, st := newFailingService(t, Config{})
	st.mu.Lock()
	st.unavailable = 3
	st.mu.Unlock()
	l, err := svc.Acquire(context.Background(), allocator.Request{Namespace: "ml", GPUs: 1}, 0)
	if err != nil {
		t.Fatalf("acquire while the store comes back: %v", err)
	}
	select {
	case <-svc.Failed():
		t.Fatal("the service failed on errors that passed")
	default:
	}
	stored, err := st.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(stored.Leases) != 1 || stored.Leases[0].ID != l.ID {
		t.Errorf("stored leases %+v, want the acknowledged %s", stored.Leases, l.ID)
	}
	if n := testutil.ToFloat64(svc.metrics.storeErrors); n != 3 {
		t.Errorf("%v store errors counted, want the 3 attempts that failed", n)
	}
}

// TestUnavailableStoreFailsAfterStoreRetry: a store that does not come
// back within StoreRetry fails the service; nothing is acknowledged.
func TestUnavailableStoreFailsAfterStoreRetry(t *testing.T) {
	svc, st := newFailingService(t, Config{StoreRetry: 300 * time.Millisecond})
	st.mu.Lock()
	st.unavailable = math.MaxInt
	st.mu.Unlock()
	if _, err := svc.Acquire(context.Background(), allocator.Request{Namespace: "ml", GPUs: 1}, 0); !errors.Is(err, errUnavailable) {
		t.Fatalf("acquire while the store stays away: %v, want unavailable", err)
	}
	select {
	case <-svc.Failed():
	case <-time.After(5 * time.Second):
		t.Fatal("Failed() not closed after the store stayed away")
	}
}

// TestClosedServiceMakesWayForANewOne: a replica that stops leading closes
// its service: what it is asked from then on is unavailable, and a new
// service, recovered from the store, registers its metrics on the same
// registry.
func TestClosedServiceMakesWayForANewOne(t *testing.T) {
	reg := prometheus.NewRegistry()
	svc, st := newFailingService(t, Config{Registry: reg})
	l, err := svc.Acquire(context.Background(), allocator.Request{Namespace: "ml", GPUs: 1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	svc.Close()
	if _, err := svc.Acquire(context.Background(), allocator.Request{Namespace: "ml", GPUs: 1}, 0); !errors.Is(err, errUnavailable) {
		t.Errorf("acquire from a closed service: %v, want unavailable", err)
	}
	next, err := New(context.Background(), Config{Store: st, Policy: "best-fit", DefaultTTL: time.Minute, MaxTTL: time.Hour,
		HeartbeatTimeout: time.Minute, Registry: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("a new service on the closed one's registry: %v", err)
	}
	defer next.Close()
	if got, err := next.Lease(Principal{Admin: true}, l.ID); err != nil || got.Server != l.Server {
		t.Errorf("the new service has lease %s as %+v (%v), want it on %s", l.ID, got, err, l.Server)
	}
}
