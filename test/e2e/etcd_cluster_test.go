package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/etcdtest"
)

// servedAgainWithin bounds the time to serve again after a fault: a
// liveness check, far above what any fault costs, never a measurement.
const servedAgainWithin = 30 * time.Second

// allocatorCluster is three allocator replicas on a three-member etcd
// cluster, each replica on a fixed address so that a restarted one is
// where clients look for it.
type allocatorCluster struct {
	t        *testing.T
	etcd     []*etcdtest.Member
	addrs    []string
	replicas []*allocatorProcess
	config   *poolConfig
}

func (c *allocatorCluster) start(i int) {
	c.replicas[i] = startAllocator(c.t, "--listen", c.addrs[i], "--store", "etcd",
		"--etcd-endpoints", etcdtest.Endpoints(c.etcd), "--etcd-session-ttl", "2s",
		"--config", c.config.Path)
}

func (c *allocatorCluster) urls() []string {
	urls := make([]string, len(c.addrs))
	for i, a := range c.addrs {
		urls[i] = "http://" + a
	}
	return urls
}

// leading is the replica that serves the API now (its /healthz says ok,
// a standby's says standby).
func (c *allocatorCluster) leading(t *testing.T) int {
	t.Helper()
	for deadline := time.Now().Add(servedAgainWithin); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for i, p := range c.replicas {
			if resp, err := http.Get(p.URL + "/healthz"); err == nil {
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusOK && grep(p.logs.String(), "allocator ready") != "" && isServing(p.URL) {
					return i
				}
			}
		}
	}
	t.Fatal("no replica leads")
	return -1
}

// isServing asks the API itself: a standby answers it 503.
func isServing(url string) bool {
	resp, err := http.Get(url + "/v1/pool")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode != http.StatusServiceUnavailable
}

// servedAgain writes through the replicas, following the leader, until a
// write is acknowledged, and returns how long that took. The write
// registers a server without GPUs: it needs no capacity the load may hold.
func (c *allocatorCluster) servedAgain(t *testing.T, fault string) time.Duration {
	t.Helper()
	probe, err := client.New(c.urls(), c.config.Servers)
	if err != nil {
		t.Fatal(err)
	}
	probe.Retries, probe.Backoff = 1<<20, 20*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), servedAgainWithin)
	defer cancel()
	start := time.Now()
	err = probe.RegisterServer(ctx, api.Server{Name: "probe", CPUMilli: 1000, MemoryBytes: 1 << 30})
	took := time.Since(start)
	if err != nil {
		t.Errorf("%s: no write served within %s: %v", fault, servedAgainWithin, err)
		return took
	}
	t.Logf("%s: the first write was served %s later", fault, took.Round(10*time.Millisecond))
	return took
}

// stillRunning checks that no replica exited: an etcd fault costs no
// allocator restart.
func (c *allocatorCluster) stillRunning(t *testing.T) {
	t.Helper()
	for i, p := range c.replicas {
		select {
		case <-p.done:
			t.Errorf("replica %d exited:\n%s", i, p.logs)
		default:
		}
	}
}

