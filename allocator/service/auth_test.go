package service

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/allocator/store"
	"github.com/gpupool/gpupool/internal/httpserver"
	"github.com/gpupool/gpupool/inventory"
)

// TestServerTokensReadTheirServersLeases: a daemon holding the servers
// token lists the leases placed on the server it names, of every
// namespace, and may not renew or release them; a per-server token speaks
// for its own server only.
func TestServerTokensReadTheirServersLeases(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, nil)
	ctx := context.Background()
	shared, bound, admin := a.client(t, serverToken), a.client(t, s1Token), a.client(t, adminToken)
	if err := bound.RegisterServer(ctx, gpuServer("s1", 1)); err != nil {
		t.Fatalf("s1's own token cannot register s1: %v", err)
	}
	if err := shared.RegisterServer(ctx, gpuServer("s2", 1)); err != nil {
		t.Fatal(err)
	}
	var onS1, onS2 api.Lease
	for _, ns := range []string{"team-a", "team-b"} {
		for range 2 {
			l, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: ns, GPUAmount: 1, GPUPercent: 25})
			if err != nil {
				t.Fatal(err)
			}
			if l.Server == "s1" {
				onS1 = l
			} else {
				onS2 = l
			}
		}
	}
	count := func(c *client.Client, f client.LeaseFilter) (int, error) {
		ls, err := c.Leases(ctx, f)
		for _, l := range ls {
			if f.Server != "" && l.Server != f.Server {
				t.Errorf("listing %s returned %s's lease %s", f.Server, l.Server, l.ID)
			}
		}
		return len(ls), err
	}
	all, _ := admin.Leases(ctx, client.LeaseFilter{})
	want := map[string]int{}
	for _, l := range all {
		want[l.Server]++
	}
	if n, err := count(shared, client.LeaseFilter{Server: "s1"}); err != nil || n != want["s1"] {
		t.Errorf("servers token lists %d leases on s1 (%v), want %d", n, err, want["s1"])
	}
	if _, err := shared.Leases(ctx, client.LeaseFilter{}); !client.IsReason(err, api.ReasonInvalid) {
		t.Errorf("servers token listed every server's leases: %v, want Invalid naming server", err)
	}
	if n, err := count(bound, client.LeaseFilter{}); err != nil || n != want["s1"] {
		t.Errorf("s1's token lists %d leases (%v), want s1's %d", n, err, want["s1"])
	}
	if _, err := bound.Leases(ctx, client.LeaseFilter{Server: "s2"}); !client.IsReason(err, api.ReasonForbidden) {
		t.Errorf("s1's token listed s2's leases: %v", err)
	}
	if _, err := shared.Lease(ctx, onS1.ID); err != nil {
		t.Errorf("servers token cannot read lease %s on s1: %v", onS1.ID, err)
	}
	if _, err := bound.Lease(ctx, onS2.ID); !client.IsReason(err, api.ReasonNotFound) {
		t.Errorf("s1's token read s2's lease: %v", err)
	}
	if _, err := shared.Renew(ctx, onS1.ID, 0); !client.IsReason(err, api.ReasonNotFound) {
		t.Errorf("servers token renewed a lease: %v", err)
	}
	_ = shared.Release(ctx, onS1.ID) // NotFound, which the client takes as done
	if _, err := admin.Lease(ctx, onS1.ID); err != nil {
		t.Errorf("servers token released a lease: %v", err)
	}
	// A per-server token neither registers nor heart-beats another server.
	if err := bound.RegisterServer(ctx, gpuServer("s2", 1)); !client.IsReason(err, api.ReasonForbidden) {
		t.Errorf("s1's token registered s2: %v", err)
	}
	if err := bound.Heartbeat(ctx, "s2", api.Heartbeat{GPUs: []api.GPUHealth{{Index: 0, Healthy: false}}}); !client.IsReason(err, api.ReasonForbidden) {
		t.Errorf("s1's token marked s2's GPU unhealthy: %v", err)
	}
	if p, _ := admin.Pool(ctx); !p.Servers[1].GPUs[0].Healthy {
		t.Error("s2's GPU is unhealthy after a refused heartbeat")
	}
	if _, err := a.client(t, teamAToken).Leases(ctx, client.LeaseFilter{Server: "s1"}); err != nil {
		t.Errorf("team-a cannot list its leases on s1: %v", err)
	}
}

