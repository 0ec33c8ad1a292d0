package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/internal/cli"
	"github.com/gpupool/gpupool/simulate"
)

// targetDecisionsPerSec is the placement rate every grid cell should keep:
// a report, not a gate, since a timing depends on the machine.
const targetDecisionsPerSec = 100_000

func simulateGridCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("simulate grid", flag.ContinueOnError)
	nodes, pods := traceFlags(fs)
	variantList := fs.String("variants", strings.Join(simulate.RobustnessGrid, ";"), "`VARIANTS` to replay, separated by ';', each as simulate's --variant reads it")
	variantSeed := variantSeedFlag(fs)
	seedSets := fs.String("seed-sets", "42-51 1042-1051", "seed sets, separated by spaces, each a list and ranges as simulate's --seeds: every cell is a mean over one set")
	policy := fs.String("policy", "fgd-cpu", "the policy held against --baseline: the pool's default")
	baseline := fs.String("baseline", "fgd", "the policy --policy must do no worse than")
	workers := workersFlag(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: gpupool simulate grid [flags]

Replays variants of a pod list (by default the robustness grid: the list as
it is, each --variant field on its own around it, and a few corners) with
--policy and --baseline over each seed set, as gpupool simulate does, and
prints a markdown table of the GPU share each leaves unallocated at 100%%
and 130%% arrival and their decisions per second, means over the set.
It exits 1 naming the cells, variant by seed set and level, where --policy
leaves more unallocated than --baseline. Cells below %d decisions/s are
marked and counted, a report only: timings depend on the machine.

Flags:
`, targetDecisionsPerSec)
		fs.PrintDefaults()
	}
	if exit, ok := cli.Parse(fs, args, stdout, stderr); !ok {
		return exit
	}
	g := simulate.Grid{VariantSeed: *variantSeed, Policy: *policy, Baseline: *baseline, Workers: *workers}
	for _, text := range strings.Split(*variantList, ";") {
		v, err := simulate.ParseVariant(text)
		if err != nil {
			fmt.Fprintf(stderr, "gpupool simulate grid: --variants: %q: %v\n", text, err)
			return exitUsage
		}
		g.Variants = append(g.Variants, v)
	}
	var err error
	if g.SeedSets, err = simulate.ParseSeedSets(*seedSets); err != nil {
		fmt.Fprintf(stderr, "gpupool simulate grid: --seed-sets %q: %v\n", *seedSets, err)
		return exitUsage
	}
	for flagName, name := range map[string]string{"--policy": *policy, "--baseline": *baseline} {
		if _, err := allocator.NewPolicy(name, allocator.PolicyOptions{}); err != nil {
			fmt.Fprintf(stderr, "gpupool simulate grid: %s: %v\n", flagName, err)
			return exitUsage
		}
	}
	tr, err := simulate.LoadTrace(*nodes, *pods)
	if err != nil {
		fmt.Fprintln(stderr, "gpupool simulate grid:", err)
		return exitFailed
	}
	fmt.Fprintf(stderr, "replaying %d variants of %s on %s with %s and %s over seed sets %s on %d workers\n",
		len(g.Variants), *pods, *nodes, g.Policy, g.Baseline, *seedSets, g.Workers)
	start := time.Now()
	cells, err := simulate.RunGrid(tr, g, func(done, total int, v simulate.Variant, r simulate.Result) {
		fmt.Fprintf(stderr, "[%d/%d] %-30s %-8s seed %-5d unallocated %5.2f%% at 100%% arrival  %8.0f decisions/s\n",
			done, total, v, r.Policy, r.Seed, r.UnallocatedPct[100], float64(r.Decisions)/r.PlaceTime.Seconds())
	})
	if err != nil {
		fmt.Fprintln(stderr, "gpupool simulate grid:", err)
		return exitFailed
	}
	fmt.Fprintf(stderr, "done in %s\n", time.Since(start).Round(time.Second))
	regressions := simulate.Regressions(cells)
	writeGrid(stdout, cells, g, regressions)
	if len(regressions) > 0 {
		var where []string
		for _, r := range regressions {
			where = append(where, fmt.Sprintf("%s seeds %s at %d%% (%.2f%% vs %.2f%%)",
				r.Cell.Variant, r.Cell.SeedSet, r.Level, r.Unallocated, r.Baseline))
		}
		fmt.Fprintf(stderr, "gpupool simulate grid: %s leaves more unallocated than %s in %d cells: %s\n",
			g.Policy, g.Baseline, len(regressions), strings.Join(where, "; "))
		return exitFailed
	}
	return 0
}

// writeGrid writes the cells as a markdown table, the policy's regressions
// in bold, then the slowest cell and the count of slow ones.
func writeGrid(w io.Writer, cells []simulate.GridCell, g simulate.Grid, regressions []simulate.Regression) {
	worse := map[*simulate.GridCell]map[int]bool{}
	for _, r := range regressions {
		if worse[r.Cell] == nil {
			worse[r.Cell] = map[int]bool{}
		}
		worse[r.Cell][r.Level] = true
	}
	p, b := g.Policy, g.Baseline
	fmt.Fprintf(w, "| variant | seeds | %s at 100%% | %s at 100%% | %s at 130%% | %s at 130%% | %s decisions/s | %s decisions/s |\n", p, b, p, b, p, b)
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|")
	slowest, slowestAt, slow := simulate.Value(0), "", 0
	rate := func(c *simulate.GridCell, s simulate.Summary) string {
		if slowestAt == "" || s.DecisionsPerSec < slowest {
			slowest, slowestAt = s.DecisionsPerSec, fmt.Sprintf("%s, %s, seeds %s", s.Policy, c.Variant, c.SeedSet)
		}
		text := fmt.Sprintf("%.0fk", s.DecisionsPerSec/1000)
		if s.DecisionsPerSec < targetDecisionsPerSec {
			slow++
			text += " (slow)"
		}
		return text
	}
	for i := range cells {
		c := &cells[i]
		pct := func(v simulate.Value, level int) string {
			if worse[c][level] {
				return fmt.Sprintf("**%.2f**", v)
			}
			return fmt.Sprintf("%.2f", v)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.2f | %s | %.2f | %s | %s |\n", c.Variant, c.SeedSet,
			pct(c.Policy.UnallocatedAt100, 100), c.Baseline.UnallocatedAt100,
			pct(c.Policy.UnallocatedAt130, 130), c.Baseline.UnallocatedAt130,
			rate(c, c.Policy), rate(c, c.Baseline))
	}
	fmt.Fprintf(w, "\nUnallocated GPU share in %% of capacity at 100%% and 130%% arrival, mean over each seed set; "+
		"bold: %s leaves more than %s (%d of %d). Slowest: %.0f decisions/s (%s); %d of %d below %d (slow).\n",
		p, b, len(regressions), 2*len(cells), slowest, slowestAt, slow, 2*len(cells), targetDecisionsPerSec)
}
