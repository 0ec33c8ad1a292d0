package service

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
)

// TestQuotaAPI: only an admin token sets or removes a namespace's quota;
// it may go below what the namespace holds (its leases stay, new ones are
// refused); the store keeps what the API set and removed over the config
// file's quotas across a restart, and the quota metric follows.
func TestQuotaAPI(t *testing.T) {
	dir, clock := t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}
	config := map[string]allocator.Share{"team-a": allocator.SharePercent(100), "team-b": allocator.SharePercent(200)}
	a := startAllocator(t, dir, clock, config)
	ctx := context.Background()
	admin := a.client(t, adminToken)
	if err := admin.RegisterServer(ctx, gpuServer("s1", 4)); err != nil {
		t.Fatal(err)
	}
	for token, want := range map[string]string{teamAToken: api.ReasonForbidden, serverToken: api.ReasonForbidden, "": api.ReasonUnauthorized} {
		c := a.client(t, token)
		if err := c.SetQuota(ctx, "team-a", allocator.SharePercent(1000)); !client.IsReason(err, want) ||
			want == api.ReasonForbidden && !strings.Contains(err.Error(), "only an admin token may set quotas") {
			t.Errorf("token %q set a quota: %v, want %s", token, err, want)
		}
		if err := c.DeleteQuota(ctx, "team-a"); !client.IsReason(err, want) {
			t.Errorf("token %q removed a quota: %v, want %s", token, err, want)
		}
	}

	if err := admin.SetQuota(ctx, "team-a", allocator.SharePercent(150)); err != nil {
		t.Fatal(err)
	}
	teamA := a.client(t, teamAToken)
	held, err := teamA.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1})
	if err != nil {
		t.Fatalf("a whole GPU within the raised quota of 150%%: %v", err)
	}
	if _, err := teamA.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 60}); !client.IsReason(err, api.ReasonQuotaExceeded) {
		t.Errorf("160%% under a quota of 150%%: %v, want QuotaExceeded", err)
	}
	if err := admin.SetQuota(ctx, "team-a", allocator.SharePercent(50)); err != nil {
		t.Fatalf("lowering a quota below use: %v", err)
	}
	if _, err := teamA.Lease(ctx, held.ID); err != nil {
		t.Errorf("the lease held when the quota went below use was ended: %v", err)
	}
	if _, err := teamA.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 10}); !client.IsReason(err, api.ReasonQuotaExceeded) {
		t.Errorf("a new lease over a quota lowered below use: %v, want QuotaExceeded", err)
	}
	if err := admin.DeleteQuota(ctx, "team-b"); err != nil {
		t.Fatal(err)
	}
	if err := admin.SetQuota(ctx, "team-c", allocator.SharePercent(300)); err != nil {
		t.Fatal(err)
	}
	a.close()

	b := startAllocator(t, dir, clock, config)
	quotas, err := b.client(t, adminToken).Quotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, q := range quotas {
		got[q.Namespace] = "unlimited"
		if q.Limited {
			got[q.Namespace] = q.Core().Hard.String()
		}
	}
	want := map[string]string{"team-a": "50%", "team-b": "unlimited", "team-c": "300%"}
	for ns, w := range want {
		have, listed := got[ns]
		if !listed { // a namespace without quota or use is not listed
			have = "unlimited"
		}
		if have != w {
			t.Errorf("after a restart namespace %s has quota %s, want %s as the API left it", ns, have, w)
		}
	}
	if err := testutil.GatherAndCompare(b.reg, strings.NewReader(`
# HELP bitfusion_namespace_quota_gpus GPU quota of the namespace, in GPUs (requests.bitfusion.io/gpu / 100).
# TYPE bitfusion_namespace_quota_gpus gauge
bitfusion_namespace_quota_gpus{namespace="team-a"} 0.5
bitfusion_namespace_quota_gpus{namespace="team-c"} 3
`), "bitfusion_namespace_quota_gpus"); err != nil {
		t.Error(err)
	}
}

// TestBadQuotaNamesTheField: a refused quota says which field, the value
// and the limit.
func TestBadQuotaNamesTheField(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, nil)
	for _, tc := range []struct {
		namespace, body, field, message string
	}{
		{"team-a", `{}`, "hardPercent", `hardPercent \"\" must be set`},
		{"team-a", `{"hardPercent":null}`, "hardPercent", `hardPercent \"\" must be set`},
		{"team-a", `{"hardPercent":-1}`, "hardPercent", "hardPercent -1 out of range 0..100000000"},
		{"team-a", `{"hardPercent":1e9}`, "hardPercent", "hardPercent 1000000000 out of range 0..100000000"},
		{"team-a", `{"hardPercent":12.345}`, "hardPercent", "hardPercent 12.345 is finer than a tenth of a percent"},
		{"team-a", `{"hardPercent":"150"}`, "", "body is not valid JSON"},
		{"team-a", `{"hardPercent":150,"soft":1}`, "", "unknown field"},
		{"Team_A", `{"hardPercent":150}`, "namespace", "namespace Team_A is not a namespace name"},
	} {
		status, body := send(t, http.MethodPut, a.url+"/v1/quotas/"+tc.namespace, adminToken, tc.body)
		if status != http.StatusBadRequest || !strings.Contains(body, tc.message) || !strings.Contains(body, `"field":"`+tc.field+`"`) && tc.field != "" {
			t.Errorf("%s %s: %d %s; want 400 naming %q: %q", tc.namespace, tc.body, status, body, tc.field, tc.message)
		}
	}
}

// TestRaisedQuotaWakesWaiters: a request queued for quota is granted as
// soon as the quota is raised, or removed.
func TestRaisedQuotaWakesWaiters(t *testing.T) {
	a := startAllocator(t, t.TempDir(), &fakeClock{now: time.Unix(1e9, 0)}, map[string]allocator.Share{"team-a": allocator.WholeGPU})
	ctx := context.Background()
	admin := a.client(t, adminToken)
	if err := admin.RegisterServer(ctx, gpuServer("s1", 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1}); err != nil {
		t.Fatal(err)
	}
	for _, change := range []struct {
		name  string
		apply func() error
	}{
		{"raised", func() error { return admin.SetQuota(ctx, "team-a", allocator.SharePercent(200)) }},
		{"removed", func() error { return admin.DeleteQuota(ctx, "team-a") }},
	} {
		got := make(chan error, 1)
		go func() {
			_, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, Wait: "30s"})
			got <- err
		}()
		waitFor(t, func() bool { return a.svc.pendingCount() == 1 })
		if err := change.apply(); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Errorf("the request queued for quota failed after the quota was %s: %v", change.name, err)
		}
	}
}
