// Package clitest checks a command's Options as its command line sets
// them, for the tests of every cmd/*/app.
package clitest

import (
	"bytes"
	"flag"
	"io"
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

// Command is a binary's run: its arguments and output in, its exit status
// out.
type Command func(args []string, stdout, stderr io.Writer) int

// CheckHelp runs --help: it must end with 0, write nothing to stderr, and
// say each of wants on stdout.
func CheckHelp(t *testing.T, run Command, wants ...string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if exit := run([]string{"--help"}, &stdout, &stderr); exit != 0 || stderr.Len() != 0 {
		t.Fatalf("--help: exit %d, stderr %q", exit, stderr.String())
	}
	for _, want := range wants {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("--help does not say %q", want)
		}
	}
}

// CheckBadFlags runs each case's command line: it must end with
// cli.ExitUsage and say Want on stderr.
func CheckBadFlags(t *testing.T, run Command, cases []Case) {
	t.Helper()
	for _, tc := range cases {
		var stderr bytes.Buffer
		if exit := run(tc.Args, &bytes.Buffer{}, &stderr); exit != cli.ExitUsage || !strings.Contains(stderr.String(), tc.Want) {
			t.Errorf("%q: exit %d, said %s; want %d and %q", tc.Args, exit, stderr.String(), cli.ExitUsage, tc.Want)
		}
	}
}
