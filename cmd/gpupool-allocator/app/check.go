package app

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/gpupool/gpupool/allocator/service"
	"github.com/gpupool/gpupool/allocator/store"
	"github.com/gpupool/gpupool/internal/cli"
)

// Check is --check: it loads the store without changing it, restores what
// it holds into a scratch pool as a starting allocator would, and says
// what it found on stdout, its faults on stderr. exit is 0 for a sound
// store, 1 for a damaged or inconsistent one. Without --check it is not
// done, and the allocator serves.
func Check(o *Options, stdout, stderr io.Writer) (exit int, done bool) {
	if !o.Check {
		return 0, false
	}
	if err := validStore(o.Store); err != nil {
		fmt.Fprintf(stderr, "gpupool-allocator: %v\n", err)
		return cli.ExitUsage, true
	}
	st, where, err := loadStore(o)
	if err != nil {
		fmt.Fprintf(stderr, "gpupool-allocator: store %s: %v\n", where, err)
		return 1, true
	}
	report, err := service.CheckState(st, time.Now())
	if err != nil {
		fmt.Fprintf(stderr, "gpupool-allocator: store %s: %v\n", where, err)
		return 1, true
	}
	for _, m := range report.Misfits {
		fmt.Fprintf(stderr, "gpupool-allocator: store %s: lease %s does not fit its server: %v\n", where, m.ID, m.Err)
	}
	fmt.Fprintf(stdout, "store %s: %d servers, %d leases (%d expired: a start would end them), next lease ID %d\n",
		where, report.Servers, report.Leases, report.Expired, report.NextID+1)
	if len(report.Misfits) > 0 {
		fmt.Fprintf(stdout, "inconsistent: %d leases would be dropped on start\n", len(report.Misfits))
		return 1, true
	}
	fmt.Fprintln(stdout, "ok")
	return 0, true
}

// loadStore reads what the store holds, changing nothing, and says where
// it is.
func loadStore(o *Options) (st store.State, where string, err error) {
	if o.Store == "bolt" {
		st, err = store.CheckBolt(o.DataDir, time.Second)
		return st, o.DataDir, err
	}
	where = o.EtcdEndpoints + o.EtcdPrefix
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := store.OpenEtcd(ctx, o.etcdEndpoints(), o.EtcdPrefix, o.EtcdSessionTTL)
	if err != nil {
		return st, where, err
	}
	defer func() { _ = e.Close() }()
	st, err = e.Load(ctx)
	return st, where, err
}
