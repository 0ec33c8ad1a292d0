package golden

import (
	"os"
	"path/filepath"
	"testing"
)

// recorder is a test that Check fails without failing this one.
type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Errorf(string, ...any) { r.failed = true }

func TestCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "out.yaml")
	defer func(was bool) { *update = was }(*update)

	*update = true
	Check(t, path, []byte("a: 1\n"))
	if b, err := os.ReadFile(path); err != nil || string(b) != "a: 1\n" {
		t.Fatalf("-update wrote %q, %v", b, err)
	}

	*update = false
	for _, tc := range []struct {
		got  string
		fail bool
	}{{"a: 1\n", false}, {"a: 2\n", true}} {
		r := &recorder{TB: t}
		Check(r, path, []byte(tc.got))
		if r.failed != tc.fail {
			t.Errorf("Check(%q) against %q: failed %v, want %v", tc.got, "a: 1\n", r.failed, tc.fail)
		}
	}
}
