package app

import (
	"flag"
	"strings"
	"testing"
)

// TestOptionsValidate: every flag Validate refuses is named with its
// value and what it may be, and the defaults pass.
func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // "" passes
	}{
		{nil, ""},
		{[]string{"--store", "etcd", "--policy", "best-fit", "--max-waiting", "0"}, ""},
		{[]string{"--store", "sqlite"}, `--store "sqlite" is not one of bolt, etcd`},
		{[]string{"--policy", "fastest"}, `--policy "fastest" is not one of `},
		{[]string{"--default-ttl", "0s"}, "--default-ttl 0s: must be more than 0"},
		{[]string{"--max-ttl", "10s"}, "--max-ttl 10s: must be at least --default-ttl 30s"},
		{[]string{"--tick", "0s"}, "--tick 0s: must be more than 0"},
		{[]string{"--max-waiting", "-1"}, "--max-waiting -1: must be at least 0 (0 takes the default)"},
		{[]string{"--max-waiting-per-namespace", "-1"}, "--max-waiting-per-namespace -1: must be at least 0 (0 takes the default)"},
	} {
		o := NewOptions()
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		err := o.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}
