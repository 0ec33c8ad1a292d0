package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestPartition checks that a partitioned member is cut off (a read
// through it fails while the others take a write) and that once healed it
// catches up: a local read through it sees the write.
func TestPartition(t *testing.T) {
	members, err := StartIsolatedCluster(t, 3)
	if err != nil {
		t.Skip(err)
	}
	var leader, follower *Member
	for ; leader == nil; time.Sleep(50 * time.Millisecond) {
		leader = Leader(t, members)
	}
	for _, m := range members {
		if m != leader {
			follower = m
		}
	}
	follower.Partition(t)
	if err := put(leader, "k", "v"); err != nil {
		t.Fatalf("a write through the leader, a follower partitioned: %v", err)
	}
	if _, err := localGet(follower, "k"); err == nil {
		t.Fatal("a read through the partitioned member succeeded")
	}
	follower.Heal(t)
	start := time.Now()
	follower.WaitCaughtUp(t, leader)
	t.Logf("caught up %s after healing", time.Since(start))
	if v, err := localGet(follower, "k"); err != nil || v != "v" {
		t.Fatalf("the healed member reads %q, %v; want the write made while it was away", v, err)
	}
}

func put(m *Member, k, v string) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: time.Second})
	if err != nil {
		return err
	}
	defer func() { _ = cli.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = cli.Put(ctx, k, v)
	return err
}

// localGet reads from the member's own copy, without asking the leader.
func localGet(m *Member, k string) (string, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: time.Second})
	if err != nil {
		return "", err
	}
	defer func() { _ = cli.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, k, clientv3.WithSerializable())
	if err != nil || len(resp.Kvs) == 0 {
		return "", err
	}
	return string(resp.Kvs[0].Value), nil
}
