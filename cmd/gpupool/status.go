package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/cli"
)

// queryCmd is the shape of the read-only commands: flags, a client call,
// and a table or JSON rendering of what it returned.
func queryCmd(name, usage string, args []string, stdout, stderr io.Writer,
	extra func(fs *flag.FlagSet), fetch func(ctx context.Context, cl *client.Client) (any, error), table func(tw *tabwriter.Writer, v any)) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	output := fs.String("output", "table", "table or json")
	if extra != nil {
		extra(fs)
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: gpupool %s [flags]\n\n%s\n\nFlags:\n", name, usage)
		fs.PrintDefaults()
	}
	if exit, ok := cli.Parse(fs, args, stdout, stderr); !ok {
		return exit
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "gpupool %s: --output %q is not one of table, json\n", name, *output)
		return exitUsage
	}
	cl, ok := cf.client(stderr)
	if !ok {
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := fetch(ctx, cl)
	if err != nil {
		return allocatorFailed(stderr, name, err)
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			return exitFailed
		}
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	table(tw, v)
	if err := tw.Flush(); err != nil {
		return exitFailed
	}
	return 0
}

func poolCmd(args []string, stdout, stderr io.Writer) int {
	const poolUsage = "Usage: gpupool pool status [flags] (gpupool pool status --help lists them)"
	switch {
	case len(args) == 1 && slices.Contains([]string{"-h", "-help", "--help"}, args[0]):
		fmt.Fprintln(stdout, poolUsage)
		return 0
	case len(args) == 0 || args[0] != "status":
		fmt.Fprintln(stderr, poolUsage)
		return exitUsage
	}
	return queryCmd("pool status", "Lists the pool's servers and GPUs: model, memory, leased share, health.", args[1:], stdout, stderr, nil,
		func(ctx context.Context, cl *client.Client) (any, error) { return cl.Pool(ctx) },
		func(tw *tabwriter.Writer, v any) {
			fmt.Fprintln(tw, "SERVER\tGPU\tMODEL\tMEMORY\tLEASED\tHEALTH\tSERVER STATE\tLEASES")
			for _, s := range v.(api.PoolStatus).Servers {
				state := "schedulable"
				if !s.Schedulable {
					state = "no heartbeat"
				}
				for _, g := range s.GPUs {
					health := "healthy"
					if !g.Healthy {
						health = "UNHEALTHY"
					}
					fmt.Fprintf(tw, "%s\t%d\t%s\t%.0fGiB\t%s\t%s\t%s\t%d\n", s.Name, g.Index, g.Model,
						float64(g.MemoryBytes)/(1<<30), g.Allocated(), health, state, s.Leases)
				}
			}
		})
}

func leasesCmd(args []string, stdout, stderr io.Writer) int {
	var f client.LeaseFilter
	return queryCmd("leases", "Lists live leases: who holds which share of which GPU.", args, stdout, stderr,
		func(fs *flag.FlagSet) {
			fs.StringVar(&f.Namespace, "namespace", "", "only this namespace")
			fs.StringVar(&f.Server, "server", "", "only this server")
			fs.StringVar(&f.OwnerUID, "owner-uid", "", "only the leases of the owner with this UID (a pod's)")
			fs.StringVar(&f.Selector, "selector", "", "only leases whose owner has these labels (app=tf-training)")
		},
		func(ctx context.Context, cl *client.Client) (any, error) { return cl.Leases(ctx, f) },
		func(tw *tabwriter.Writer, v any) {
			fmt.Fprintln(tw, "LEASE\tNAMESPACE\tPOD\tSERVER\tGPUS\tEXPIRES")
			for _, l := range api.CoreLeases(v.([]api.Lease)) {
				var gpus []string
				for _, g := range l.GPUs {
					gpus = append(gpus, fmt.Sprintf("%d:%s", g.Index, g.Share))
				}
				expires := "until released"
				if !l.UntilReleased() {
					expires = time.Until(l.ExpiresAt).Round(time.Second).String()
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", l.ID, l.Namespace, l.Owner.Pod, l.Server,
					strings.Join(gpus, ","), expires)
			}
		})
}

func quotaCmd(args []string, stdout, stderr io.Writer) int {
	return queryCmd("quota", "Lists GPU quota and use per namespace, in percent of one GPU (requests.bitfusion.io/gpu).", args, stdout, stderr, nil,
		func(ctx context.Context, cl *client.Client) (any, error) { return cl.Quotas(ctx) },
		func(tw *tabwriter.Writer, v any) {
			fmt.Fprintln(tw, "NAMESPACE\tUSED\tHARD")
			for _, wire := range v.([]api.QuotaStatus) {
				q := wire.Core()
				hard := "none"
				if q.Limited {
					hard = q.Hard.String()
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", q.Namespace, q.Used, hard)
			}
		})
}
