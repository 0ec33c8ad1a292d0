package app

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupool/gpupool/internal/cli/clitest"
)

// TestOptionsValidate: a flag out of range is refused naming it, its value
// and its limit, and the defaults pass.
func TestOptionsValidate(t *testing.T) {
	clitest.CheckValidate(t, NewOptions, []clitest.Case{
		{nil, ""},
		{[]string{"--servers", "0"}, "--servers 0 out of range 1..100000"},
		{[]string{"--gpus-per-server", "65"}, "--gpus-per-server 65 out of range 1..64"},
		{[]string{"--percent", "101"}, "--percent 101 out of range 1..100"},
		{[]string{"--ttl", "1s"}, "--ttl 1s is below the minimum 3s"},
		{[]string{"--duration", "0s"}, "--duration 0s is below the minimum 1s"},
		{[]string{"--servers", "2", "--gpus-per-server", "1", "--percent", "50", "--leases", "5"}, "--leases 5 over the 4 leases of 50% that --servers 2 × --gpus-per-server 1 hold"},
		{[]string{"--pool-config", "/nonexistent/config.yaml"}, "--pool-config: open /nonexistent/config.yaml"},
	})
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