// TestEtcdClusterFaults runs three allocator replicas on three etcd
// members under a load of acquisitions and releases from clients that
// follow the leader, and breaks one thing at a time: the leading
// allocator killed, the etcd leader killed, the etcd leader and then a
// follower partitioned away and healed, then every member and every
// replica restarted in turn. After each, nothing acknowledged is lost or
// granted twice and the books balance (crashUnderLoad's checks); the time
// to serve again is logged.
//
// Debian's etcd 3.4 serves as the cluster: the client and the allocator
// speak the v3 API it has, and what is tested (leader elections, lost
// leases, a member that stops answering) is raft's behaviour, the same in
// later versions. Each member runs in its own network namespace, so that
// a partition is real: its link goes down and packets to and from it are
// lost. Without root the members run on loopback and the partitions skip.
func TestEtcdClusterFaults(t *testing.T) {
	etcd, noNetns := etcdtest.StartIsolatedCluster(t, 3)
	if noNetns != nil {
		t.Logf("etcd members on loopback, the partitions will skip: %v", noNetns)
		etcd = etcdtest.StartCluster(t, 3)
	}
	c := &allocatorCluster{t: t, etcd: etcd, config: writeLoadConfig(t)}
	for range 3 {
		c.addrs = append(c.addrs, "127.0.0.1:"+freePort(t))
	}
	c.replicas = make([]*allocatorProcess, len(c.addrs))
	for i := range c.replicas {
		c.start(i)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, p := range c.replicas {
				t.Logf("replica %d logs:\n%s", i, p.logs)
			}
		}
	})
	servers, err := client.New(c.urls(), c.config.Servers)
	if err != nil {
		t.Fatal(err)
	}
	register(t, servers, loadServers()...)
	// The faults outlast the heartbeat timeout: the servers check in as
	// their daemons would, or they would take no new leases.
	heartbeat(t, servers, loadServers())
	load, err := client.New(c.urls(), c.config.Tenant["load"])
	if err != nil {
		t.Fatal(err)
	}
	load.Retries, load.Backoff = 1000, 50*time.Millisecond // ride out every fault

	var restart func()
	faults := []struct {
		name      string
		partition bool // needs the members in network namespaces
		fault     func(t *testing.T)
	}{
		{"kill the leading allocator", false, func(t *testing.T) {
			i := c.leading(t)
			c.replicas[i].kill()
			c.servedAgain(t, "leading allocator killed")
			restart = func() { c.start(i) }
		}},
		{"kill the etcd leader", false, func(t *testing.T) {
			m := c.etcdLeader(t)
			m.Kill()
			c.servedAgain(t, "etcd leader "+m.Name+" killed")
			restart = func() { m.Restart(t) }
		}},
		{"partition the etcd leader", true, func(t *testing.T) {
			restart = c.partition(t, c.etcdLeader(t), "leader")
		}},
		{"partition an etcd follower", true, func(t *testing.T) {
			restart = c.partition(t, c.etcdFollower(t), "follower")
		}},
		{"restart everything in turn", false, func(t *testing.T) {
			for _, m := range c.etcd {
				m.Kill()
				m.Restart(t)
				c.servedAgain(t, "etcd member "+m.Name+" restarted")
			}
			for i := range c.replicas {
				c.replicas[i].kill()
				c.start(i)
				c.servedAgain(t, fmt.Sprint("allocator replica ", i, " restarted"))
			}
			restart = func() {}
		}},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			if f.partition && noNetns != nil {
				t.Skip(noNetns)
			}
			crashUnderLoad(t, load, func() { f.fault(t) }, func() *client.Client {
				restart()
				return load
			})
			c.stillRunning(t)
			releaseAll(t, load) // room for the next fault's load
		})
	}
}

// etcdLeader is the member that leads the etcd cluster now.
func (c *allocatorCluster) etcdLeader(t *testing.T) *etcdtest.Member {
	t.Helper()
	for deadline := time.Now().Add(servedAgainWithin); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if m := etcdtest.Leader(t, c.etcd); m != nil {
			return m
		}
	}
	t.Fatal("the etcd cluster has no leader")
	return nil
}

// etcdFollower is a member that follows the etcd leader now.
func (c *allocatorCluster) etcdFollower(t *testing.T) *etcdtest.Member {
	t.Helper()
	leader := c.etcdLeader(t)
	for _, m := range c.etcd {
		if m != leader {
			return m
		}
	}
	t.Fatal("the etcd cluster has one member")
	return nil
}

// partition cuts an etcd member off from its peers and the allocators and
// logs how long until a write is served again. It returns the recovery:
// heal the partition, log how long the member takes to catch up with the
// leader and how long until a write is served after healing (a member
// that campaigned alone comes back with a higher term and may force an
// election).
func (c *allocatorCluster) partition(t *testing.T, m *etcdtest.Member, role string) (heal func()) {
	t.Helper()
	m.Partition(t)
	fault := "etcd " + role + " " + m.Name
	c.servedAgain(t, fault+" partitioned")
	return func() {
		m.Heal(t)
		start := time.Now()
		m.WaitCaughtUp(t, c.etcdLeader(t))
		t.Logf("%s healed: caught up with the leader %s later", fault, time.Since(start).Round(10*time.Millisecond))
		c.servedAgain(t, fault+" healed")
	}
}

// releaseAll ends every live lease.
func releaseAll(t *testing.T, c *client.Client) {
	t.Helper()
	leases, err := c.Leases(context.Background(), client.LeaseFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases {
		if err := c.Release(context.Background(), l.ID); err != nil {
			t.Fatal(err)
		}
	}
}
