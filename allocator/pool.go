package allocator

import (
	"cmp"
	"container/heap"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"time"

	"github.com/gpupool/gpupool/inventory"
)

// PoolConfig sets a Pool's policy and lease lifetimes.
type PoolConfig struct {
	Policy Policy
	// DefaultTTL is the lifetime of a lease whose request names none;
	// MaxTTL caps what a request may ask for.
	DefaultTTL time.Duration
	MaxTTL     time.Duration
}

// Pool is the allocator's state: servers, quotas and leases. It is a pure
// state machine: every operation on leases takes the current time and
// first ends the leases whose time ran out, so lease expiry is a function
// of state and the clock the caller passes in; Expire hands the ended
// leases to the caller. A Pool is not safe for concurrent use; the service
// serializes calls.
type Pool struct {
	cfg       PoolConfig
	cluster   *Cluster
	servers   []inventory.Server // by node index
	nodeIndex map[string]int     // server name -> node index
	leases    map[string]*Lease
	// onServer is the live leases by server and ID: each server's daemon
	// lists its own every few seconds, at a cost of its leases, not the
	// pool's.
	onServer map[string]map[string]*Lease
	// expiries orders the leases that can expire by when, so that every
	// call ends those due without looking at the others. A renewal pushes
	// the lease again; an entry whose lease has ended or moved its expiry
	// is dropped when it comes up.
	expiries expiryQueue
	byKey    map[string]string // namespace/idempotency key -> lease ID
	quota    map[string]Share  // namespace -> hard limit
	used     map[string]Share  // namespace -> leased
	nextID   uint64
	// expired holds leases ended by expiry until Expire hands them out.
	expired []Lease
}

// NewPool returns an empty pool.
func NewPool(cfg PoolConfig) (*Pool, error) {
	if cfg.Policy == nil {
		return nil, &FieldError{Field: "policy", Value: "", Limit: "must be set"}
	}
	if cfg.DefaultTTL <= 0 || cfg.MaxTTL < cfg.DefaultTTL {
		return nil, &FieldError{Field: "default-ttl", Value: cfg.DefaultTTL.String(), Limit: "must be positive and at most max-ttl " + cfg.MaxTTL.String()}
	}
	return &Pool{
		cfg: cfg, cluster: NewCluster(), nodeIndex: map[string]int{},
		leases: map[string]*Lease{}, onServer: map[string]map[string]*Lease{}, byKey: map[string]string{},
		quota: map[string]Share{}, used: map[string]Share{},
	}, nil
}

// RegisterServer adds a server, or updates a known one: its labels, host
// capacity and the health of its GPUs. A server's GPUs (count, UUIDs,
// models, memory) can change only while it holds no leases.
func (p *Pool) RegisterServer(s inventory.Server) error {
	if err := validateServer(&s); err != nil {
		return err
	}
	return p.register(s)
}

// RestoreServer puts back a server recovered from durable storage. Its
// shape is checked as RegisterServer checks it, its name and labels are
// not: the store may predate those checks.
func (p *Pool) RestoreServer(s inventory.Server) error {
	if err := validateShape(&s); err != nil {
		return err
	}
	return p.register(s)
}

func (p *Pool) register(s inventory.Server) error {
	s = cloneServer(&s)
	i, known := p.nodeIndex[s.Name]
	if !known {
		if _, err := p.cluster.AddNode(&s); err != nil {
			return err
		}
		p.nodeIndex[s.Name] = len(p.servers)
		p.servers = append(p.servers, s)
		return nil
	}
	old := &p.servers[i]
	if !sameDevices(old.GPUs, s.GPUs) || old.CPUMilli != s.CPUMilli || old.MemoryBytes != s.MemoryBytes {
		if n := p.leasesOn(s.Name); n > 0 {
			return &FieldError{Field: "server", Value: s.Name, Limit: fmt.Sprintf("cannot change its GPUs, CPU or memory while %d leases hold shares on it", n)}
		}
		if err := p.cluster.ResetNode(i, &s); err != nil {
			return err
		}
	}
	for gi := range s.GPUs {
		p.cluster.SetGPUHealth(i, gi, s.GPUs[gi].Healthy)
	}
	p.servers[i] = s
	return nil
}

