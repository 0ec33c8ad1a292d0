package app

import (
	"testing"

	"github.com/gpupool/gpupool/internal/cli/clitest"
)

// TestOptionsValidate: every flag Validate refuses is named with its
// value and what it may be, and the defaults pass.
func TestOptionsValidate(t *testing.T) {
	clitest.CheckValidate(t, NewOptions, []clitest.Case{
		{nil, ""},
		{[]string{"--store", "etcd", "--policy", "best-fit", "--max-waiting", "0"}, ""},
		{[]string{"--store", "sqlite"}, `--store "sqlite" is not one of bolt, etcd`},
		{[]string{"--policy", "fastest"}, `--policy "fastest" is not one of `},
		{[]string{"--default-ttl", "0s"}, "--default-ttl 0s: must be more than 0"},
		{[]string{"--max-ttl", "10s"}, "--max-ttl 10s: must be at least --default-ttl 30s"},
		{[]string{"--tick", "0s"}, "--tick 0s: must be more than 0"},
		{[]string{"--max-waiting", "-1"}, "--max-waiting -1: must be at least 0 (0 takes the default)"},
		{[]string{"--max-waiting-per-namespace", "-1"}, "--max-waiting-per-namespace -1: must be at least 0 (0 takes the default)"},
	})
}
