package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/etcdtest"
)

// freePort returns a loopback TCP port free at the time of the call.
func freePort(t testing.TB) string { return etcdtest.FreePort(t) }

// TestEtcdLeaderFailover runs two allocator replicas on etcd, kills the
// leader with SIGKILL under load, and checks that the standby takes over,
// clients retry through it, and nothing acknowledged is lost.
func TestEtcdLeaderFailover(t *testing.T) {
	endpoints := etcdtest.Start(t)
	config := writeLoadConfig(t)
	args := []string{"--store", "etcd", "--etcd-endpoints", endpoints, "--etcd-session-ttl", "2s", "--config", config.Path}
	leader := startAllocator(t, args...)
	standby := startAllocator(t, args...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("leader logs:\n%s\nstandby logs:\n%s", leader.logs, standby.logs)
		}
	})
	if !strings.Contains(standby.logs.String(), "standing by") {
		t.Fatalf("second replica did not stand by:\n%s", standby.logs)
	}
	servers, err := client.New([]string{leader.URL, standby.URL}, config.Servers)
	if err != nil {
		t.Fatal(err)
	}
	register(t, servers, loadServers()...)
	c, err := client.New([]string{leader.URL, standby.URL}, config.Tenant["load"])
	if err != nil {
		t.Fatal(err)
	}
	c.Retries, c.Backoff = 200, 100*time.Millisecond // ride out the takeover
	var tookOver time.Duration
	crashUnderLoad(t, c, func() {
		killed := time.Now()
		leader.kill()
		go func() {
			for !strings.Contains(standby.logs.String(), "allocator ready") {
				time.Sleep(10 * time.Millisecond)
			}
			tookOver = time.Since(killed)
		}()
	}, func() *client.Client {
		waitFor(t, func() bool { return strings.Contains(standby.logs.String(), "allocator ready") })
		return c
	})

	t.Logf("the standby served %s after the leader was killed (etcd session TTL 2s)", tookOver.Round(10*time.Millisecond))
}

// TestEtcdTakeoverKeepsWhatKubernetesWrites: what the Kubernetes side
// writes, a namespace's quota set through the API, a quota removed and a
// pod's lease that lives until released, is in etcd: the standby that takes
// over from a killed leader serves it.
func TestEtcdTakeoverKeepsWhatKubernetesWrites(t *testing.T) {
	endpoints := etcdtest.Start(t)
	config := writePoolConfig(t, map[string]int64{"team-a": 100, "team-b": 200})
	args := []string{"--store", "etcd", "--etcd-endpoints", endpoints, "--etcd-session-ttl", "2s", "--config", config.Path}
	leader := startAllocator(t, args...)
	standby := startAllocator(t, args...)
	admin, err := client.New([]string{leader.URL, standby.URL}, config.Admin)
	if err != nil {
		t.Fatal(err)
	}
	admin.Retries, admin.Backoff = 200, 100*time.Millisecond // ride out the takeover
	register(t, admin, gpuServer("s0", 2))
	ctx := context.Background()
	if err := admin.SetQuota(ctx, "team-a", allocator.SharePercent(150)); err != nil {
		t.Fatal(err)
	}
	if err := admin.DeleteQuota(ctx, "team-b"); err != nil {
		t.Fatal(err)
	}
	pod, err := admin.Acquire(ctx, api.AcquireRequest{Namespace: "team-a", GPUAmount: 1, GPUPercent: 50,
		Owner: api.Owner{Pod: "train-0", UID: "uid-0"}, IdempotencyKey: "uid-0", UntilReleased: true})
	if err != nil {
		t.Fatal(err)
	}

	leader.kill()
	waitFor(t, func() bool { return strings.Contains(standby.logs.String(), "allocator ready") })
	if l, err := admin.Lease(ctx, pod.ID); err != nil || !l.UntilReleased || l.Server != pod.Server {
		t.Errorf("after the takeover lease %s is %+v (%v), want it until released on %s", pod.ID, l, err, pod.Server)
	}
	quotas, err := admin.Quotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range quotas {
		if want := map[string]float64{"team-a": 150}[q.Namespace]; q.Limited != (want > 0) || q.HardPercent != want {
			t.Errorf("after the takeover namespace %s has quota %+v, want %v%% (0: none)", q.Namespace, q, want)
		}
	}
}
