package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/cmd/gpupool-simulate/app"
)

// TestHelpGoesToStdout: asked for, the usage is the output, and the exit
// status is 0.
func TestHelpGoesToStdout(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--help"}, "Replays an Alibaba OpenB GPU trace"},
		{[]string{"-h"}, "multi-gpu=P%   P% of the GPU pods ask for more than one GPU"},
		{[]string{"grid", "--help"}, "Usage: gpupool-simulate grid"},
		{[]string{"sharing", "--help"}, "Usage: gpupool-simulate sharing"},
	} {
		var stdout, stderr bytes.Buffer
		code := app.Exec(tc.args, &stdout, &stderr)
		if code != 0 || !strings.Contains(stdout.String(), tc.want) || !strings.Contains(stdout.String(), "\n\nFlags:\n  -") || stderr.Len() > 0 {
			t.Errorf("gpupool-simulate %v: exit %d, stdout %q, stderr %q; want exit 0, %q and the flags on stdout only",
				tc.args, code, stdout.String(), stderr.String(), tc.want)
		}
	}
}

// TestBadUsage: a bad command line ends with 2 and a replay that fails
// with 1, each saying why after the command's name, with nothing on
// stdout.
func TestBadUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"--policies", "fdg"}, 2, `gpupool-simulate: --policies "fdg": policy fdg is not one of`},
		{[]string{"grid", "--baseline", "tetris"}, 2, "gpupool-simulate grid: --baseline: policy tetris is not one of"},
		{[]string{"sharing", "--seeds", "x"}, 2, `gpupool-simulate sharing: --seeds "x": "x" is not a number`},
		{[]string{"--pods", "/nonexistent.csv"}, 1, "gpupool-simulate: open /nonexistent.csv: no such file or directory"},
	} {
		var stdout, stderr bytes.Buffer
		code := app.Exec(tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) || stdout.Len() > 0 {
			t.Errorf("gpupool-simulate %v: exit %d, stderr %q, stdout %q; want exit %d, %q on stderr and nothing on stdout",
				tc.args, code, stderr.String(), stdout.String(), tc.code, tc.want)
		}
	}
}
