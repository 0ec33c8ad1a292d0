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

// maxTxnOps stays under etcd's default --max-txn-ops (128), the commit
// marker included.
const maxTxnOps = 100

// attemptTimeout bounds one transaction: a request to a member that lost
// its leader would wait for etcd's own request timeout (seconds), while a
// retry through another member commits once a new leader is elected.
const attemptTimeout = time.Second

// Etcd keeps the state in etcd so that several allocator replicas can run:
// one leads (an etcd election) and writes; the others wait to take over.
// Every write is guarded by the leader's election key, so a replica that
// lost leadership can no longer change anything.
type Etcd struct {
	cli        *clientv3.Client
	prefix     string
	sessionTTL time.Duration
	session    *concurrency.Session
	election   *concurrency.Election
	leader     string // the election key this replica holds while it leads
	rev        int64  // its create revision
	// committed is the revision of this leader's last write, the commit
	// marker's: a write applies only while the marker is still there, so
	// a retried write whose first attempt committed, or a stale attempt
	// that reaches etcd late, changes nothing.
	committed int64
}

// OpenEtcd connects to etcd and opens a session whose lease lasts
// sessionTTL: when this replica dies, a standby takes over after that long.
func OpenEtcd(ctx context.Context, endpoints []string, prefix string, sessionTTL time.Duration) (*Etcd, error) {
	// Keepalive pings find a member that stopped answering (partitioned
	// away, frozen) and move the streams on it, the session's keepalive
	// and the election's watch, to another; etcd refuses pings more often
	// than every 5s (--grpc-keepalive-min-time).
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Context: ctx,
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("etcd %v: %w", endpoints, err)
	}
	e := &Etcd{cli: cli, prefix: strings.TrimRight(prefix, "/") + "/", sessionTTL: sessionTTL}
	if err := e.openSession(); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("etcd %v: %w", endpoints, err)
	}
	return e, nil
}

func (e *Etcd) openSession() error {
	ttl := max(int(e.sessionTTL.Seconds()), 1)
	// The grant is bounded: a member that stopped answering would hold it
	// forever, and the next try goes to another. (The session's keepalive
	// must not be: it lives on the client's context.)
	ctx, cancel := context.WithTimeout(e.cli.Ctx(), e.sessionTTL+attemptTimeout)
	lease, err := e.cli.Grant(ctx, int64(ttl))
	cancel()
	if err != nil {
		return fmt.Errorf("opening a session: %w", err)
	}
	session, err := concurrency.NewSession(e.cli, concurrency.WithLease(lease.ID), concurrency.WithTTL(ttl))
	if err != nil {
		return fmt.Errorf("opening a session: %w", err)
	}
	e.session, e.election = session, concurrency.NewElection(session, e.prefix+"leader")
	return nil
}

func (e *Etcd) commitKey() string { return e.prefix + "meta/commit" }

// Campaign blocks until this replica leads (or ctx ends). After StepDown,
// or once the session ended, it campaigns in a new session.
func (e *Etcd) Campaign(ctx context.Context, id string) error {
	if e.session == nil || sessionEnded(e.session) {
		if err := e.openSession(); err != nil {
			return err
		}
	}
	// A session that ends while it waits its turn ends the campaign; the
	// next one opens a new session.
	campaign, cancel := context.WithCancel(ctx)
	defer cancel()
	session := e.session
	go func() {
		select {
		case <-session.Done():
			cancel()
		case <-campaign.Done():
		}
	}()
	if err := e.election.Campaign(campaign, id); err != nil {
		if ctx.Err() == nil && sessionEnded(session) {
			return errors.New("the session ended while campaigning")
		}
		return err
	}
	// The election also returns once the keys before this replica's are
	// gone when its own went with them: it leads only if its key is there.
	key, rev := e.election.Key(), e.election.Rev()
	check, cancelCheck := context.WithTimeout(ctx, attemptTimeout)
	defer cancelCheck()
	resp, err := e.cli.Txn(check).If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
		Then(clientv3.OpGet(e.commitKey())).Commit()
	switch {
	case err != nil:
		_ = e.StepDown()
		return fmt.Errorf("reading the commit marker: %w", err)
	case !resp.Succeeded:
		_ = e.StepDown()
		return ErrNotLeader
	}
	e.committed = 0
	if marker := resp.Responses[0].GetResponseRange().Kvs; len(marker) > 0 {
		e.committed = marker[0].ModRevision
	}
	e.leader, e.rev = key, rev
	return nil
}

// StepDown gives up leadership: it ends the session, so that a standby
// takes over at once and this replica's writes are refused from then on.
// The next Campaign opens a new one.
func (e *Etcd) StepDown() error {
	e.leader = ""
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = e.election.Resign(ctx)
	err := e.session.Close()
	e.session = nil
	return err
}

func sessionEnded(s *concurrency.Session) bool {
	select {
	case <-s.Done():
		return true
	default:
		return false
	}
}

// Lost is closed when the current session ends: this replica no longer
// leads.
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
		n := min(len(ops), maxTxnOps-1)
		if err := e.commit(ctx, ops[:n]); err != nil {
			return err
		}
		ops = ops[n:]
	}
	return nil
}

// commit applies ops in one transaction, with the commit marker, while
// this replica leads and the marker is the one it last wrote. When the
// marker moved although this replica still leads, only this replica can
// have moved it, with these same ops (its writes are sequential and a
// write's attempts all expect the marker it found): an earlier attempt
// committed, whose answer was lost.
func (e *Etcd) commit(ctx context.Context, ops []clientv3.Op) error {
	attempt, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	resp, err := e.cli.Txn(attempt).
		If(clientv3.Compare(clientv3.CreateRevision(e.leader), "=", e.rev),
			clientv3.Compare(clientv3.ModRevision(e.commitKey()), "=", e.committed)).
		Then(append(ops[:len(ops):len(ops)], clientv3.OpPut(e.commitKey(), e.leader))...).
		Else(clientv3.OpGet(e.leader), clientv3.OpGet(e.commitKey())).
		Commit()
	switch {
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case resp.Succeeded:
		e.committed = resp.Header.Revision
		return nil
	}
	held, marker := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	if len(held) == 0 || held[0].CreateRevision != e.rev || len(marker) == 0 {
		return ErrNotLeader
	}
	e.committed = marker[0].ModRevision
	return nil
}

// Close implements Store: it resigns, so a standby takes over at once.
func (e *Etcd) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if e.session != nil {
		if e.leader != "" {
			_ = e.election.Resign(ctx)
		}
		_ = e.session.Close()
	}
	return e.cli.Close()
}
