// Package clitest checks a command's Options as its command line sets
// them, for the tests of every cmd/*/app.
package clitest

import (
	"flag"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/internal/cli"
)

// Parse registers o's flags, parses args into them and returns what
// Validate says; a command line that does not parse fails the test.
func Parse(t testing.TB, o cli.Options, args ...string) error {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return o.Validate()
}

// Case is a command line and what Validate says of it: "" passes, else
// its error contains Want. An alias of a plain struct, so that a table of
// cases is written as {args, want}.
type Case = struct {
	Args []string
	Want string
}

// CheckValidate parses each case's command line into fresh options and
// checks what Validate says.
func CheckValidate[O cli.Options](t *testing.T, newOptions func() O, cases []Case) {
	t.Helper()
	for _, tc := range cases {
		err := Parse(t, newOptions(), tc.Args...)
		switch {
		case tc.Want == "" && err != nil:
			t.Errorf("%q: %v", tc.Args, err)
		case tc.Want != "" && (err == nil || !strings.Contains(err.Error(), tc.Want)):
			t.Errorf("%q: %v, want %q", tc.Args, err, tc.Want)
		}
	}
}
