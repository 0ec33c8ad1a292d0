package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
)

// TestRunEndToEnd: `gpupool run -n 1 -p 50 -- cmd` against the allocator
// binary; the lease shows in /metrics and `gpupool leases` while the command
// runs and is gone after it exits, whose status `gpupool run` passes on.
// Tokens are on: the servers register with the servers token, the CLI acts
// with namespace ml's.
func TestRunEndToEnd(t *testing.T) {
	config := writePoolConfig(t, map[string]int64{"ml": noQuota})
	a := startAllocator(t, "--data-dir", t.TempDir(), "--config", config.Path)
	register(t, newClient(t, a.URL, config.Servers), gpuServer("gpu-a", 2), gpuServer("gpu-b", 4))
	env := append(config.tenantEnv(t, a.URL, "ml"), "POD_NAME=trainer-0")

	marker := filepath.Join(t.TempDir(), "lease")
	run := exec.Command(filepath.Join(binDir, "gpupool"), "run", "-n", "1", "-p", "50", "--ttl", "3s", "--",
		"sh", "-c", `echo "$GPUPOOL_LEASE_ID $CUDA_VISIBLE_DEVICES $GPUPOOL_GPU_PERCENT" > `+marker+`; sleep 2; exit 7`)
	run.Env = append(os.Environ(), env...)
	var out strings.Builder
	run.Stdout, run.Stderr = &out, &out
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	var leaseID, uuid, percent string
	waitFor(t, func() bool {
		b, err := os.ReadFile(marker)
		_, _ = fmt.Sscan(string(b), &leaseID, &uuid, &percent)
		return err == nil && leaseID != ""
	})
	if !strings.HasPrefix(uuid, "GPU-gpu-") || percent != "50" {
		t.Errorf("the command saw CUDA_VISIBLE_DEVICES=%q GPUPOOL_GPU_PERCENT=%q", uuid, percent)
	}
	if m := metrics(t, a.URL); !strings.Contains(m, `bitfusion_lease_info{lease="`+leaseID+`",namespace="ml",pod="trainer-0"`) {
		t.Errorf("lease %s not in /metrics:\n%s", leaseID, grep(m, "bitfusion_lease_info"))
	}
	listed, code := gpupool(t, env, "leases", "--output", "json")
	if code != 0 || !strings.Contains(listed, leaseID) {
		t.Errorf("gpupool leases (exit %d) does not list %s:\n%s", code, leaseID, listed)
	}
	err := run.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 7 {
		t.Errorf("gpupool run exited with %v, want the command's status 7; output:\n%s", err, out.String())
	}
	if m := metrics(t, a.URL); strings.Contains(m, leaseID) {
		t.Errorf("lease %s still in /metrics after the command exited", leaseID)
	}
	if listed, _ := gpupool(t, env, "leases"); strings.Contains(listed, leaseID) {
		t.Errorf("lease %s still listed after the command exited:\n%s", leaseID, listed)
	}

	if out, code := gpupool(t, env, "run", "-n", "8", "--", "true"); code != 75 || !strings.Contains(out, "no server has 8 free GPUs") {
		t.Errorf("no capacity: exit %d, %q; want 75 and the reason", code, out)
	}
	// The servers report no links: no pair of their GPUs is NVLinked.
	if out, code := gpupool(t, env, "run", "-n", "2", "--topology", "nvlink", "--", "true"); code != 75 || !strings.Contains(out, "no server has 2 free GPUs linked by nvlink") {
		t.Errorf("a pair linked by nvlink: exit %d, %q; want 75 and the reason", code, out)
	}
	if out, code := gpupool(t, env, "run", "-n", "1", "-p", "120", "--", "true"); code != 2 || !strings.Contains(out, "-p: gpu-percent 120 out of range 1..100") {
		t.Errorf("bad percent: exit %d, %q", code, out)
	}
	if out, code := gpupool(t, env, "run", "-n", "65", "--", "true"); code != 2 || !strings.Contains(out, "-n: gpu-amount 65 out of range 1..64") {
		t.Errorf("too many GPUs: exit %d, %q", code, out)
	}
	if out, code := gpupool(t, append(env, "GPUPOOL_TOKEN=unknown-token"), "leases"); code != 77 || !strings.Contains(out, "unknown bearer token") {
		t.Errorf("leases with an unknown token: exit %d, %q; want 77 and the reason", code, out)
	}
	if out, code := gpupool(t, env, "pool", "status"); code != 0 || !strings.Contains(out, "gpu-b") {
		t.Errorf("pool status: exit %d\n%s", code, out)
	}
}

