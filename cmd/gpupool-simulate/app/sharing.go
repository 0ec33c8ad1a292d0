package app

import (
	"flag"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/simulate"
)

// SharingUsage is what gpupool-simulate sharing --help says above the
// flags.
const SharingUsage = `Usage: gpupool-simulate sharing [flags]

Replays each embedded OpenB pod list twice, as gpupool-simulate does: with
GPUs shared, each pod taking the share it asks for, and exclusive, each GPU
pod taking whole GPUs, its ask rounded up (a pod asking 0.3 GPU takes one,
as with the device plugin's nvidia.com/gpu). Arrival counts the pods' asks
as they are both ways, so both see the same pods arrive. It prints a
markdown table of the pods arrived and placed, the GPUs busy (holding any
share) and the GPU share the placed pods asked for (% of capacity) once the
GPU share asked reaches 100% of capacity, means over the seeds.
`

// SharingOptions are gpupool-simulate sharing's flags.
type SharingOptions struct {
	Nodes, SeedList, Policy string
	Workers                 int

	// Seeds is SeedList, parsed by Validate.
	Seeds []uint64
}

// AddFlags registers the options on fs, with their defaults.
func (o *SharingOptions) AddFlags(fs *flag.FlagSet) {
	nodesFlag(fs, &o.Nodes)
	seedsFlag(fs, &o.SeedList)
	fs.StringVar(&o.Policy, "policy", "fgd-cpu", "placement policy: "+strings.Join(allocator.PolicyNames(), ", "))
	workersFlag(fs, &o.Workers)
}

// Validate checks the options and parses the seeds.
func (o *SharingOptions) Validate() error {
	var err error
	if o.Seeds, err = simulate.ParseSeeds(o.SeedList); err != nil {
		return fmt.Errorf("--seeds %q: %w", o.SeedList, err)
	}
	if _, err := allocator.NewPolicy(o.Policy, allocator.PolicyOptions{}); err != nil {
		return fmt.Errorf("--policy: %w", err)
	}
	return nil
}

// RunSharing replays each embedded pod list shared and exclusive and
// writes a row of each to stdout as it goes, progress on stderr.
func RunSharing(o *SharingOptions, stdout, stderr io.Writer) error {
	start := time.Now()
	fmt.Fprintln(stdout, "| trace | pods arrived | pods placed, shared | exclusive | GPUs busy, shared | exclusive | share asked by placed pods, shared | exclusive |")
	fmt.Fprintln(stdout, "|---|--:|--:|--:|--:|--:|--:|--:|")
	for _, pods := range simulate.PodLists {
		tr, err := simulate.LoadTrace(o.Nodes, pods)
		if err != nil {
			return err
		}
		var by [2]simulate.Summary // shared, exclusive
		for k, exclusive := range []bool{false, true} {
			fmt.Fprintf(stderr, "replaying %s with %s, exclusive %v, over %d seeds\n", pods, o.Policy, exclusive, len(o.Seeds))
			tr.Exclusive = exclusive
			results, err := simulate.RunAll(tr, []string{o.Policy}, o.Seeds, o.Workers, nil)
			if err != nil {
				return err
			}
			by[k] = simulate.Summarize(results)[0]
		}
		name := strings.TrimSuffix(strings.TrimPrefix(path.Base(pods), "openb_pod_list_"), ".csv")
		fmt.Fprintf(stdout, "| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f%% | %.2f%% |\n", name, by[0].PodsArrivedAt100,
			by[0].PodsPlacedAt100, by[1].PodsPlacedAt100, by[0].BusyGPUsAt100, by[1].BusyGPUsAt100,
			by[0].PlacedAskPctAt100, by[1].PlacedAskPctAt100)
	}
	fmt.Fprintf(stderr, "done in %s\n", time.Since(start).Round(time.Second))
	return nil
}
