package etcdtest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// StartIsolatedCluster runs an etcd cluster of n members, each in its own
// network namespace joined to the host's by a veth pair on a bridge, so
// that Partition can cut one off: packets to and from it vanish, as across
// a real partition, until Heal. The host reaches every member through the
// bridge. It returns an error, having started nothing, where network
// namespaces cannot be made (not root, no ip(8)); the namespaces and links
// go when the test ends.
func StartIsolatedCluster(t testing.TB, n int) ([]*Member, error) {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil, errors.New("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("no ip(8) to make network namespaces: %w", err)
	}
	// Random names and subnet: tests in other processes may hold theirs.
	id := fmt.Sprintf("%06x", rand.IntN(1<<24))
	subnet := fmt.Sprintf("10.250.%d", rand.IntN(256))
	bridge := "gpeb" + id
	var undo []string // ip(8) commands that take down what was made
	t.Cleanup(func() {
		for i := len(undo) - 1; i >= 0; i-- {
			if err := ip(undo[i]); err != nil {
				t.Logf("cleaning up the etcd network: %v", err)
			}
		}
	})
	if err := ip("link add " + bridge + " type bridge"); err != nil {
		return nil, err
	}
	undo = append(undo, "link del "+bridge)
	if err := ipAll("addr add "+subnet+".1/24 dev "+bridge, "link set "+bridge+" up"); err != nil {
		return nil, err
	}
	members := make([]*Member, n)
	peerURLs := make([]string, n)
	for i := range members {
		m := &Member{Name: fmt.Sprint("m", i), netns: fmt.Sprintf("gpupool-etcd-%s-%d", id, i), link: fmt.Sprintf("gpev%s%d", id, i)}
		if err := ip("netns add " + m.netns); err != nil {
			return nil, err
		}
		undo = append(undo, "netns del "+m.netns) // takes the veth pair with it
		addr := fmt.Sprintf("%s.%d", subnet, 10+i)
		if err := ipAll("link add "+m.link+" type veth peer name eth0 netns "+m.netns,
			"link set "+m.link+" master "+bridge+" up",
			"-n "+m.netns+" addr add "+addr+"/24 dev eth0",
			"-n "+m.netns+" link set eth0 up",
			"-n "+m.netns+" link set lo up"); err != nil {
			return nil, err
		}
		m.ClientURL, peerURLs[i] = "http://"+addr+":2379", "http://"+addr+":2380"
		members[i] = m
	}
	startMembers(t, members, peerURLs)
	return members, nil
}

// Partition cuts the member off from its peers and every client: its link
// to the bridge goes down, and what is sent to or from it is lost.
func (m *Member) Partition(t testing.TB) {
	t.Helper()
	if err := ip("link set " + m.link + " down"); err != nil {
		t.Fatal(err)
	}
}

// Heal joins a partitioned member to the cluster again.
func (m *Member) Heal(t testing.TB) {
	t.Helper()
	if err := ip("link set " + m.link + " up"); err != nil {
		t.Fatal(err)
	}
}

// WaitCaughtUp waits until the member has applied every entry the leader
// had committed when it was called.
func (m *Member) WaitCaughtUp(t testing.TB, leader *Member) {
	t.Helper()
	lst := status(t, leader)
	if lst == nil {
		t.Fatalf("etcd leader %s does not answer", leader.Name)
	}
	committed := lst.RaftIndex
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if st := status(t, m); st != nil && st.RaftAppliedIndex >= committed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd member %s has not caught up to index %d", m.Name, committed)
		}
	}
}

func ipAll(args ...string) error {
	for _, a := range args {
		if err := ip(a); err != nil {
			return err
		}
	}
	return nil
}

func ip(args string) error {
	out, err := exec.Command("ip", strings.Fields(args)...).CombinedOutput() //nolint:gosec // the test's own network
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", args, err, out)
	}
	return nil
}
