package app

import (
	"strings"
	"testing"

	"github.com/gpupool/gpupool/internal/cli/clitest"

	"github.com/gpupool/gpupool/internal/cli"
)

// parsed is o with args parsed into it, and Validate's error.
func parsed[O cli.Options](t *testing.T, o O, args ...string) (O, error) {
	t.Helper()
	return o, clitest.Parse(t, o, args...)
}

// valid is o with args parsed into it and validated.
func valid[O cli.Options](t *testing.T, o O, args ...string) O {
	t.Helper()
	o, err := parsed(t, o, args...)
	if err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return o
}

// TestOptionsValidate: every flag Validate refuses is named with its
// value and why, and the defaults pass.
func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		options cli.Options
		args    []string
		want    string // "" passes
	}{
		{&ReplayOptions{}, nil, ""},
		{&ReplayOptions{}, []string{"--policies", "fgd,tetris"}, `--policies "fgd,tetris": policy tetris is not one of best-fit, fgd, fgd-cpu, first-fit, random, spread`},
		{&ReplayOptions{}, []string{"--policies", "fdg"}, `--policies "fdg": policy fdg is not one of`},
		{&ReplayOptions{}, []string{"--seeds", "9-3"}, `--seeds "9-3": "9-3" is not a range low-high`},
		{&ReplayOptions{}, []string{"--output", "yaml"}, `--output "yaml" is not one of table, json`},
		{&ReplayOptions{}, []string{"--topology", "nvlink"}, `--topology "nvlink" is not one of blind, aware`},
		{&ReplayOptions{}, []string{"--variant", "models=25%,cpu=2"}, `--variant "models=25%,cpu=2": cpu 2 is not a factor such as x0.5`},
		{&GridOptions{}, nil, ""},
		{&GridOptions{}, []string{"--variants", "as is;models=200%"}, `--variants: "models=200%": models 200% out of range 0%..100%`},
		{&GridOptions{}, []string{"--seed-sets", " "}, `--seed-sets " ": no seed set`},
		{&GridOptions{}, []string{"--policy", "tetris"}, "--policy: policy tetris is not one of"},
		{&GridOptions{}, []string{"--baseline", "tetris"}, "--baseline: policy tetris is not one of"},
		{&SharingOptions{}, nil, ""},
		{&SharingOptions{}, []string{"--seeds", "x"}, `--seeds "x": "x" is not a number`},
		{&SharingOptions{}, []string{"--policy", "tetris"}, "--policy: policy tetris is not one of"},
	} {
		_, err := parsed(t, tc.options, tc.args...)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%T %q: %v", tc.options, tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%T %q: %v, want %q", tc.options, tc.args, err, tc.want)
		}
	}
}

// TestGridOptionsBuildTheGrid: the grid Validate builds is the flags'.
func TestGridOptionsBuildTheGrid(t *testing.T) {
	o := valid(t, &GridOptions{}, "--variants", "as is;cpu=x0.5", "--seed-sets", "1 2-3", "--policy", "random", "--baseline", "best-fit", "--variant-seed", "7", "--workers", "3")
	g := o.Grid
	if len(g.Variants) != 2 || g.Variants[1].String() != "cpu=x0.5" || len(g.SeedSets) != 2 ||
		g.Policy != "random" || g.Baseline != "best-fit" || g.VariantSeed != 7 || g.Workers != 3 {
		t.Errorf("grid %+v", g)
	}
}
