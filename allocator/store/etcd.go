package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// maxTxnOps stays under etcd's default --max-txn-ops (128).
const maxTxnOps = 100

// Etcd keeps the state in etcd so that several allocator replicas can run:
// one leads (an etcd election) and writes; the others wait to take over.
// Every write is guarded by the leader's election key, so a replica that
// lost leadership can no longer change anything.
type Etcd struct {
	cli      *clientv3.Client
	prefix   string
	session  *concurrency.Session
	election *concurrency.Election
	leader   string // the election key this replica holds once it leads
	rev      int64  // its create revision
}

// OpenEtcd connects to etcd and opens a session whose lease lasts
// sessionTTL: when this replica dies, a standby takes over after that long.
func OpenEtcd(ctx context.Context, endpoints []string, prefix string, sessionTTL time.Duration) (*Etcd, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Context: ctx})
	if err != nil {
		return nil, fmt.Errorf("etcd %v: %w", endpoints, err)
	}
	session, err := concurrency.NewSession(cli, concurrency.WithTTL(max(int(sessionTTL.Seconds()), 1)))
	if err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("etcd %v: opening a session: %w", endpoints, err)
	}
	prefix = strings.TrimRight(prefix, "/") + "/"
	return &Etcd{cli: cli, prefix: prefix, session: session, election: concurrency.NewElection(session, prefix+"leader")}, nil
}

// Campaign blocks until this replica leads (or ctx ends).
func (e *Etcd) Campaign(ctx context.Context, id string) error {
	if err := e.election.Campaign(ctx, id); err != nil {
		return err
	}
	e.leader, e.rev = e.election.Key(), e.election.Rev()
	return nil
}

// Lost is closed when this replica's session ends: it no longer leads.
func (e *Etcd) Lost() <-chan struct{} { return e.session.Done() }

// Name implements Store.
func (*Etcd) Name() string { return "etcd" }

// Load implements Store.
func (e *Etcd) Load(ctx context.Context) (State, error) {
	var st State
	resp, err := e.cli.Get(ctx, e.prefix, clientv3.WithPrefix())
	if err != nil {
		return st, err
	}
	for _, kv := range resp.Kvs {
		key := strings.TrimPrefix(string(kv.Key), e.prefix)
		switch {
		case strings.HasPrefix(key, "servers/"):
			err = appendDecoded(&st.Servers, decodeServer, kv.Value)
		case strings.HasPrefix(key, "leases/"):
			err = appendDecoded(&st.Leases, decodeLease, kv.Value)
		case strings.HasPrefix(key, "quotas/"):
			err = appendDecoded(&st.Quotas, decodeQuota, kv.Value)
		case key == "meta/next-id":
			st.NextID, err = strconv.ParseUint(string(kv.Value), 10, 64)
		}
		if err != nil {
			return st, fmt.Errorf("%s: %w", kv.Key, err)
		}
	}
	return st, nil
}

// ErrNotLeader is returned by Apply once this replica lost leadership.
var ErrNotLeader = errors.New("etcd: this allocator no longer leads")

// Apply implements Store: the changes in as few transactions as etcd
// allows, each applied only while this replica still holds leadership.
func (e *Etcd) Apply(ctx context.Context, changes []Change) error {
	if e.leader == "" {
		return ErrNotLeader
	}
	// etcd refuses a key twice in one transaction: keep each key's last
	// operation, which is what the batch leaves behind.
	var keys []string
	last := map[string]clientv3.Op{}
	set := func(key string, op clientv3.Op) {
		if _, seen := last[key]; !seen {
			keys = append(keys, key)
		}
		last[key] = op
	}
	putUnder := func(dir string) func(string, []byte) error {
		return func(name string, data []byte) error {
			key := e.prefix + dir + name
			set(key, clientv3.OpPut(key, string(data)))
			return nil
		}
	}
	for _, c := range changes {
		if err := putRecords(c.Servers, serverKey, encodeServer, putUnder("servers/")); err != nil {
			return err
		}
		if err := putRecords(c.Leases, leaseKey, encodeLease, putUnder("leases/")); err != nil {
			return err
		}
		for _, id := range c.Ended {
			key := e.prefix + "leases/" + id
			set(key, clientv3.OpDelete(key))
		}
		if err := putRecords(c.Quotas, quotaKey, encodeQuota, putUnder("quotas/")); err != nil {
			return err
		}
		if c.NextID > 0 {
			key := e.prefix + "meta/next-id"
			set(key, clientv3.OpPut(key, strconv.FormatUint(c.NextID, 10)))
		}
	}
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = last[k]
	}
	for len(ops) > 0 {
		n := min(len(ops), maxTxnOps)
		resp, err := e.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(e.leader), "=", e.rev)).
			Then(ops[:n]...).Commit()
		if err != nil {
			return err
		}
		if !resp.Succeeded {
			return ErrNotLeader
		}
		ops = ops[n:]
	}
	return nil
}

// Close implements Store: it resigns, so a standby takes over at once.
func (e *Etcd) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if e.leader != "" {
		_ = e.election.Resign(ctx)
	}
	_ = e.session.Close()
	return e.cli.Close()
}