// TestCrashKeepsAcknowledgedLeases kills the allocator with SIGKILL under a
// concurrent acquire/release load and restarts it on the same data dir.
func TestCrashKeepsAcknowledgedLeases(t *testing.T) {
	config := writeLoadConfig(t)
	args := []string{"--data-dir", filepath.Join(t.TempDir(), "data"), "--config", config.Path}
	a := startAllocator(t, args...)
	register(t, newClient(t, a.URL, config.Servers), loadServers()...)
	c := newClient(t, a.URL, config.Tenant["load"])
	c.Retries = 1
	crashUnderLoad(t, c, a.kill, func() *client.Client {
		return newClient(t, startAllocator(t, args...).URL, config.Tenant["load"])
	})
}

// writeLoadConfig is the config of the crash tests: the load's namespace
// with a quota it never reaches, so that quota is counted but refuses
// nothing.
func writeLoadConfig(t *testing.T) *poolConfig {
	return writePoolConfig(t, map[string]int64{"load": 100000})
}

// loadServers are the GPU servers the crash tests load: 4 of 8 GPUs.
func loadServers() []api.Server {
	var servers []api.Server
	for i := range 4 {
		servers = append(servers, gpuServer(fmt.Sprint("s", i), 8))
	}
	return servers
}

// heartbeat checks the servers in every second, each with its GPUs
// healthy, as their daemons do, until the test ends; a heartbeat that
// fails (no replica leads yet) is sent again the next second.
func heartbeat(t *testing.T, c *client.Client, servers []api.Server) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			for _, s := range servers {
				hb := api.Heartbeat{}
				for i := range s.GPUs {
					hb.GPUs = append(hb.GPUs, api.GPUHealth{Index: i, Healthy: true})
				}
				_ = c.Heartbeat(ctx, s.Name, hb)
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
				return
			}
		}
	}()
}

// crashUnderLoad runs 8 clients acquiring and releasing in namespace load
// through c (which holds its token), with loadServers registered, calls
// crash mid-flight, then checks through the client recover returns: no
// acknowledged lease is lost, no acknowledged release comes back, a
// retried request never gets a second lease, and the books balance.
func crashUnderLoad(t *testing.T, c *client.Client, crash func(), recover func() *client.Client) {
	t.Helper()

	type outcome struct {
		req       api.AcquireRequest
		lease     api.Lease
		acked     bool // the acquire was answered
		releasing bool // a release was sent: it may have landed unanswered
		released  bool // a release was answered
	}
	var mu sync.Mutex
	var all []*outcome
	refused := map[string]int{} // the load's errors by their cause, to name it
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			var mine []*outcome
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if len(mine) > 0 && rng.IntN(3) == 0 {
					o := mine[rng.IntN(len(mine))]
					if o.releasing {
						continue
					}
					mu.Lock()
					o.releasing = true
					mu.Unlock()
					if c.Release(context.Background(), o.lease.ID) == nil {
						mu.Lock()
						o.released = true
						mu.Unlock()
					}
					continue
				}
				o := &outcome{req: api.AcquireRequest{Namespace: "load", GPUAmount: 1, GPUPercent: 1 + rng.IntN(5),
					IdempotencyKey: fmt.Sprintf("%s/w%d-%d", t.Name(), w, i), TTL: "10m"}}
				mu.Lock()
				all = append(all, o)
				mu.Unlock()
				l, err := c.Acquire(context.Background(), o.req)
				if err != nil {
					mu.Lock()
					refused[errorCause(err)]++
					mu.Unlock()
					continue // in flight when the allocator died, or no capacity
				}
				mu.Lock()
				o.lease, o.acked = l, true
				mu.Unlock()
				mine = append(mine, o)
			}
		})
	}
	time.Sleep(1500 * time.Millisecond)
	crash()
	close(stop)
	wg.Wait() // requests in flight finish, through a standby if there is one

	c = recover()
	leases, err := c.Leases(context.Background(), client.LeaseFilter{})
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]api.Lease{}
	for _, l := range leases {
		live[l.ID] = l
	}
	acked, released := 0, 0
	for _, o := range all {
		switch {
		case o.released:
			released++
			if _, ok := live[o.lease.ID]; ok {
				t.Errorf("acknowledged release of %s came back after the crash", o.lease.ID)
			}
		case o.acked && !o.releasing:
			acked++
			if _, ok := live[o.lease.ID]; !ok {
				t.Errorf("acknowledged lease %s (%s) lost in the crash", o.lease.ID, o.req.IdempotencyKey)
			}
		}
	}
	// Retry every request: each key must map to one lease, the one granted
	// before the crash when it was acknowledged.
	for _, o := range all {
		if o.releasing {
			continue
		}
		l, err := c.Acquire(context.Background(), o.req)
		if err != nil {
			continue // no capacity for a request that never got in
		}
		if o.acked && l.ID != o.lease.ID {
			t.Errorf("retry of %s got %s, not its lease %s", o.req.IdempotencyKey, l.ID, o.lease.ID)
		}
	}
	leases, _ = c.Leases(context.Background(), client.LeaseFilter{})
	byKey := map[string]string{}
	for _, l := range leases {
		if other, dup := byKey[l.IdempotencyKey]; dup {
			t.Errorf("key %s granted twice: %s and %s", l.IdempotencyKey, other, l.ID)
		}
		byKey[l.IdempotencyKey] = l.ID
	}
	checkBooks(t, c, leases)
	t.Logf("%d requests: %d acknowledged leases kept, %d acknowledged releases, %d leases live after recovery and retries",
		len(all), acked, released, len(leases))
	if acked < 50 {
		t.Errorf("only %d acknowledged leases: the load did not exercise the allocator; its acquisitions failed with %v", acked, refused)
	}
}

