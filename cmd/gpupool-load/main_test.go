package main

import (
	"context"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/cmd/gpupool-load/app"
	"github.com/gpupool/gpupool/internal/cli"
)

// TestBadFlags: a bad command line ends with cli.ExitUsage and says why
// after the command's name, before anything runs.
func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--servers", "x"}, `invalid value "x" for flag -servers`},
		{[]string{"--servers", "0"}, "gpupool-load: --servers 0 out of range 1..100000\n"},
		{[]string{"--pool-config", "/nonexistent/config.yaml"}, "gpupool-load: --pool-config: open /nonexistent/config.yaml"},
	} {
		var stdout, stderr strings.Builder
		if code := app.Exec(context.Background(), tc.args, &stdout, &stderr); code != cli.ExitUsage || !strings.Contains(stderr.String(), tc.want) || stdout.Len() > 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d and %q on stderr only", tc.args, code, stdout.String(), stderr.String(), cli.ExitUsage, tc.want)
		}
	}
}

// TestHelpExplainsEveryFlag: --help goes to stdout and names every flag.
func TestHelpExplainsEveryFlag(t *testing.T) {
	var stdout, stderr strings.Builder
	if code := app.Exec(context.Background(), []string{"--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	if !strings.HasPrefix(stdout.String(), "Usage: gpupool-load [flags]\n\nPlays --servers GPU servers") || !strings.Contains(stdout.String(), "Exits 1 when any call failed.\n\nFlags:\n  -adapter string\n") {
		t.Errorf("--help does not say what the load does above the flags:\n%s", stdout.String())
	}
	for _, flag := range []string{"allocator", "pool-config", "servers", "gpus-per-server", "leases", "percent", "ttl", "heartbeat",
		"duration", "progress", "group", "concurrency", "keep", "name-prefix", "usage-listen", "allocator-pid", "adapter",
		"adapter-insecure", "summary-json"} {
		if !strings.Contains(stdout.String(), "  -"+flag+" ") && !strings.Contains(stdout.String(), "  -"+flag+"\n") {
			t.Errorf("--help does not explain -%s:\n%s", flag, stdout.String())
		}
	}
}