// TestPoolHidesOtherNamespacesPending: who waits for share (pod, UID,
// labels) is shown to its own namespace and to admins only.
func TestPoolHidesOtherNamespacesPending(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, nil)
	ctx := context.Background()
	if err := a.client(t, serverToken).RegisterServer(ctx, gpuServer("s1", 1)); err != nil {
		t.Fatal(err)
	}
	teamA := a.client(t, teamAToken)
	if _, err := teamA.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1}); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := teamA.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, Wait: "10s",
			Owner: api.Owner{Pod: "secret-pod", UID: "uid-1", Labels: map[string]string{"app": "secret"}}})
		waiting <- err
	}()
	pending := func(token string) int {
		p, err := a.client(t, token).Pool(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(p.Pending)
	}
	deadline := time.Now().Add(5 * time.Second)
	for pending(adminToken) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the request never queued")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for token, want := range map[string]int{adminToken: 1, teamAToken: 1, teamBToken: 0, serverToken: 0, s1Token: 0} {
		if got := pending(token); got != want {
			t.Errorf("token %s sees %d pending requests, want %d", token[:6], got, want)
		}
	}
	ls, _ := teamA.Leases(ctx, client.LeaseFilter{})
	_ = teamA.Release(ctx, ls[0].ID)
	if err := <-waiting; err != nil {
		t.Error(err)
	}
}

// TestUnroutedRequestsAnswerJSON: a wrong path or method gets the API's
// JSON error, as every other failure does.
func TestUnroutedRequestsAnswerJSON(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, nil)
	for _, tc := range []struct {
		method, path string
		status       int
		reason       string
		allow        string
	}{
		{http.MethodGet, "/v1/nothing", http.StatusNotFound, api.ReasonNotFound, ""},
		{http.MethodDelete, "/v1/pool", http.StatusMethodNotAllowed, api.ReasonMethodNotAllowed, "GET"},
		{http.MethodPut, "/v1/leases", http.StatusMethodNotAllowed, api.ReasonMethodNotAllowed, "GET, POST"},
	} {
		req, _ := http.NewRequest(tc.method, a.url+tc.path, nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e api.Error
		derr := json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != tc.status || derr != nil || e.Reason != tc.reason || resp.Header.Get("Allow") != tc.allow ||
			resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d %s %+v (%v) Allow %q; want %d %s Allow %q", tc.method, tc.path, resp.StatusCode,
				resp.Header.Get("Content-Type"), e, derr, resp.Header.Get("Allow"), tc.status, tc.reason, tc.allow)
		}
	}
}

// TestRegistrationRefusesBadServers: names are node names, and a GPU's
// memory is bounded so that no lease can get a negative share of it.
func TestRegistrationRefusesBadServers(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, nil)
	huge := gpuServer("huge", 1)
	huge.GPUs[0].MemoryBytes = 1 << 62
	badLabel := gpuServer("labelled", 1)
	badLabel.Labels = map[string]string{"not a key": "x"}
	for _, tc := range []struct {
		srv   api.Server
		field string
	}{
		{gpuServer("GPU_1", 1), "server.name"},
		{gpuServer("-gpu1", 1), "server.name"},
		{gpuServer("a..b", 1), "server.name"},
		{huge, "server.gpus[0].memoryBytes"},
		{badLabel, "server.labels"},
	} {
		body, _ := json.Marshal(tc.srv)
		status, out := send(t, http.MethodPut, a.url+"/v1/servers/"+tc.srv.Name, serverToken, string(body))
		if status != http.StatusBadRequest || !strings.Contains(out, `"field":"`+tc.field+`"`) {
			t.Errorf("registering %q: %d %s; want 400 naming %s", tc.srv.Name, status, out, tc.field)
		}
	}
	if p, _ := a.client(t, adminToken).Pool(context.Background()); len(p.Servers) != 0 {
		t.Errorf("%d bad servers registered", len(p.Servers))
	}
}

