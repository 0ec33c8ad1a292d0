package app

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/simulate"
)

// ReplayUsage is what gpupool-simulate --help says above the flags.
const ReplayUsage = `Usage: gpupool-simulate [flags]
       gpupool-simulate grid [flags]     variants of a pod list, a policy against a baseline
       gpupool-simulate sharing [flags]  the four traces with GPUs shared and exclusive

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
and constraints. simulate.Derive's documentation says how each step draws.
`

// ReplayOptions are gpupool-simulate's flags.
type ReplayOptions struct {
	Nodes, Pods, SeedList, PolicyList, Output, VariantText, Topology, WritePods string
	Workers                                                                     int
	VariantSeed                                                                 uint64

	// Parsed by Validate.
	Seeds    []uint64
	Policies []string
	Variant  simulate.Variant
}

// AddFlags registers the options on fs, with their defaults.
func (o *ReplayOptions) AddFlags(fs *flag.FlagSet) {
	nodesFlag(fs, &o.Nodes)
	podsFlag(fs, &o.Pods)
	seedsFlag(fs, &o.SeedList)
	fs.StringVar(&o.PolicyList, "policies", "all", "comma-separated placement policies, or all: "+strings.Join(allocator.PolicyNames(), ", "))
	fs.StringVar(&o.Output, "output", "table", "result format: table or json")
	workersFlag(fs, &o.Workers)
	fs.StringVar(&o.VariantText, "variant", "", "derive the pods from --pods first, by `FIELDS` such as models=25%,fractional=60%,multi-gpu=3.5%,cpu=x0.5 (above); a field left out stays as the list has it")
	variantSeedFlag(fs, &o.VariantSeed)
	fs.StringVar(&o.Topology, "topology", "blind", "blind: placement sees no GPU links, as before; aware: the servers have the simulated topologies of docs/design.md and placement sees them. Either way the replay reports the share of multi-GPU pods whose GPUs the simulated topology links by one PCIe switch or NVLink, and on one CPU socket")
	fs.StringVar(&o.WritePods, "write-pods", "", "write the pods the replay would use (after --variant) as a CSV pod list to `FILE` (- for stdout) and replay nothing")
}

// Validate checks the options and parses the seeds, the policies and the
// variant.
func (o *ReplayOptions) Validate() error {
	var err error
	if o.Seeds, err = simulate.ParseSeeds(o.SeedList); err != nil {
		return fmt.Errorf("--seeds %q: %w", o.SeedList, err)
	}
	if o.Policies, err = parsePolicies(o.PolicyList); err != nil {
		return fmt.Errorf("--policies %q: %w", o.PolicyList, err)
	}
	if o.Topology != "blind" && o.Topology != "aware" {
		return fmt.Errorf("--topology %q is not one of blind, aware", o.Topology)
	}
	if o.Output != "table" && o.Output != "json" {
		return fmt.Errorf("--output %q is not one of table, json", o.Output)
	}
	if o.Variant, err = simulate.ParseVariant(o.VariantText); err != nil {
		return fmt.Errorf("--variant %q: %w", o.VariantText, err)
	}
	return nil
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

// RunReplay replays the trace with each policy over each seed, progress on
// stderr, the summaries on stdout; with --write-pods it writes the pods it
// would replay instead.
func RunReplay(o *ReplayOptions, stdout, stderr io.Writer) error {
	tr, err := simulate.LoadTrace(o.Nodes, o.Pods)
	if err != nil {
		return err
	}
	if tr.Pods, err = o.Variant.Derive(tr.Pods, tr.Servers, o.VariantSeed); err != nil {
		return fmt.Errorf("--variant %q on %s: %w", o.VariantText, o.Pods, err)
	}
	if o.Topology == "aware" {
		simulate.SetSimulatedTopologies(tr.Servers)
	}
	if o.WritePods != "" {
		if err := writePodList(o.WritePods, tr.Pods, stdout); err != nil {
			return fmt.Errorf("--write-pods: %w", err)
		}
		return nil
	}
	fmt.Fprintf(stderr, "replaying %s (%s) on %s: %d pods, %d servers, %d policies x %d seeds on %d workers\n",
		o.Pods, o.Variant, o.Nodes, len(tr.Pods), len(tr.Servers), len(o.Policies), len(o.Seeds), o.Workers)
	start := time.Now()
	results, err := simulate.RunAll(tr, o.Policies, o.Seeds, o.Workers, func(done, total int, r simulate.Result) {
		fmt.Fprintf(stderr, "[%d/%d] %-10s seed %-4d unallocated %5.2f%% at 100%% arrival  %8.0f decisions/s\n",
			done, total, r.Policy, r.Seed, r.UnallocatedPct[100], float64(r.Decisions)/r.PlaceTime.Seconds())
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "done in %s\n", time.Since(start).Round(time.Millisecond))
	return writeSummaries(stdout, simulate.Summarize(results), o.Output)
}

// writeSummaries writes one summary per policy in the format --output
// names: a JSON array, or a table.
func writeSummaries(w io.Writer, summaries []simulate.Summary, format string) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(summaries)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tunallocated GPU % at 100%\tat 130%\tfragmentation % at 90%\tdecisions/s\tmulti-GPU on one switch or NVLink %\ton one socket %\tseeds\t")
	for _, s := range summaries {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.0f\t%.1f\t%.1f\t%d\t\n", s.Policy, s.UnallocatedAt100, s.UnallocatedAt130,
			s.FragmentationAt90, s.DecisionsPerSec, s.WellLinkedPct, s.OneSocketPct, s.Seeds)
	}
	return tw.Flush()
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
