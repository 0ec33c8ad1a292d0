package app

import (
	"flag"
	"runtime"

	"github.com/gpupool/gpupool/simulate"
)

// The flags the commands share, each registered with its default.

func nodesFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "nodes", simulate.DefaultNodes, "node list CSV (sn,cpu_milli,memory_mib,gpu,model); the embedded OpenB cluster by default")
}

func podsFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "pods", simulate.DefaultPods, "pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec]); the embedded default trace by default (also embedded: traces/openb_pod_list_{gpushare40,gpuspec10,multigpu20}.csv)")
}

func variantSeedFlag(fs *flag.FlagSet, p *uint64) {
	fs.Uint64Var(p, "variant-seed", 1, "seed of the variant derivation, apart from the replay seeds: every replay seed replays the same derived pods")
}

func seedsFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "seeds", "42-51", "seeds to replay with, as a list and ranges: 42-51 or 1,3,5-7")
}

func workersFlag(fs *flag.FlagSet, p *int) {
	fs.IntVar(p, "workers", runtime.GOMAXPROCS(0), "replays to run at once")
}
