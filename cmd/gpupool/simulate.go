package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/simulate"
)

func simulateCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	nodes := fs.String("nodes", simulate.DefaultNodes, "node list CSV (sn,cpu_milli,memory_mib,gpu,model); the embedded OpenB cluster by default")
	pods := fs.String("pods", simulate.DefaultPods, "pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec]); the embedded default trace by default (also embedded: traces/openb_pod_list_{gpushare40,gpuspec10,multigpu20}.csv)")
	seedList := fs.String("seeds", "42-51", "seeds to replay with, as a list and ranges: 42-51 or 1,3,5-7")
	policyList := fs.String("policies", "all", "comma-separated placement policies, or all: "+strings.Join(allocator.PolicyNames(), ", "))
	output := fs.String("output", "table", "result format: table or json")
	workers := fs.Int("workers", runtime.GOMAXPROCS(0), "replays to run at once")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: gpupool simulate [flags]

Replays an Alibaba OpenB GPU trace with the protocol of the FGD paper
(USENIX ATC'23): pods arrive in a seeded shuffle, resampled with replacement
until the GPU share asked reaches 130% of the cluster's; nothing departs.
For each policy, averaged over seeds, it reports the GPU share left
unallocated when arrivals reach 100% and 130% of capacity, the fragmented
share of the free GPU share at 90% (FGD's measure), and placement decisions
per second on one core. Progress goes to stderr, results to stdout.

Flags:
`)
		fs.PrintDefaults()
	}
	if exit, ok := cli.Parse(fs, args, stdout, stderr); !ok {
		return exit
	}
	seeds, err := simulate.ParseSeeds(*seedList)
	if err != nil {
		fmt.Fprintf(stderr, "gpupool simulate: --seeds %q: %v\n", *seedList, err)
		return exitUsage
	}
	policies, err := parsePolicies(*policyList)
	if err != nil {
		fmt.Fprintf(stderr, "gpupool simulate: --policies %q: %v\n", *policyList, err)
		return exitUsage
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "gpupool simulate: --output %q is not one of table, json\n", *output)
		return exitUsage
	}
	tr, err := simulate.LoadTrace(*nodes, *pods)
	if err != nil {
		fmt.Fprintln(stderr, "gpupool simulate:", err)
		return exitFailed
	}
	fmt.Fprintf(stderr, "replaying %s on %s: %d pods, %d servers, %d policies x %d seeds on %d workers\n",
		*pods, *nodes, len(tr.Pods), len(tr.Servers), len(policies), len(seeds), *workers)
	start := time.Now()
	results, err := simulate.RunAll(tr, policies, seeds, *workers, func(done, total int, r simulate.Result) {
		fmt.Fprintf(stderr, "[%d/%d] %-10s seed %-4d unallocated %5.2f%% at 100%% arrival  %8.0f decisions/s\n",
			done, total, r.Policy, r.Seed, r.UnallocatedPct[100], float64(r.Decisions)/r.PlaceTime.Seconds())
	})
	if err != nil {
		fmt.Fprintln(stderr, "gpupool simulate:", err)
		return exitFailed
	}
	fmt.Fprintf(stderr, "done in %s\n", time.Since(start).Round(time.Millisecond))
	summaries := simulate.Summarize(results)
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(summaries); err != nil {
			fmt.Fprintln(stderr, "gpupool simulate:", err)
			return exitFailed
		}
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tunallocated GPU % at 100%\tat 130%\tfragmentation % at 90%\tdecisions/s\tseeds\t")
	for _, s := range summaries {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.0f\t%d\t\n", s.Policy, s.UnallocatedAt100, s.UnallocatedAt130,
			s.FragmentationAt90, s.DecisionsPerSec, s.Seeds)
	}
	if err := tw.Flush(); err != nil {
		return exitFailed
	}
	return 0
}

func parsePolicies(list string) ([]string, error) {
	if list == "all" {
		return allocator.PolicyNames(), nil
	}
	var out []string
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if _, err := allocator.NewPolicy(name, allocator.PolicyOptions{}); err != nil {
			return nil, err
		}
		out = append(out, name)
	}
	return out, nil
}