// errorCause is an allocator error's reason, or the error's text.
func errorCause(err error) string {
	var e *api.Error
	if errors.As(err, &e) {
		return e.Reason + ": " + e.Message
	}
	return err.Error()
}

// checkBooks: per GPU, leased share <= 100% and equal to the sum of the
// leases on it; quota use equals the sum of the namespace's leases.
func checkBooks(t *testing.T, c *client.Client, listed []api.Lease) {
	t.Helper()
	ctx := context.Background()
	pool, err := c.Pool(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]allocator.Share{}
	perNS := map[string]allocator.Share{}
	for _, l := range api.CoreLeases(listed) {
		for _, g := range l.GPUs {
			held[fmt.Sprint(l.Server, "/", g.Index)] += g.Share
		}
		perNS[l.Namespace] += l.Share()
	}
	for _, s := range pool.Servers {
		for _, g := range s.GPUs {
			key := fmt.Sprint(s.Name, "/", g.Index)
			if a := g.Allocated(); a > allocator.WholeGPU || a != held[key] {
				t.Errorf("GPU %s: allocated %s, leases hold %s", key, a, held[key])
			}
		}
	}
	quotas, err := c.Quotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range quotas {
		if used := q.Core().Used; used != perNS[q.Namespace] {
			t.Errorf("namespace %s: quota use %s, leases sum to %s", q.Namespace, used, perNS[q.Namespace])
		}
	}
}

func metrics(t testing.TB, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grep(s, substr string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	waitForUpTo(t, 10*time.Second, cond)
}

// waitForUpTo is waitFor for what may take longer than 10 s.
func waitForUpTo(t testing.TB, limit time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("condition not met within %s", limit)
}

// TestRunForwardsSignalsAndStopsWhenTheLeaseIsGone: SIGTERM to `gpupool run`
// reaches the command, whose status it returns, and the lease is released;
// a lease that disappears (released elsewhere) stops the command.
//
// `gpupool run` holds namespace ml's token; the operator who lists and
// releases its lease the admin token.
func TestRunForwardsSignalsAndStopsWhenTheLeaseIsGone(t *testing.T) {
	config := writePoolConfig(t, map[string]int64{"ml": noQuota})
	a := startAllocator(t, "--data-dir", t.TempDir(), "--config", config.Path)
	register(t, newClient(t, a.URL, config.Servers), gpuServer("gpu-a", 1))
	c := newClient(t, a.URL, config.Admin)
	env := config.tenantEnv(t, a.URL, "ml")
	start := func() (*exec.Cmd, *strings.Builder) {
		cmd := exec.Command(filepath.Join(binDir, "gpupool"), "run", "-n", "1", "-p", "30", "--ttl", "3s", "--",
			"sh", "-c", `trap 'kill $!; exit 42' TERM; sleep 30 & wait`)
		cmd.Env = append(os.Environ(), env...)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { ls, _ := c.Leases(context.Background(), client.LeaseFilter{}); return len(ls) == 1 })
		time.Sleep(200 * time.Millisecond) // let the shell set its trap
		return cmd, &out
	}
	exitCode := func(cmd *exec.Cmd) int {
		var exit *exec.ExitError
		if err := cmd.Wait(); errors.As(err, &exit) {
			return exit.ExitCode()
		}
		return 0
	}

	cmd, out := start()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if code := exitCode(cmd); code != 42 {
		t.Errorf("after SIGTERM gpupool run exited %d, want the command's 42; output:\n%s", code, out)
	}
	if ls, _ := c.Leases(context.Background(), client.LeaseFilter{}); len(ls) != 0 {
		t.Errorf("lease not released after SIGTERM: %v", ls)
	}

	cmd, out = start()
	ls, _ := c.Leases(context.Background(), client.LeaseFilter{})
	if err := c.Release(context.Background(), ls[0].ID); err != nil {
		t.Fatal(err)
	}
	if code := exitCode(cmd); code != 42 || !strings.Contains(out.String(), "is gone") {
		t.Errorf("after its lease vanished gpupool run exited %d, want 42 (command stopped); output:\n%s", code, out)
	}
}
