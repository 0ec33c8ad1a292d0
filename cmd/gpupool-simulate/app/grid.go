package app

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/simulate"
)

// targetDecisionsPerSec is the placement rate every grid cell should keep:
// a report, not a gate, since a timing depends on the machine.
const targetDecisionsPerSec = 100_000

// GridUsage is what gpupool-simulate grid --help says above the flags.
var GridUsage = fmt.Sprintf(`Usage: gpupool-simulate grid [flags]

Replays variants of a pod list (by default the robustness grid: the list as
it is, each --variant field on its own around it, and a few corners) with
--policy and --baseline over each seed set, as gpupool-simulate does, and
prints a markdown table of the GPU share each leaves unallocated at 100%%
and 130%% arrival and their decisions per second, means over the set.
It exits 1 naming the cells, variant by seed set and level, where --policy
leaves more unallocated than --baseline. Cells below %d decisions/s are
marked and counted, a report only: timings depend on the machine.
`, targetDecisionsPerSec)

// GridOptions are gpupool-simulate grid's flags.
type GridOptions struct {
	Nodes, Pods, VariantList, SeedSetList, Policy, Baseline string
	VariantSeed                                             uint64
	Workers                                                 int

	// Grid is the grid the options name, built by Validate.
	Grid simulate.Grid
}

// AddFlags registers the options on fs, with their defaults.
func (o *GridOptions) AddFlags(fs *flag.FlagSet) {
	nodesFlag(fs, &o.Nodes)
	podsFlag(fs, &o.Pods)
	fs.StringVar(&o.VariantList, "variants", strings.Join(simulate.RobustnessGrid, ";"), "`VARIANTS` to replay, separated by ';', each as simulate's --variant reads it")
	variantSeedFlag(fs, &o.VariantSeed)
	fs.StringVar(&o.SeedSetList, "seed-sets", "42-51 1042-1051", "seed sets, separated by spaces, each a list and ranges as simulate's --seeds: every cell is a mean over one set")
	fs.StringVar(&o.Policy, "policy", "fgd-cpu", "the policy held against --baseline: the pool's default")
	fs.StringVar(&o.Baseline, "baseline", "fgd", "the policy --policy must do no worse than")
	workersFlag(fs, &o.Workers)
}

// Validate checks the options and builds the grid.
func (o *GridOptions) Validate() error {
	g := simulate.Grid{VariantSeed: o.VariantSeed, Policy: o.Policy, Baseline: o.Baseline, Workers: o.Workers}
	for _, text := range strings.Split(o.VariantList, ";") {
		v, err := simulate.ParseVariant(text)
		if err != nil {
			return fmt.Errorf("--variants: %q: %w", text, err)
		}
		g.Variants = append(g.Variants, v)
	}
	var err error
	if g.SeedSets, err = simulate.ParseSeedSets(o.SeedSetList); err != nil {
		return fmt.Errorf("--seed-sets %q: %w", o.SeedSetList, err)
	}
	for _, f := range []struct{ flag, policy string }{{"--policy", o.Policy}, {"--baseline", o.Baseline}} {
		if _, err := allocator.NewPolicy(f.policy, allocator.PolicyOptions{}); err != nil {
			return fmt.Errorf("%s: %w", f.flag, err)
		}
	}
	o.Grid = g
	return nil
}

// RunGrid replays the grid, progress on stderr, the table on stdout; it
// fails naming the cells where --policy leaves more unallocated than
// --baseline.
func RunGrid(o *GridOptions, stdout, stderr io.Writer) error {
	tr, err := simulate.LoadTrace(o.Nodes, o.Pods)
	if err != nil {
		return err
	}
	g := o.Grid
	fmt.Fprintf(stderr, "replaying %d variants of %s on %s with %s and %s over seed sets %s on %d workers\n",
		len(g.Variants), o.Pods, o.Nodes, g.Policy, g.Baseline, o.SeedSetList, g.Workers)
	start := time.Now()
	cells, err := simulate.RunGrid(tr, g, func(done, total int, v simulate.Variant, r simulate.Result) {
		fmt.Fprintf(stderr, "[%d/%d] %-30s %-8s seed %-5d unallocated %5.2f%% at 100%% arrival  %8.0f decisions/s\n",
			done, total, v, r.Policy, r.Seed, r.UnallocatedPct[100], float64(r.Decisions)/r.PlaceTime.Seconds())
	})
	if err != nil {
		return err
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
		return fmt.Errorf("%s leaves more unallocated than %s in %d cells: %s",
			g.Policy, g.Baseline, len(regressions), strings.Join(where, "; "))
	}
	return nil
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
