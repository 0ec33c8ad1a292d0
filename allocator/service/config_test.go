package service

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

func TestQuotaBounds(t *testing.T) {
	for _, tc := range []struct {
		hard    string
		refused bool
	}{
		{"400", false},
		{"0", false},
		{"-1", true},
		{"1500m", true},
		{"1e18", true}, // would overflow the share
	} {
		c := &FileConfig{Namespaces: map[string]NamespaceConfig{
			"ml": {Hard: map[string]resource.Quantity{QuotaResource: resource.MustParse(tc.hard)}},
		}}
		err := c.validate()
		if (err != nil) != tc.refused {
			t.Errorf("quota %s: %v, want refused %v", tc.hard, err, tc.refused)
			continue
		}
		if err == nil {
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "namespaces.ml.hard."+QuotaResource) || !strings.Contains(msg, "0..100000000") {
			t.Errorf("quota %s: %q does not name the field and the limit", tc.hard, err)
		}
	}
}

// TestIdlePolicyFromTheConfigFile: a namespace's idle policy is read from
// the config file, strictly, and checked there.
func TestIdlePolicyFromTheConfigFile(t *testing.T) {
	write := func(body string) string {
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	c, err := LoadConfig(write("namespaces:\n  ml:\n    idle: {useBelow: 0.1, window: 30m, grace: 15m, action: reclaim}\n  batch: {}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := IdlePolicy{UseBelow: 0.1, Window: minutes(30), Grace: minutes(15), Action: IdleReclaim}
	if got := c.IdlePolicies(); len(got) != 1 || got["ml"] != want {
		t.Errorf("IdlePolicies = %+v, want ml's %+v alone", got, want)
	}
	for body, refusal := range map[string]string{
		"namespaces:\n  ml:\n    idle: {useBelow: 0.1, window: 30m, action: evict}\n": `namespaces.ml.idle.action "evict" must be report or reclaim`,
		"namespaces:\n  ml:\n    idle: {useBelow: 0.1, window: 10s}\n":                "namespaces.ml.idle.window 10s out of range",
		"namespaces:\n  ml:\n    idle: {useBelow: 0.1, window: 30m, exempt: [x]}\n":   `unknown field "exempt"`,
	} {
		if _, err := LoadConfig(write(body)); err == nil || !strings.Contains(err.Error(), refusal) {
			t.Errorf("%q: %v, want %q", body, err, refusal)
		}
	}
}