// sameDevices reports whether two GPU lists describe the same devices,
// health aside.
func sameDevices(a, b []inventory.GPU) bool {
	return slices.EqualFunc(a, b, func(x, y inventory.GPU) bool {
		return x.Index == y.Index && x.UUID == y.UUID && x.Model == y.Model && x.MemoryBytes == y.MemoryBytes
	})
}

// LeasesOn returns the leases live at now on a server, in ID order.
func (p *Pool) LeasesOn(now time.Time, server string) []Lease {
	p.expireDue(now)
	return cloneSorted(p.onServer[server])
}

func (p *Pool) leasesOn(server string) int { return len(p.onServer[server]) }

// SetGPUHealth marks one GPU of a registered server healthy or not, as its
// heartbeat says; an unhealthy GPU keeps its leases and takes no new ones.
func (p *Pool) SetGPUHealth(server string, gpu int, healthy bool) error {
	i, known := p.nodeIndex[server]
	if !known {
		return &ServerNotFoundError{Name: server}
	}
	if gpu < 0 || gpu >= len(p.servers[i].GPUs) {
		return &FieldError{Field: "gpus.index", Value: strconv.Itoa(gpu), Limit: fmt.Sprintf("out of range 0..%d", len(p.servers[i].GPUs)-1)}
	}
	p.servers[i].GPUs[gpu].Healthy = healthy
	p.cluster.SetGPUHealth(i, gpu, healthy)
	return nil
}

// SetSchedulable marks a server as taking new leases or not (while its
// heartbeat is lost), and reports whether that changed it; its leases stay
// until released or expired.
func (p *Pool) SetSchedulable(server string, ok bool) (changed bool, err error) {
	i, known := p.nodeIndex[server]
	if !known {
		return false, &ServerNotFoundError{Name: server}
	}
	return p.cluster.SetSchedulable(i, ok), nil
}

// SetQuota sets the GPU share a namespace's leases may hold in all. A
// namespace without a quota is unlimited. Lowering a quota below what is
// in use keeps the leases but admits no more.
func (p *Pool) SetQuota(namespace string, hard Share) error {
	if err := validateNamespace(namespace); err != nil {
		return err
	}
	if hard < 0 {
		return &FieldError{Field: "quota", Value: hard.String(), Limit: "must be at least 0"}
	}
	p.quota[namespace] = hard
	return nil
}

// RemoveQuota makes a namespace unlimited.
func (p *Pool) RemoveQuota(namespace string) error {
	if err := validateNamespace(namespace); err != nil {
		return err
	}
	delete(p.quota, namespace)
	return nil
}

// Quota returns a namespace's quota and use at now.
func (p *Pool) Quota(now time.Time, namespace string) QuotaStatus {
	p.expireDue(now)
	return p.quotaStatus(namespace)
}

func (p *Pool) quotaStatus(namespace string) QuotaStatus {
	hard, limited := p.quota[namespace]
	return QuotaStatus{Namespace: namespace, Hard: hard, Limited: limited, Used: p.used[namespace]}
}

// Acquire grants a lease for r, or returns why not: a *FieldError for bad
// input, a *QuotaExceededError or a *NoCapacityError. A request whose
// idempotency key matches a live lease of the namespace returns that lease.
func (p *Pool) Acquire(now time.Time, r Request) (Lease, error) {
	p.expireDue(now)
	if err := r.Validate(); err != nil {
		return Lease{}, err
	}
	if r.TTL > p.cfg.MaxTTL {
		return Lease{}, &FieldError{Field: "ttl", Value: r.TTL.String(), Limit: "exceeds the pool's max-ttl " + p.cfg.MaxTTL.String()}
	}
	r = cloneRequest(&r)
	if r.IdempotencyKey != "" {
		if id, ok := p.byKey[r.Namespace+"/"+r.IdempotencyKey]; ok {
			l := p.leases[id]
			if err := checkRetry(l, &r); err != nil {
				return Lease{}, err
			}
			return cloneLease(l), nil
		}
	}
	l, node, err := p.place(now, &r)
	if err != nil {
		return Lease{}, err
	}
	p.nextID++
	l.ID = fmt.Sprintf("lease-%06d", p.nextID)
	p.add(node, l)
	return cloneLease(l), nil
}

