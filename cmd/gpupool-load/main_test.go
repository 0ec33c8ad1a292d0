package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	"github.com/gpupool/gpupool/internal/cli"
)

// TestBadFlagsNameTheFlagTheValueAndTheLimit: a flag out of range is
// refused before anything runs, naming it, its value and its limit.
func TestBadFlagsNameTheFlagTheValueAndTheLimit(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--servers", "0"}, "--servers 0 out of range 1..100000"},
		{[]string{"--gpus-per-server", "65"}, "--gpus-per-server 65 out of range 1..64"},
		{[]string{"--percent", "101"}, "--percent 101 out of range 1..100"},
		{[]string{"--ttl", "1s"}, "--ttl 1s is below the minimum 3s"},
		{[]string{"--duration", "0s"}, "--duration 0s is below the minimum 1s"},
		{[]string{"--servers", "2", "--gpus-per-server", "1", "--percent", "50", "--leases", "5"}, "--leases 5 over the 4 leases of 50% that --servers 2 × --gpus-per-server 1 hold"},
		{[]string{"--pool-config", "/nonexistent/config.yaml"}, "--pool-config: open /nonexistent/config.yaml"},
	} {
		var stdout, stderr strings.Builder
		if code := run(tc.args, &stdout, &stderr); code != cli.ExitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, stderr.String(), cli.ExitUsage, tc.want)
		}
	}
}

// TestHelpExplainsEveryFlag: --help goes to stdout and names every flag.
func TestHelpExplainsEveryFlag(t *testing.T) {
	var stdout, stderr strings.Builder
	if code := run([]string{"--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for _, flag := range []string{"allocator", "pool-config", "servers", "gpus-per-server", "leases", "percent", "ttl", "heartbeat",
		"duration", "progress", "group", "concurrency", "keep", "name-prefix", "usage-listen", "allocator-pid", "adapter",
		"adapter-insecure", "summary-json"} {
		if !strings.Contains(stdout.String(), "  -"+flag+" ") && !strings.Contains(stdout.String(), "  -"+flag+"\n") {
			t.Errorf("--help does not explain -%s:\n%s", flag, stdout.String())
		}
	}
}

// TestTokensFromThePoolConfig: the servers take the servers token, the
// clients each namespace's, in namespace order; a config without them is
// refused, saying what is missing.
func TestTokensFromThePoolConfig(t *testing.T) {
	write := func(body string) string {
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	tk, err := readTokens(write("servers: {tokens: [servers-0123456789abcdef]}\nnamespaces:\n  team-b: {tokens: [team-b-0123456789abcdef]}\n  team-a: {tokens: [team-a-0123456789abcdef]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(tk); got != "{servers-0123456789abcdef [{team-a team-a-0123456789abcdef} {team-b team-b-0123456789abcdef}]}" {
		t.Errorf("tokens %s", got)
	}
	if _, err := readTokens(write("namespaces:\n  team-a: {tokens: [team-a-0123456789abcdef]}\n")); err == nil || !strings.Contains(err.Error(), "servers.tokens is empty") {
		t.Errorf("no servers token: %v", err)
	}
	if _, err := readTokens(write("servers: {tokens: [servers-0123456789abcdef]}\n")); err == nil || !strings.Contains(err.Error(), "no namespace has a token") {
		t.Errorf("no namespace token: %v", err)
	}
}

func TestQuantiles(t *testing.T) {
	var l latencies
	for i := range 100 {
		l.add(time.Duration(100-i) * time.Millisecond)
	}
	q := l.quantiles()
	if q.Count != 100 || q.P50 != 50*time.Millisecond || q.P99 != 99*time.Millisecond || q.Max != 100*time.Millisecond {
		t.Errorf("quantiles of 1..100 ms: %+v", q)
	}
}

// TestErrorKinds: failures are counted by the API's reason, or by what
// kept the call from an answer.
func TestErrorKinds(t *testing.T) {
	var e errorCounts
	e.add("acquire", &api.Error{Reason: api.ReasonNoCapacity})
	e.add("acquire", &api.Error{Reason: api.ReasonNoCapacity})
	e.add("renew", &client.UnreachableError{Err: os.ErrDeadlineExceeded})
	e.add("adapter", kindError("no value"))
	if got := fmt.Sprint(e.snapshot()); got != fmt.Sprintf("map[acquire %s:2 adapter no value:1 renew unreachable:1]", api.ReasonNoCapacity) {
		t.Errorf("errors by kind: %s", got)
	}
}

// TestSampleProcess reads this process's CPU time and resident memory.
func TestSampleProcess(t *testing.T) {
	s, err := sampleProcess(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.rss <= 0 || s.cpu < 0 {
		t.Errorf("sample of this process: %+v", s)
	}
	if _, err := sampleProcess(1 << 30); err == nil {
		t.Error("a process that does not exist was sampled")
	}
}
