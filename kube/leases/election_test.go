package leases

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/gpupool/gpupool/kube"
)

// replica is one of several controllers on the same cluster and
// allocator, each with its own metrics.
type replica struct {
	ctrl   *Controller
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// startReplica runs a controller elected as identity until stop or the
// test's end. The timings are the shortest a Lease records (a dead
// leader is replaced within a second), the order between them
// kube-controller-manager's.
func (e *testEnv) startReplica(identity string) *replica {
	e.t.Helper()
	ctrl, err := NewController(Config{Client: e.kube, Allocator: e.alloc.Client(e.t), Unit: kube.UnitPercent, Resync: time.Hour,
		Recorder: record.NewFakeRecorder(100), Logger: slog.New(slog.NewTextHandler(e.log, nil)), Registry: prometheus.NewRegistry(),
		Election: &Election{Namespace: "gpupool", Name: DefaultElectionName, Identity: identity,
			LeaseDuration: time.Second, RenewDeadline: 600 * time.Millisecond, RetryPeriod: 100 * time.Millisecond}})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	r := &replica{ctrl: ctrl, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- ctrl.Run(ctx) }()
	e.t.Cleanup(func() { r.stop(e.t) })
	return r
}

// stop ends the replica as a rollout does, once, and checks that it
// ended cleanly.
func (r *replica) stop(t *testing.T) {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		if err := <-r.done; err != nil {
			t.Errorf("replica: %v", err)
		}
	})
}

func (r *replica) leads() bool { return testutil.ToFloat64(r.ctrl.metrics.leader) == 1 }

func (r *replica) released(reason string) float64 {
	return testutil.ToFloat64(r.ctrl.metrics.releases.WithLabelValues(reason))
}

// TestOneReplicaReconciles: of two replicas, the leader alone releases a
// deleted pod's lease; stopped, it hands over at once, and the other
// releases the next.
func TestOneReplicaReconciles(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	a := e.startReplica("a")
	eventually(t, "a leads", a.leads)
	b := e.startReplica("b")
	eventually(t, "b stands by", func() bool { return e.log.count("standing by") > 0 })

	e.place(gpuPod("first", "s1", 50))
	e.deletePod("first")
	eventually(t, "a releases the first pod's lease", func() bool { return a.released(reasonPodDeleted) == 1 })
	if b.leads() || b.released(reasonPodDeleted) != 0 {
		t.Fatalf("the standby leads (%v) or released %v leases", b.leads(), b.released(reasonPodDeleted))
	}

	a.stop(t)
	handedOver := time.Now()
	eventually(t, "b leads once a stopped", b.leads)
	t.Logf("b led %v after a stopped", time.Since(handedOver).Round(time.Millisecond))
	second := gpuPod("second", "s2", 50)
	lease := e.place(second)
	e.deletePod(second.Name)
	eventually(t, "b releases the second pod's lease", func() bool { return b.released(reasonPodDeleted) == 1 })
	if e.leaseExists(lease.ID) {
		t.Error("the second pod's lease is there")
	}
}

// TestStandbyTakesOverAPodDeletedMeanwhile: a pod deleted while no
// replica leads (the leader lost, its Lease not yet expired) has its lease
// released by the next leader's first resync.
func TestStandbyTakesOverAPodDeletedMeanwhile(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	a := e.startReplica("a")
	eventually(t, "a leads", a.leads)
	pod := gpuPod("orphan", "s1", 50)
	lease := e.place(pod)
	a.stop(t)
	e.deletePod(pod.Name) // no one leads: nothing is queued
	b := e.startReplica("b")
	eventually(t, "b leads", b.leads)
	eventually(t, "b's first resync releases the deleted pod's lease", func() bool { return !e.leaseExists(lease.ID) })
}

// TestStandbyWaitsOutASlowLeader: a leader whose renewals fail for less
// than its renew deadline (an apiserver slow under load) keeps leading,
// and the standby does not take over meanwhile: two leaders would both
// release leases. The Lease's duration, as the standby reads it, is what
// holds it back.
func TestStandbyWaitsOutASlowLeader(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	var slow atomic.Bool
	e.kube.PrependReactor("update", "leases", func(action k8stesting.Action) (bool, runtime.Object, error) {
		lease, ok := action.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		if slow.Load() && ok && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity == "a" {
			return true, nil, errors.New("the server was unable to return a response in the time allotted")
		}
		return false, nil, nil
	})
	a := e.startReplica("a")
	eventually(t, "a leads", a.leads)
	b := e.startReplica("b")
	eventually(t, "b stands by", func() bool { return e.log.count("standing by") > 0 })
	slow.Store(true)
	time.Sleep(400 * time.Millisecond) // under the renew deadline, 600ms
	slow.Store(false)
	time.Sleep(300 * time.Millisecond) // a renews again; b polls thrice
	if n := e.log.count("identity=b"); n != 0 || b.leads() {
		t.Fatalf("the standby took over a leader that renewed late: led %d times, leads now %v", n, b.leads())
	}
	if !a.leads() {
		t.Error("a no longer leads after renewing within its deadline")
	}
}

func TestElectionValidates(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	for name, el := range map[string]Election{
		"no namespace": {Name: "n", Identity: "a"},
		"no identity":  {Namespace: "gpupool", Name: "n"},
		"lease under a second": {Namespace: "gpupool", Name: "n", Identity: "a",
			LeaseDuration: 900 * time.Millisecond, RenewDeadline: 600 * time.Millisecond, RetryPeriod: 100 * time.Millisecond},
		"lease in part seconds": {Namespace: "gpupool", Name: "n", Identity: "a",
			LeaseDuration: 1500 * time.Millisecond, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond},
		"renew >= lease": {Namespace: "gpupool", Name: "n", Identity: "a",
			LeaseDuration: time.Second, RenewDeadline: time.Second, RetryPeriod: time.Millisecond},
	} {
		if _, err := NewController(Config{Client: e.kube, Allocator: e.admin, Election: &el}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestLostLeadershipEndsRun: a leader that cannot renew its Lease (cut
// off from kube-apiserver) past the renew deadline stops reconciling, and
// its Run returns ErrLostLeadership, for the process to exit and start
// again as a standby.
func TestLostLeadershipEndsRun(t *testing.T) {
	e := newEnv(t, kube.UnitPercent)
	// The fake's reactors are not safe to add while it serves: this one is
	// there from the start, and refuses once cut off.
	var cutOff atomic.Bool
	e.kube.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if cutOff.Load() {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	a := e.startReplica("a")
	eventually(t, "a leads", a.leads)
	cutOff.Store(true)
	select {
	case err := <-a.done:
		a.once.Do(func() {}) // ended: nothing to stop
		if !errors.Is(err, ErrLostLeadership) {
			t.Fatalf("Run returned %v, want ErrLostLeadership", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still runs 10 s after the Lease went to another replica")
	}
	if a.leads() {
		t.Error("the leader gauge still says 1")
	}
}