// Fits returns nil when Acquire would grant r now, or why it would not;
// it changes nothing but the policy's caches. It tells a request waiting
// for capacity or quota whether trying again is worth it.
func (p *Pool) Fits(r Request) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if _, ok := p.byKey[r.Namespace+"/"+r.IdempotencyKey]; ok && r.IdempotencyKey != "" {
		return nil
	}
	_, _, err := p.place(time.Time{}, &r)
	return err
}

// place is where r's lease would go: the lease it would be (no ID yet)
// and its node, or why none fits within capacity and quota.
func (p *Pool) place(now time.Time, r *Request) (*Lease, int, error) {
	d, err := p.demand(r)
	if err != nil {
		return nil, 0, err
	}
	if d.GPUBytes == 0 {
		if err := p.checkQuota(r.Namespace, Share(d.GPUs)*d.PerGPU); err != nil {
			return nil, 0, err
		}
	}
	where, ok := p.cfg.Policy.Place(p.cluster, &d)
	if !ok {
		return nil, 0, p.noCapacity(r, &d)
	}
	l := p.newLease(now, r, &d, where)
	// A memory request's share is known once placed.
	if err := p.checkQuota(r.Namespace, l.Share()); err != nil {
		return nil, 0, err
	}
	return l, where.Node, nil
}

// checkRetry accepts r as a retry of the request l answered: the same
// request, candidate servers aside (a scheduler retries with the nodes it
// finds feasible then), whose candidates include l's server.
func checkRetry(l *Lease, r *Request) error {
	same := *r
	same.Servers = nil
	switch {
	case !reflect.DeepEqual(l.Request, same):
		return &IdempotencyConflictError{Key: r.IdempotencyKey, LeaseID: l.ID}
	case len(r.Servers) > 0 && !slices.Contains(r.Servers, l.Server):
		return &IdempotencyConflictError{Key: r.IdempotencyKey, LeaseID: l.ID, Server: l.Server}
	}
	return nil
}

// add books a lease on node i: its share, its quota use, its key.
func (p *Pool) add(i int, l *Lease) {
	p.cluster.hold(i, l, 1)
	p.leases[l.ID] = l
	on := p.onServer[l.Server]
	if on == nil {
		on = map[string]*Lease{}
		p.onServer[l.Server] = on
	}
	on[l.ID] = l
	if !l.UntilReleased() {
		heap.Push(&p.expiries, expiry{at: l.ExpiresAt, id: l.ID})
	}
	if q := l.Share(); q > 0 {
		p.used[l.Namespace] += q
	}
	if k := l.Request.IdempotencyKey; k != "" {
		p.byKey[l.Namespace+"/"+k] = l.ID
	}
}

// demand resolves a request against the cluster's models.
func (p *Pool) demand(r *Request) (Demand, error) {
	d := Demand{GPUs: r.GPUs, GPUBytes: r.GPUMemoryBytes, CPUMilli: r.CPUMilli, Memory: r.MemoryBytes, Link: r.Topology}
	switch {
	case r.GPUs == 0:
	case r.GPUMemoryBytes > 0:
	case r.Percent > 0:
		d.PerGPU = SharePercent(float64(r.Percent))
	default:
		d.PerGPU = WholeGPU
	}
	set, known := p.cluster.ModelSetOf(r.Models)
	if !known {
		return d, p.noCapacity(r, &d)
	}
	d.Models = set
	if len(r.Servers) > 0 {
		d.Nodes = &NodeSet{}
		registered := false
		for _, name := range r.Servers {
			if i, ok := p.nodeIndex[name]; ok {
				d.Nodes.add(i)
				registered = true
			}
		}
		if !registered {
			return d, p.noCapacity(r, &d)
		}
	}
	return d, nil
}