// TestQueuedRequestOutlivesWriteTimeout: the server's write timeout cuts
// a stalled client off, but a request queued with wait extends its own
// deadline by the wait.
func TestQueuedRequestOutlivesWriteTimeout(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	const writeTimeout = 2 * time.Second
	srv := httpserver.New(Handler(a.svc, NewAuthenticator(testConfig()), a.reg, log),
		httpserver.Timeouts{ReadHeader: 10 * time.Second, Read: 10 * time.Second, Write: writeTimeout, Idle: 10 * time.Second})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	c, err := client.New([]string{"http://" + ln.Addr().String()}, adminToken)
	if err != nil {
		t.Fatal(err)
	}
	c.Retries = 1
	ctx := context.Background()
	if err := c.RegisterServer(ctx, gpuServer("s1", 1)); err != nil {
		t.Fatal(err)
	}
	first, err := c.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1})
	if err != nil {
		t.Fatal(err)
	}
	queued := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, Wait: "1m"})
		queued <- err
	}()
	waitFor(t, func() bool { return a.svc.pendingCount() == 1 })
	time.Sleep(writeTimeout + time.Second) // any longer only tests more
	if err := c.Release(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-queued; err != nil {
		t.Errorf("a request queued past the write timeout: %v", err)
	}
}

