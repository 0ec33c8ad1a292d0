// Package etcdtest runs Debian's etcd (3.4) for tests: one member or a
// cluster, on loopback ports or each member in its own network namespace,
// in temp dirs, killed when the test ends.
package etcdtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Member is one etcd process of a cluster.
type Member struct {
	Name, ClientURL string
	args            []string
	logFile         string
	// netns is the network namespace the member runs in and link the
	// host's end of the veth pair that joins it to the cluster's bridge;
	// both empty for a member on loopback.
	netns, link string
	mu          sync.Mutex
	cmd         *exec.Cmd
}

// Start runs a one-member etcd and returns its client URL.
func Start(t testing.TB) string {
	return StartCluster(t, 1)[0].ClientURL
}

// StartCluster runs an etcd cluster of n members on loopback and waits
// until it answers through every member.
func StartCluster(t testing.TB, n int) []*Member {
	t.Helper()
	members := make([]*Member, n)
	peerURLs := make([]string, n)
	for i := range members {
		members[i] = &Member{Name: fmt.Sprint("m", i), ClientURL: "http://127.0.0.1:" + FreePort(t)}
		peerURLs[i] = "http://127.0.0.1:" + FreePort(t)
	}
	startMembers(t, members, peerURLs)
	return members
}

// startMembers starts the members, peers at peerURLs, and waits until
// the cluster answers through every one.
func startMembers(t testing.TB, members []*Member, peerURLs []string) {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Skip("etcd not installed (make deps installs Debian's etcd-server)")
	}
	peers := make([]string, len(members))
	for i, m := range members {
		peers[i] = m.Name + "=" + peerURLs[i]
	}
	dir := t.TempDir()
	for i, m := range members {
		m.logFile = filepath.Join(dir, m.Name+".log")
		if m.netns != "" {
			m.args = []string{"ip", "netns", "exec", m.netns}
		}
		m.args = append(m.args, bin, "--name", m.Name, "--data-dir", filepath.Join(dir, m.Name),
			"--listen-client-urls", m.ClientURL, "--advertise-client-urls", m.ClientURL,
			"--listen-peer-urls", peerURLs[i], "--initial-advertise-peer-urls", peerURLs[i],
			"--initial-cluster", strings.Join(peers, ","), "--log-level", "warn")
		m.start(t)
	}
	t.Cleanup(func() {
		for _, m := range members {
			m.Kill()
		}
	})
	for _, m := range members {
		m.WaitServing(t)
	}
}

func (m *Member) start(t testing.TB) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	logs, err := os.OpenFile(m.logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	// The process holds its own copy of the file.
	defer func() { _ = logs.Close() }()
	m.cmd = exec.Command(m.args[0], m.args[1:]...) //nolint:gosec // the test's own etcd
	m.cmd.Stdout, m.cmd.Stderr = logs, logs
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
}

// WaitServing waits until a read through this member succeeds: it runs
// and the cluster has a leader it knows.
func (m *Member) WaitServing(t testing.TB) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Get(ctx, "health")
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			logs, _ := os.ReadFile(m.logFile)
			t.Fatalf("etcd member %s does not serve: %v\n%s", m.Name, err, logs)
		}
	}
}

// Kill ends the member with SIGKILL.
func (m *Member) Kill() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		_ = m.cmd.Process.Kill()
		_ = m.cmd.Wait()
		m.cmd = nil
	}
}

// Restart starts a killed member again on its data.
func (m *Member) Restart(t testing.TB) {
	t.Helper()
	m.start(t)
	m.WaitServing(t)
}

// Leader returns the member that leads the cluster now, asking the live
// members' maintenance status; nil when none knows one.
func Leader(t testing.TB, members []*Member) *Member {
	t.Helper()
	for _, m := range members {
		if st := status(t, m); st != nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
			return m
		}
	}
	return nil
}

// status is the member's maintenance status; nil when it does not answer.
func status(t testing.TB, m *Member) *clientv3.StatusResponse {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: time.Second})
	if err != nil {
		return nil
	}
	defer func() { _ = cli.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := cli.Status(ctx, m.ClientURL)
	if err != nil {
		return nil
	}
	return st
}

// Endpoints are the members' client URLs, comma-separated.
func Endpoints(members []*Member) string {
	urls := make([]string, len(members))
	for i, m := range members {
		urls[i] = m.ClientURL
	}
	return strings.Join(urls, ",")
}

// FreePort returns a loopback TCP port free at the time of the call.
func FreePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}