func (p *Pool) noCapacity(r *Request, d *Demand) error {
	e := &NoCapacityError{GPUs: r.GPUs, PerGPU: d.PerGPU, GPUBytes: r.GPUMemoryBytes, Models: r.Models,
		Link: r.Topology, CPUMilli: r.CPUMilli, Memory: r.MemoryBytes}
	asked := map[string]bool{}
	for _, name := range r.Servers {
		asked[name] = true
	}
	count := func(i int) {
		e.Known++
		if !p.cluster.Nodes[i].Schedulable {
			e.Silent++
		}
	}
	for name := range asked {
		if i, ok := p.nodeIndex[name]; ok {
			count(i)
		} else {
			e.Unregistered++
		}
	}
	if len(asked) == 0 {
		for i := range p.cluster.Nodes {
			count(i)
		}
	}
	e.Servers = len(asked)
	return e
}

func (p *Pool) checkQuota(ns string, asked Share) error {
	hard, limited := p.quota[ns]
	if limited && asked > 0 && p.used[ns]+asked > hard {
		return &QuotaExceededError{Namespace: ns, Hard: hard, InUse: p.used[ns], Asked: asked}
	}
	return nil
}

// newLease describes the lease a placement would grant; it has no ID yet.
// Its request leaves out the candidate servers: a retry need not repeat
// them, and they may be every node of a cluster.
func (p *Pool) newLease(now time.Time, r *Request, d *Demand, where Placement) *Lease {
	n := &p.cluster.Nodes[where.Node]
	s := &p.servers[where.Node]
	l := &Lease{
		Namespace: r.Namespace, Owner: r.Owner, Server: s.Name,
		CPUMilli: r.CPUMilli, MemoryBytes: r.MemoryBytes, Request: *r, GrantedAt: now,
	}
	l.Request.Servers = nil
	if !r.UntilReleased {
		l.TTL = cmp.Or(r.TTL, p.cfg.DefaultTTL)
		l.ExpiresAt = now.Add(l.TTL)
	}
	for _, gi := range where.GPUs {
		g := &n.GPUs[gi]
		share := d.share(g)
		l.GPUs = append(l.GPUs, LeaseGPU{
			Index: gi, UUID: s.GPUs[gi].UUID, Model: s.GPUs[gi].Model,
			Share: share, MemoryBytes: shareBytes(d, g, share),
		})
	}
	return l
}

// Renew extends a live lease by ttl from now (its own TTL when ttl is 0).
// A lease that lives until released has nothing to extend: it comes back
// unchanged.
func (p *Pool) Renew(now time.Time, id string, ttl time.Duration) (Lease, error) {
	l, err := p.live(now, id)
	if err != nil {
		return Lease{}, err
	}
	if ttl != 0 && ttl < MinTTL || ttl < 0 || ttl > p.cfg.MaxTTL {
		return Lease{}, &FieldError{Field: "ttl", Value: ttl.String(), Limit: "out of range " + MinTTL.String() + ".." + p.cfg.MaxTTL.String() + " (0 renews by the lease's own)"}
	}
	if l.UntilReleased() {
		return cloneLease(l), nil
	}
	if ttl == 0 {
		ttl = l.TTL
	}
	l.TTL, l.ExpiresAt = ttl, now.Add(ttl)
	heap.Push(&p.expiries, expiry{at: l.ExpiresAt, id: l.ID})
	return cloneLease(l), nil
}

// Release ends a live lease and frees its shares.
func (p *Pool) Release(now time.Time, id string) (Lease, error) {
	l, err := p.live(now, id)
	if err != nil {
		return Lease{}, err
	}
	p.end(l)
	return *l, nil
}

// Expire ends every lease whose time ran out at or before now and returns
// them, with those other operations ended since the last call, in the order
// they ended (by ID within one call).
func (p *Pool) Expire(now time.Time) []Lease {
	p.expireDue(now)
	out := p.expired
	p.expired = nil
	return out
}

// expireDue ends the leases due at now, in ID order. Every call of the
// pool makes it, so it takes the few that are due off expiries.
func (p *Pool) expireDue(now time.Time) {
	var due []*Lease
	for len(p.expiries) > 0 && !now.Before(p.expiries[0].at) {
		e := heap.Pop(&p.expiries).(expiry)
		if l, ok := p.leases[e.id]; ok && l.ExpiresAt.Equal(e.at) {
			due = append(due, l)
		}
	}
	slices.SortFunc(due, func(a, b *Lease) int { return compareIDs(a.ID, b.ID) })
	// A lease renewed away from an expiry and back to it is queued twice.
	due = slices.Compact(due)
	for _, l := range due {
		p.end(l)
		p.expired = append(p.expired, *l)
	}
	// Released and renewed leases leave entries behind until their time;
	// past twice the live leases the queue is rebuilt from those, so that
	// it grows with them rather than with churn.
	if len(p.expiries) > 2*len(p.leases)+64 {
		p.expiries = p.expiries[:0]
		for _, l := range p.leases {
			if !l.UntilReleased() {
				p.expiries = append(p.expiries, expiry{at: l.ExpiresAt, id: l.ID})
			}
		}
		heap.Init(&p.expiries)
	}
}