// TestStoredServerFromBeforeNameChecksStillStarts: a server an older
// allocator stored under a name today's checks refuse is restored, keeps
// its leases and heart-beats; only registering it anew is refused.
func TestStoredServerFromBeforeNameChecksStillStarts(t *testing.T) {
	dir, clock := t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}
	st, err := store.OpenBolt(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	legacy := gpuServer("GPU_Node1", 1)
	lease := allocator.Lease{ID: "lease-000001", Namespace: "team-a", Server: legacy.Name, TTL: time.Hour, ExpiresAt: clock.Now().Add(time.Hour),
		GPUs: []allocator.LeaseGPU{{UUID: legacy.GPUs[0].UUID, Model: "A100", Share: 500, MemoryBytes: 40 << 30}}}
	if err := st.Apply(context.Background(), []store.Change{{Servers: []inventory.Server{legacy.Core()}, Leases: []allocator.Lease{lease}, NextID: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	a := startAllocator(t, dir, clock, nil)
	ctx := context.Background()
	admin := a.client(t, adminToken)
	if _, err := admin.Lease(ctx, lease.ID); err != nil {
		t.Errorf("the stored lease on %s is gone: %v", legacy.Name, err)
	}
	if err := admin.Heartbeat(ctx, legacy.Name, api.Heartbeat{GPUs: []api.GPUHealth{{Index: 0, Healthy: false}}}); err != nil {
		t.Errorf("heartbeat of the restored %s: %v", legacy.Name, err)
	}
	if err := admin.RegisterServer(ctx, legacy); !client.IsReason(err, api.ReasonInvalid) {
		t.Errorf("registering %s anew: %v, want Invalid", legacy.Name, err)
	}
}

// TestReadersTokenOnlyReads: a readers token (the metrics adapter's) reads
// what an admin reads, every namespace's leases, the pool, the quotas and
// the console, and is refused with 403 on every request that would change
// something: acquire, renew, release, register, heartbeat, quota writes.
func TestReadersTokenOnlyReads(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, nil)
	ctx := context.Background()
	admin, reader := a.client(t, adminToken), a.client(t, readerToken)
	if err := admin.RegisterServer(ctx, gpuServer("s1", 2)); err != nil {
		t.Fatal(err)
	}
	if err := admin.SetQuota(ctx, "team-a", allocator.SharePercent(400)); err != nil {
		t.Fatal(err)
	}
	var held []api.Lease
	for _, ns := range []string{"team-a", "team-b"} {
		l, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: ns, GPUAmount: 1, GPUPercent: 25})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}

	// The reads the adapter does (GET /v1/pool, GET /v1/leases), and the rest.
	if ls, err := reader.Leases(ctx, client.LeaseFilter{}); err != nil || len(ls) != len(held) {
		t.Errorf("the readers token lists %d leases (%v), want every namespace's %d", len(ls), err, len(held))
	}
	if ls, err := reader.Leases(ctx, client.LeaseFilter{Namespace: "team-b"}); err != nil || len(ls) != 1 {
		t.Errorf("the readers token lists %d of team-b's leases (%v), want 1", len(ls), err)
	}
	if _, err := reader.Lease(ctx, held[1].ID); err != nil {
		t.Errorf("the readers token cannot read lease %s: %v", held[1].ID, err)
	}
	if st, err := reader.Pool(ctx); err != nil || len(st.Servers) != 1 {
		t.Errorf("the readers token reads the pool: %+v (%v), want s1", st.Servers, err)
	}
	if _, err := reader.Server(ctx, "s1"); err != nil {
		t.Errorf("the readers token cannot read server s1: %v", err)
	}
	if qs, err := reader.Quotas(ctx); err != nil || len(qs) == 0 {
		t.Errorf("the readers token reads quotas %+v (%v), want team-a's", qs, err)
	}
	if v, err := reader.Console(ctx); err != nil || len(v.Leases) != len(held) {
		t.Errorf("the readers token's console shows %d leases (%v), want %d", len(v.Leases), err, len(held))
	}

	for what, write := range map[string]func() error{
		"acquire": func() error {
			_, err := reader.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 25})
			return err
		},
		"renew":    func() error { _, err := reader.Renew(ctx, held[0].ID, time.Minute); return err },
		"release":  func() error { return reader.Release(ctx, held[0].ID) },
		"register": func() error { return reader.RegisterServer(ctx, gpuServer("s9", 1)) },
		"heartbeat": func() error {
			return reader.Heartbeat(ctx, "s1", api.Heartbeat{})
		},
		"set a quota":    func() error { return reader.SetQuota(ctx, "team-a", allocator.SharePercent(100)) },
		"remove a quota": func() error { return reader.DeleteQuota(ctx, "team-a") },
	} {
		if err := write(); !client.IsReason(err, api.ReasonForbidden) {
			t.Errorf("the readers token may %s: %v, want 403 Forbidden", what, err)
		}
	}
	// Nothing changed.
	if ls, _ := admin.Leases(ctx, client.LeaseFilter{}); len(ls) != len(held) {
		t.Errorf("after the readers token's writes, %d leases, want %d", len(ls), len(held))
	}
	if st, _ := admin.Pool(ctx); len(st.Servers) != 1 {
		t.Errorf("after the readers token's writes, %d servers, want s1 alone", len(st.Servers))
	}

	// Every route but a GET, raw, whatever its body: 403 before anything else.
	for _, route := range []string{"PUT /v1/servers/s1", "POST /v1/servers/s1/heartbeat", "POST /v1/leases", "POST /v1/leases/" + held[0].ID + "/renew",
		"DELETE /v1/leases/" + held[0].ID, "PUT /v1/quotas/team-a", "DELETE /v1/quotas/team-a"} {
		method, path, _ := strings.Cut(route, " ")
		req, err := http.NewRequestWithContext(ctx, method, a.url+path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+readerToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "only read") {
			t.Errorf("%s with the readers token: %d %s, want 403 saying it may only read", route, resp.StatusCode, body)
		}
	}
}

// TestReadersTokensAreChecked: a readers token is held to the length and
// uniqueness of every other token.
func TestReadersTokensAreChecked(t *testing.T) {
	for _, tc := range []struct {
		c    FileConfig
		want string
	}{
		{FileConfig{Readers: TokenSet{Tokens: []string{"short"}}}, "readers.tokens[0]"},
		{FileConfig{Admin: TokenSet{Tokens: []string{adminToken}}, Readers: TokenSet{Tokens: []string{adminToken}}}, "is also a token of admin"},
	} {
		if err := tc.c.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.c, err, tc.want)
		}
	}
}
