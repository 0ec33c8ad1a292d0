package app

import (
	"fmt"
	"testing"

	"github.com/spf13/pflag"
)

// TestOptionsValidate: every flag Validate refuses is named with its
// value, the defaults pass, and the serving options' flags are registered
// beside the adapter's own.
func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // the error, "<nil>" when they pass
	}{
		{nil, "<nil>"},
		{[]string{"--backend", "prometheus", "--secure-port", "6443"}, "<nil>"},
		{[]string{"--max-age", "0s"}, "--max-age=0s must be above 0"},
		{[]string{"--max-age", "-1s"}, "--max-age=-1s must be above 0"},
		{[]string{"--backend", "datadog"}, `--backend "datadog" is not one of direct, prometheus`},
	} {
		o := NewOptions()
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(o.Validate()); got != tc.want {
			t.Errorf("%q: %s, want %s", tc.args, got, tc.want)
		}
	}
}
