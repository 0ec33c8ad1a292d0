package simulate

import (
	"fmt"
	"strings"
)

// RobustnessGrid is the grid `gpupool-simulate grid` replays by default:
// the list as it is, each field of Variant on its own around it, and a few
// corners that move several at once.
var RobustnessGrid = []string{
	asIs,
	"models=0%", "models=25%", "models=50%",
	"fractional=20%", "fractional=50%", "fractional=80%",
	"multi-gpu=2%", "multi-gpu=10%", "multi-gpu=40%",
	"cpu=x0.5", "cpu=x2",
	"models=25%,fractional=80%",
	"models=25%,multi-gpu=10%",
	"fractional=80%,cpu=x2",
	"models=50%,fractional=20%,multi-gpu=10%,cpu=x0.5",
}

// SeedSet is a list of replay seeds under the name it was given by.
type SeedSet struct {
	Name  string
	Seeds []uint64
}

// ParseSeedSets reads seed lists separated by spaces, such as
// "42-51 1042-1051", each as ParseSeeds does.
func ParseSeedSets(s string) ([]SeedSet, error) {
	var sets []SeedSet
	for _, name := range strings.Fields(s) {
		seeds, err := ParseSeeds(name)
		if err != nil {
			return nil, fmt.Errorf("seed set %s: %w", name, err)
		}
		sets = append(sets, SeedSet{name, seeds})
	}
	if len(sets) == 0 {
		return nil, fmt.Errorf("no seed set")
	}
	return sets, nil
}

// GridCell is one variant replayed over one seed set: the summaries of
// the grid's policy and of its baseline.
type GridCell struct {
	Variant          Variant
	SeedSet          string
	Policy, Baseline Summary
}

// Grid is what RunGrid replays: variants of one trace, each derived with
// VariantSeed, with a policy and the baseline it is held against, over
// every seed set.
type Grid struct {
	Variants         []Variant
	VariantSeed      uint64
	SeedSets         []SeedSet
	Policy, Baseline string
	Workers          int
}

// RunGrid replays g on tr and returns a cell per variant and seed set, in
// that order. progress, if set, is called once per finished replay.
func RunGrid(tr *Trace, g Grid, progress func(done, total int, v Variant, r Result)) ([]GridCell, error) {
	var seeds []uint64
	for _, set := range g.SeedSets {
		seeds = append(seeds, set.Seeds...)
	}
	policies := []string{g.Policy, g.Baseline}
	perVariant := len(policies) * len(seeds)
	var cells []GridCell
	for k, v := range g.Variants {
		pods, err := v.Derive(tr.Pods, tr.Servers, g.VariantSeed)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", v, err)
		}
		variant := &Trace{Servers: tr.Servers, Pods: pods}
		results, err := RunAll(variant, policies, seeds, g.Workers, func(done, _ int, r Result) {
			if progress != nil {
				progress(k*perVariant+done, len(g.Variants)*perVariant, v, r)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", v, err)
		}
		// results run by policy, then seed: a set is a run of seeds in each.
		first := 0
		for _, set := range g.SeedSets {
			of := func(p int) Summary {
				at := p*len(seeds) + first
				return Summarize(results[at : at+len(set.Seeds)])[0]
			}
			cells = append(cells, GridCell{Variant: v, SeedSet: set.Name, Policy: of(0), Baseline: of(1)})
			first += len(set.Seeds)
		}
	}
	return cells, nil
}

// Regression is a cell and an arrival level at which the grid's policy
// leaves more GPU share unallocated than its baseline, in the mean over
// the cell's seeds.
type Regression struct {
	Cell                  *GridCell
	Level                 int     // arrival, in % of capacity
	Unallocated, Baseline float64 // % of capacity
}

// Regressions lists where the policy does worse than its baseline, at 100%
// or at 130% arrival.
func Regressions(cells []GridCell) []Regression {
	var out []Regression
	for i := range cells {
		c := &cells[i]
		for _, at := range []struct {
			level   int
			p, base Value
		}{{100, c.Policy.UnallocatedAt100, c.Baseline.UnallocatedAt100}, {130, c.Policy.UnallocatedAt130, c.Baseline.UnallocatedAt130}} {
			if at.p > at.base {
				out = append(out, Regression{Cell: c, Level: at.level, Unallocated: float64(at.p), Baseline: float64(at.base)})
			}
		}
	}
	return out
}
