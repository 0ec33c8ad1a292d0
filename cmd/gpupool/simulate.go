package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/simulate"
)

// traceFlags are the flags naming the node list and the pod list.
func traceFlags(fs *flag.FlagSet) (nodes, pods *string) {
	return nodesFlag(fs), fs.String("pods", simulate.DefaultPods, "pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec]); the embedded default trace by default (also embedded: traces/openb_pod_list_{gpushare40,gpuspec10,multigpu20}.csv)")
}

func nodesFlag(fs *flag.FlagSet) *string {
	return fs.String("nodes", simulate.DefaultNodes, "node list CSV (sn,cpu_milli,memory_mib,gpu,model); the embedded OpenB cluster by default")
}

func variantSeedFlag(fs *flag.FlagSet) *uint64 {
	return fs.Uint64("variant-seed", 1, "seed of the variant derivation, apart from the replay seeds: every replay seed replays the same derived pods")
}

func seedsFlag(fs *flag.FlagSet) *string {
	return fs.String("seeds", "42-51", "seeds to replay with, as a list and ranges: 42-51 or 1,3,5-7")
}

// parseReplayFlags parses args into fs as cli.Parse does, then reads the
// seed list; ok is whether the command goes on, else it ends with exit.
func parseReplayFlags(fs *flag.FlagSet, args []string, seedList *string, stdout, stderr io.Writer) (seeds []uint64, exit int, ok bool) {
	if exit, ok := cli.Parse(fs, args, stdout, stderr); !ok {
		return nil, exit, false
	}
	seeds, err := simulate.ParseSeeds(*seedList)
	if err != nil {
		fmt.Fprintf(stderr, "gpupool %s: --seeds %q: %v\n", fs.Name(), *seedList, err)
		return nil, exitUsage, false
	}
	return seeds, 0, true
}

func workersFlag(fs *flag.FlagSet) *int {
	return fs.Int("workers", runtime.GOMAXPROCS(0), "replays to run at once")
}

func simulateCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "grid":
			return simulateGridCmd(args[1:], stdout, stderr)
		case "sharing":
			return simulateSharingCmd(args[1:], stdout, stderr)
		}
	}
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	nodes, pods := traceFlags(fs)
	seedList := seedsFlag(fs)
	policyList := fs.String("policies", "all", "comma-separated placement policies, or all: "+strings.Join(allocator.PolicyNames(), ", "))
	output := fs.String("output", "table", "result format: table or json")
	workers := workersFlag(fs)
	variantText := fs.String("variant", "", "derive the pods from --pods first, by `FIELDS` such as models=25%,fractional=60%,multi-gpu=3.5%,cpu=x0.5 (above); a field left out stays as the list has it")
	variantSeed := variantSeedFlag(fs)
	topology := fs.String("topology", "blind", "blind: placement sees no GPU links, as before; aware: the servers have the simulated topologies of docs/design.md and placement sees them. Either way the replay reports the share of multi-GPU pods whose GPUs the simulated topology links by one PCIe switch or NVLink, and on one CPU socket")
	writePods := fs.String("write-pods", "", "write the pods the replay would use (after --variant) as a CSV pod list to `FILE` (- for stdout) and replay nothing")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: gpupool simulate [flags]
       gpupool simulate grid [flags]     variants of a pod list, a policy against a baseline
       gpupool simulate sharing [flags]  the four traces with GPUs shared and exclusive

Replays an Alibaba OpenB GPU trace with the protocol of the FGD paper
(USENIX ATC'23): pods arrive in a seeded shuffle, resampled with replacement
until the GPU share asked reaches 130% of the cluster's; nothing departs.
For each policy, averaged over seeds, it reports the GPU share left
unallocated when arrivals reach 100% and 130% of capacity, the fragmented
share of the free GPU share at 90% (FGD's measure), and placement decisions
per second on one core. Progress goes to stderr, results to stdout.

--variant derives a workload from the pod list, drawn with --variant-seed:
  models=P%      P% of the GPU pods name GPU models; constraints are removed,
                 or drawn from the gpu_spec mix of the embedded gpuspec10
                 list among the specs some server of --nodes can hold the
                 pod for
  fractional=P%  P% of the GPU pods ask for less than one GPU
  multi-gpu=P%   P% of the GPU pods ask for more than one GPU
  cpu=xF         every GPU pod's CPU times F (a pod that outgrows every
                 server never fits)
Pods that change class between fractional, whole and multi-GPU take the CPU,
memory and GPU ask of a pod of their new class drawn from the list (from the
embedded traces when it has fewer than 30 of that class) and keep their names
and constraints. docs/design.md says how each step draws.

Flags:
`)
		fs.PrintDefaults()
	}
	seeds, exit, ok := parseReplayFlags(fs, args, seedList, stdout, stderr)
	if !ok {
		return exit
	}
	policies, err := parsePolicies(*policyList)
	if err != nil {
		fmt.Fprintf(stderr, "gpupool simulate: --policies %q: %v\n", *policyList, err)
		return exitUsage
	}
	if *topology != "blind" && *topology != "aware" {
		fmt.Fprintf(stderr, "gpupool simulate: --topology %q is not one of blind, aware\n", *topology)
		return exitUsage
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "gpupool simulate: --output %q is not one of table, json\n", *output)
		return exitUsage
	}
	variant, err := simulate.ParseVariant(*variantText)
	if err != nil {
		fmt.Fprintf(stderr, "gpupool simulate: --variant %q: %v\n", *variantText, err)
		return exitUsage
	}
	tr, err := simulate.LoadTrace(*nodes, *pods)
	if err != nil {
		fmt.Fprintln(stderr, "gpupool simulate:", err)
		return exitFailed
	}
	if tr.Pods, err = variant.Derive(tr.Pods, tr.Servers, *variantSeed); err != nil {
		fmt.Fprintf(stderr, "gpupool simulate: --variant %q on %s: %v\n", *variantText, *pods, err)
		return exitFailed
	}
	if *topology == "aware" {
		simulate.SetSimulatedTopologies(tr.Servers)
	}
	if *writePods != "" {
		if err := writePodList(*writePods, tr.Pods, stdout); err != nil {
			fmt.Fprintln(stderr, "gpupool simulate: --write-pods:", err)
			return exitFailed
		}
		return 0
	}
	fmt.Fprintf(stderr, "replaying %s (%s) on %s: %d pods, %d servers, %d policies x %d seeds on %d workers\n",
		*pods, variant, *nodes, len(tr.Pods), len(tr.Servers), len(policies), len(seeds), *workers)
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
	fmt.Fprintln(tw, "policy\tunallocated GPU % at 100%\tat 130%\tfragmentation % at 90%\tdecisions/s\tmulti-GPU on one switch or NVLink %\ton one socket %\tseeds\t")
	for _, s := range summaries {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.0f\t%.1f\t%.1f\t%d\t\n", s.Policy, s.UnallocatedAt100, s.UnallocatedAt130,
			s.FragmentationAt90, s.DecisionsPerSec, s.WellLinkedPct, s.OneSocketPct, s.Seeds)
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

// writePodList writes pods as CSV to the file named, or to stdout for "-".
func writePodList(name string, pods []simulate.Pod, stdout io.Writer) error {
	if name == "-" {
		return simulate.WritePods(stdout, pods)
	}
	f, err := os.Create(name) //nolint:gosec // writing where the user asked is the point
	if err != nil {
		return err
	}
	err = simulate.WritePods(f, pods)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
