package leases

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Election makes one replica of several the one that reconciles, named by
// a coordination.k8s.io Lease. Every replica keeps its informers (the
// scheduler extender beside it reads pods from them); only the leader
// releases leases, acquires them again and sets quotas, so that a pod's
// lease is released once however many replicas run.
type Election struct {
	// Namespace and Name of the Lease object.
	Namespace, Name string
	// Identity names this replica in the Lease; unique among replicas.
	Identity string
	// LeaseDuration is how long a leader that stopped renewing (killed, cut
	// off) keeps the Lease: the longest takeover. RenewDeadline is how long
	// the leader retries renewing before it gives up; RetryPeriod, how often
	// each replica tries. kube-controller-manager's defaults when 0: 15 s,
	// 10 s, 2 s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// DefaultElectionName is the Lease the replicas of gpupool-scheduler share.
const DefaultElectionName = "gpupool-lease-controller"

// ErrLostLeadership ends Run when this replica stopped leading while its
// context still ran: it exits, and its restart resyncs as a standby, as
// kube-controller-manager does, rather than reconcile from state the new
// leader may have changed.
var ErrLostLeadership = errors.New("leases: lost the leadership to another replica")

func (e *Election) validate() error {
	switch {
	case e.Namespace == "" || e.Name == "":
		return errors.New("leases: an election needs the namespace and the name of its Lease")
	case e.Identity == "":
		return errors.New("leases: an election needs this replica's identity")
	}
	if e.LeaseDuration == 0 {
		e.LeaseDuration = 15 * time.Second
	}
	if e.RenewDeadline == 0 {
		e.RenewDeadline = 10 * time.Second
	}
	if e.RetryPeriod == 0 {
		e.RetryPeriod = 2 * time.Second
	}
	// The Lease records its duration in whole seconds, and the standbys
	// wait out what it records: 900ms would read as 0s to them, and they
	// would take over a leader that is merely slow to renew.
	if e.LeaseDuration < time.Second || e.LeaseDuration%time.Second != 0 {
		return fmt.Errorf("leases: election lease duration %v: the Lease records whole seconds (standbys would wait %ds); use a whole number of seconds, at least 1s",
			e.LeaseDuration, int(e.LeaseDuration/time.Second))
	}
	if e.LeaseDuration <= e.RenewDeadline || e.RenewDeadline <= e.RetryPeriod || e.RetryPeriod <= 0 {
		return fmt.Errorf("leases: election timings lease %v > renew deadline %v > retry period %v > 0 do not hold",
			e.LeaseDuration, e.RenewDeadline, e.RetryPeriod)
	}
	return nil
}

// lead reconciles while this replica leads, and returns when ctx ends
// (nil) or when it stopped leading (ErrLostLeadership), once its
// reconciling has stopped.
func (c *Controller) lead(ctx context.Context) error {
	e := c.election
	leading := make(chan context.Context, 1)
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: e.Namespace, Name: e.Name},
			Client:     c.client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
		},
		LeaseDuration: e.LeaseDuration, RenewDeadline: e.RenewDeadline, RetryPeriod: e.RetryPeriod,
		// A replica stopped on purpose (a rollout, a scale-down) hands the
		// Lease over at once, not after LeaseDuration.
		ReleaseOnCancel: true,
		Name:            e.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			// Its context ends when the leadership does.
			OnStartedLeading: func(ctx context.Context) { leading <- ctx },
			// Required by client-go; reconcileUntil, ending with the
			// leadership's context, already says it stopped.
			OnStoppedLeading: func() {},
			OnNewLeader: func(identity string) {
				if identity != e.Identity {
					c.log.Info("standing by", "leader", identity)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leases: %w", err)
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		elector.Run(ctx)
	}()
	select {
	case leadership := <-leading:
		c.log.Info("leading: reconciling leases and quotas", "lease", e.Namespace+"/"+e.Name, "identity", e.Identity)
		c.reconcileUntil(leadership)
		<-stopped
	case <-stopped:
	}
	if ctx.Err() != nil {
		return nil
	}
	return ErrLostLeadership
}
