package main

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

func simulateSharingCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("simulate sharing", flag.ContinueOnError)
	nodes := nodesFlag(fs)
	seedList := seedsFlag(fs)
	policy := fs.String("policy", "fgd-cpu", "placement policy: "+strings.Join(allocator.PolicyNames(), ", "))
	workers := workersFlag(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: gpupool simulate sharing [flags]

Replays each embedded OpenB pod list twice, as gpupool simulate does: with
GPUs shared, each pod taking the share it asks for, and exclusive, each GPU
pod taking whole GPUs, its ask rounded up (a pod asking 0.3 GPU takes one,
as with the device plugin's nvidia.com/gpu). Arrival counts the pods' asks
as they are both ways, so both see the same pods arrive. It prints a
markdown table of the pods arrived and placed, the GPUs busy (holding any
share) and the GPU share the placed pods asked for (% of capacity) once the
GPU share asked reaches 100% of capacity, means over the seeds.

Flags:
`)
		fs.PrintDefaults()
	}
	seeds, exit, ok := parseReplayFlags(fs, args, seedList, stdout, stderr)
	if !ok {
		return exit
	}
	if _, err := allocator.NewPolicy(*policy, allocator.PolicyOptions{}); err != nil {
		fmt.Fprintf(stderr, "gpupool simulate sharing: --policy: %v\n", err)
		return exitUsage
	}
	start := time.Now()
	fmt.Fprintln(stdout, "| trace | pods arrived | pods placed, shared | exclusive | GPUs busy, shared | exclusive | share asked by placed pods, shared | exclusive |")
	fmt.Fprintln(stdout, "|---|--:|--:|--:|--:|--:|--:|--:|")
	for _, pods := range simulate.PodLists {
		tr, err := simulate.LoadTrace(*nodes, pods)
		if err != nil {
			fmt.Fprintln(stderr, "gpupool simulate sharing:", err)
			return exitFailed
		}
		var by [2]simulate.Summary // shared, exclusive
		for k, exclusive := range []bool{false, true} {
			fmt.Fprintf(stderr, "replaying %s with %s, exclusive %v, over %d seeds\n", pods, *policy, exclusive, len(seeds))
			tr.Exclusive = exclusive
			results, err := simulate.RunAll(tr, []string{*policy}, seeds, *workers, nil)
			if err != nil {
				fmt.Fprintln(stderr, "gpupool simulate sharing:", err)
				return exitFailed
			}
			by[k] = simulate.Summarize(results)[0]
		}
		name := strings.TrimSuffix(strings.TrimPrefix(path.Base(pods), "openb_pod_list_"), ".csv")
		fmt.Fprintf(stdout, "| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f%% | %.2f%% |\n", name, by[0].PodsArrivedAt100,
			by[0].PodsPlacedAt100, by[1].PodsPlacedAt100, by[0].BusyGPUsAt100, by[1].BusyGPUsAt100,
			by[0].PlacedAskPctAt100, by[1].PlacedAskPctAt100)
	}
	fmt.Fprintf(stderr, "done in %s\n", time.Since(start).Round(time.Second))
	return 0
}