// live returns a lease that has not expired by now, after ending those
// that have.
func (p *Pool) live(now time.Time, id string) (*Lease, error) {
	p.expireDue(now)
	l, ok := p.leases[id]
	if !ok {
		return nil, &LeaseNotFoundError{ID: id}
	}
	return l, nil
}

// cloneSorted copies leases in ID order.
func cloneSorted(leases map[string]*Lease) []Lease {
	out := make([]Lease, 0, len(leases))
	for _, id := range sortedIDs(leases) {
		out = append(out, cloneLease(leases[id]))
	}
	return out
}

// sortedIDs orders lease IDs by their number: shorter first, as IDs are
// zero-padded to a minimum width.
func sortedIDs(leases map[string]*Lease) []string {
	ids := slices.Collect(maps.Keys(leases))
	slices.SortFunc(ids, compareIDs)
	return ids
}

// compareIDs orders lease IDs by their number.
func compareIDs(a, b string) int { return cmp.Or(cmp.Compare(len(a), len(b)), cmp.Compare(a, b)) }

func (p *Pool) end(l *Lease) {
	p.cluster.hold(p.nodeIndex[l.Server], l, -1)
	p.used[l.Namespace] -= l.Share()
	if p.used[l.Namespace] == 0 {
		delete(p.used, l.Namespace)
	}
	delete(p.leases, l.ID)
	delete(p.onServer[l.Server], l.ID)
	if len(p.onServer[l.Server]) == 0 {
		delete(p.onServer, l.Server)
	}
	if l.Request.IdempotencyKey != "" {
		delete(p.byKey, l.Namespace+"/"+l.Request.IdempotencyKey)
	}
}

// Leases returns the leases live at now, in ID order.
func (p *Pool) Leases(now time.Time) []Lease {
	p.expireDue(now)
	return cloneSorted(p.leases)
}

// EachLease calls f with each lease live at now, in no order, without the
// copies Leases makes: f reads the lease and keeps nothing of it.
func (p *Pool) EachLease(now time.Time, f func(l *Lease)) {
	p.expireDue(now)
	for _, l := range p.leases {
		f(l)
	}
}

// Lease returns one live lease.
func (p *Pool) Lease(now time.Time, id string) (Lease, error) {
	l, err := p.live(now, id)
	if err != nil {
		return Lease{}, err
	}
	return cloneLease(l), nil
}

// QuotaStatus is a namespace's quota and use.
type QuotaStatus struct {
	Namespace string
	Hard      Share
	Limited   bool
	Used      Share
}

// Quotas lists every namespace with a quota or GPU share leased at now, by
// name.
func (p *Pool) Quotas(now time.Time) []QuotaStatus {
	p.expireDue(now)
	names := map[string]bool{}
	for ns := range p.quota {
		names[ns] = true
	}
	for ns := range p.used {
		names[ns] = true
	}
	out := make([]QuotaStatus, 0, len(names))
	for _, ns := range slices.Sorted(maps.Keys(names)) {
		out = append(out, p.quotaStatus(ns))
	}
	return out
}

// Servers returns the registered servers in registration order.
func (p *Pool) Servers() []inventory.Server {
	out := make([]inventory.Server, len(p.servers))
	for i := range p.servers {
		out[i] = cloneServer(&p.servers[i])
	}
	return out
}

// Server returns a registered server.
func (p *Pool) Server(name string) (inventory.Server, bool) {
	i, known := p.nodeIndex[name]
	if !known {
		return inventory.Server{}, false
	}
	return cloneServer(&p.servers[i]), true
}

