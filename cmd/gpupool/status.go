package main

import (
	"cmp"
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
	var idle bool
	return queryCmd("leases", "Lists live leases: who holds which share of which GPU; with --idle, the leases measured idle, longest first.", args, stdout, stderr,
		func(fs *flag.FlagSet) {
			fs.StringVar(&f.Namespace, "namespace", "", "only this namespace")
			fs.StringVar(&f.Server, "server", "", "only this server")
			fs.StringVar(&f.OwnerUID, "owner-uid", "", "only the leases of the owner with this UID (a pod's)")
			fs.StringVar(&f.Selector, "selector", "", "only leases whose owner has these labels (app=tf-training)")
			fs.BoolVar(&idle, "idle", false, "only the leases measured idle under their namespace's idle policy: for how long, whether that is its whole window, and when a policy that reclaims gives their GPUs back (with --namespace and --server only)")
		},
		func(ctx context.Context, cl *client.Client) (any, error) {
			if idle {
				return idleLeases(ctx, cl, f)
			}
			return cl.Leases(ctx, f)
		},
		func(tw *tabwriter.Writer, v any) {
			if idle {
				idleTable(tw, v.([]api.ConsoleLease))
				return
			}
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

// idleLeases are the leases the console's view (the token's) shows
// measured idle, in f's namespace and server, longest idle first.
func idleLeases(ctx context.Context, cl *client.Client, f client.LeaseFilter) ([]api.ConsoleLease, error) {
	v, err := cl.Console(ctx)
	if err != nil {
		return nil, err
	}
	out := slices.DeleteFunc(v.Leases, func(l api.ConsoleLease) bool {
		return l.IdleSeconds == nil || f.Namespace != "" && l.Namespace != f.Namespace || f.Server != "" && l.Server != f.Server
	})
	slices.SortStableFunc(out, func(a, b api.ConsoleLease) int { return cmp.Compare(*b.IdleSeconds, *a.IdleSeconds) })
	return out, nil
}

// idleTable: IDLE is how long the lease has been measured idle, WINDOW
// whether that is its policy's whole window, RECLAIMED when a policy that
// reclaims gives its GPUs back unless they are used before.
func idleTable(tw *tabwriter.Writer, leases []api.ConsoleLease) {
	fmt.Fprintln(tw, "LEASE\tNAMESPACE\tPOD\tSERVER\tSHARE\tUSE\tIDLE\tWINDOW\tRECLAIMED")
	for _, l := range leases {
		use, window, reclaimed := "unknown", "not yet", "never (report)"
		if l.Use != nil {
			use = fmt.Sprintf("%.0f%%", *l.Use*100)
		}
		if l.Idle {
			window = "whole"
		}
		if l.ReclaimAt != nil {
			reclaimed = l.ReclaimAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f GPUs\t%s\t%s\t%s\t%s\n", l.ID, l.Namespace, l.Pod, l.Server, l.ShareGPUs, use,
			(time.Duration(*l.IdleSeconds) * time.Second).String(), window, reclaimed)
	}
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
