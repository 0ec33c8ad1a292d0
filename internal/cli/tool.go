package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
)

// Tool is a command that does one job, writes its own output and ends
// (gpupool-load, gpupool-simulate). Unlike a Service it has no log flags:
// its errors are plain lines on stderr, "Name: error".
type Tool struct {
	// Name begins the tool's error lines: the command as typed,
	// "gpupool-simulate grid".
	Name    string
	Usage   string
	Options Options
	// Run does the job; ctx is RunTool's.
	Run func(ctx context.Context, stdout, stderr io.Writer) error
}

// ErrReported is a Run's error for a job that failed and has said how in
// its own output (gpupool-load's summary counts the failed calls): the
// tool ends with 1 and adds nothing to stderr.
var ErrReported = errors.New("failed, as the output says")

// RunTool parses args into the tool's options, validates them and runs it
// with ctx: a tool with something to clean up passes one that SIGINT
// ends, one with nothing passes context.Background() and dies of the
// signal as any process. It returns the exit status: 0 done, ExitUsage for
// a bad command line, 1 when Run failed.
func RunTool(ctx context.Context, t Tool, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(t.Name, flag.ContinueOnError)
	t.Options.AddFlags(fs)
	fs.Usage = usage(fs.Output, t.Usage, fs.PrintDefaults)
	if exit, ok := Parse(fs, args, stdout, stderr); !ok {
		return exit
	}
	if err := t.Options.Validate(); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", t.Name, err)
		return ExitUsage
	}
	switch err := t.Run(ctx, stdout, stderr); {
	case err == nil:
		return 0
	case !errors.Is(err, ErrReported):
		fmt.Fprintf(stderr, "%s: %v\n", t.Name, err)
	}
	return 1
}
