package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
)

// TestRunTool: a tool shows its usage above the flags for --help, ends
// with ExitUsage and "name: error" for a flag that does not parse or that
// Validate refuses, with 1 and "name: error" when Run fails, with 1 alone
// for ErrReported, and with 0 when Run ends well; Run gets RunTool's ctx.
func TestRunTool(t *testing.T) {
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, "caller's")
	for _, tc := range []struct {
		args           []string
		runErr         error
		exit           int
		stdout, stderr string
	}{
		{args: []string{"--help"}, stdout: "Usage: test tool\n\nFlags:\n  -n int\n    \thow many (default 1)\n"},
		{args: nil, stdout: "ran with the caller's ctx\n"},
		{args: []string{"--n", "0"}, exit: ExitUsage, stderr: "test tool: --n: must be above 0\n"},
		{args: []string{"--n", "x"}, exit: ExitUsage, stderr: `invalid value "x" for flag -n: parse error` + "\nUsage: test tool\n\nFlags:\n  -n int\n    \thow many (default 1)\n"},
		{runErr: errors.New("the job broke"), exit: 1, stdout: "ran with the caller's ctx\n", stderr: "test tool: the job broke\n"},
		{runErr: fmt.Errorf("3 calls: %w", ErrReported), exit: 1, stdout: "ran with the caller's ctx\n"},
	} {
		var stdout, stderr bytes.Buffer
		exit := RunTool(ctx, Tool{Name: "test tool", Usage: "Usage: test tool\n", Options: &stdOptions{},
			Run: func(ctx context.Context, stdout, _ io.Writer) error {
				fmt.Fprintf(stdout, "ran with the %s ctx\n", ctx.Value(key{}))
				return tc.runErr
			}}, tc.args, &stdout, &stderr)
		if exit != tc.exit || stdout.String() != tc.stdout || stderr.String() != tc.stderr {
			t.Errorf("%q, Run %v: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, tc.runErr, exit, stdout.String(), stderr.String(), tc.exit, tc.stdout, tc.stderr)
		}
	}
}