// ServerState is a registered server and what its GPUs and host have free
// now.
type ServerState struct {
	Server inventory.Server
	Node   Node
}

// ServerStates returns a copy of every registered server with what it has
// free, in registration order, for status and metrics.
func (p *Pool) ServerStates() []ServerState {
	out := make([]ServerState, len(p.servers))
	for i := range p.servers {
		out[i] = p.serverState(i)
	}
	return out
}

// ServerState returns a copy of one registered server with what it has
// free.
func (p *Pool) ServerState(name string) (ServerState, bool) {
	i, known := p.nodeIndex[name]
	if !known {
		return ServerState{}, false
	}
	return p.serverState(i), true
}

func (p *Pool) serverState(i int) ServerState {
	n := p.cluster.Nodes[i]
	n.GPUs = slices.Clone(n.GPUs)
	return ServerState{Server: cloneServer(&p.servers[i]), Node: n}
}

// The clones below keep callers from reaching into the pool's state
// through the slices and maps of what they pass in or get back.

func cloneServer(s *inventory.Server) inventory.Server {
	c := *s
	c.Labels = maps.Clone(s.Labels)
	c.GPUs = slices.Clone(s.GPUs)
	return c
}

// cloneRequest also makes empty lists and maps nil, so that a request and
// its round trip through the API or a store (which drop them) compare
// equal for idempotency.
func cloneRequest(r *Request) Request {
	c := *r
	c.Models = nil
	if len(r.Models) > 0 {
		c.Models = slices.Clone(r.Models)
	}
	c.Owner.Labels = nil
	if len(r.Owner.Labels) > 0 {
		c.Owner.Labels = maps.Clone(r.Owner.Labels)
	}
	return c
}

func cloneLease(l *Lease) Lease {
	c := *l
	c.GPUs = slices.Clone(l.GPUs)
	c.Request = cloneRequest(&l.Request)
	c.Owner = c.Request.Owner
	return c
}

// Restore puts back a lease recovered from durable storage, on the GPUs it
// was granted, after its server has been registered again. Leases that no
// longer fit (their server changed) are refused with an error, not placed
// elsewhere. Restore keeps lease IDs unique by moving the ID counter past
// the restored ID; SetNextID sets the counter from the store.
func (p *Pool) Restore(l Lease) error {
	i, ok := p.nodeIndex[l.Server]
	if !ok {
		return &ServerNotFoundError{Name: l.Server}
	}
	if _, dup := p.leases[l.ID]; dup {
		return &FieldError{Field: "lease.id", Value: l.ID, Limit: "is restored twice"}
	}
	n := &p.cluster.Nodes[i]
	for _, g := range l.GPUs {
		if g.Index < 0 || g.Index >= len(n.GPUs) || n.GPUs[g.Index].Free < g.Share || n.GPUs[g.Index].FreeBytes < g.MemoryBytes {
			return &FieldError{Field: "lease.gpus", Value: fmt.Sprintf("%s gpu %d", l.Server, g.Index), Limit: "no longer has the share the lease holds"}
		}
	}
	l = cloneLease(&l)
	p.add(i, &l)
	var seq uint64
	if _, err := fmt.Sscanf(l.ID, "lease-%d", &seq); err == nil {
		p.nextID = max(p.nextID, seq)
	}
	return nil
}

// NextID is the lease ID counter, for the store.
func (p *Pool) NextID() uint64 { return p.nextID }

// SetNextID moves the lease ID counter forward (never back).
func (p *Pool) SetNextID(n uint64) { p.nextID = max(p.nextID, n) }

// SetPolicy replaces the placement policy, for one built on a fresher
// expected workload.
func (p *Pool) SetPolicy(pol Policy) { p.cfg.Policy = pol }

// expiry is when a lease expires unless renewed.
type expiry struct {
	at time.Time
	id string
}

// expiryQueue is a heap of expiries, the earliest first (container/heap).
type expiryQueue []expiry

func (q expiryQueue) Len() int           { return len(q) }
func (q expiryQueue) Less(i, j int) bool { return q[i].at.Before(q[j].at) }
func (q expiryQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *expiryQueue) Push(x any)        { *q = append(*q, x.(expiry)) }
func (q *expiryQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}
