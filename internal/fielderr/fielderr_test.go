package fielderr

import (
	"strings"
	"testing"
)

func TestErrorNamesFieldValueAndLimit(t *testing.T) {
	for _, tc := range []struct {
		err  Error
		want string
	}{
		{Error{"gpu-percent", "120", "out of range 1..100"}, "gpu-percent 120 out of range 1..100"},
		{Error{"server.name", "", "must not be empty"}, `server.name "" must not be empty`},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("%#v: %q, want %q", tc.err, got, tc.want)
		}
	}
}

func TestShortenKeepsFortyBytes(t *testing.T) {
	if got := Shorten("nvlink"); got != "nvlink" {
		t.Errorf("Shorten(nvlink) = %q", got)
	}
	long := strings.Repeat("x", 41)
	if got := Shorten(long); got != long[:40]+"..." {
		t.Errorf("Shorten(41 bytes) = %q", got)
	}
}
