package client

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestNewFromFlags: a client is made from the flags' values, and each
// value that does not do is refused naming its flag.
func TestNewFromFlags(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("admin-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addresses, caFile, tokenFile string
		want                         string // the error; "<nil>" when a client is made
	}{
		{"http://127.0.0.1:8470", "", tokenFile, "<nil>"},
		{"http://a:8470,http://b:8470", "", "", "<nil>"},
		{"http://127.0.0.1:8470", "", tokenFile + ".missing", "--admin-token-file: open " + tokenFile + ".missing: no such file or directory"},
		{"allocator:8470", "", tokenFile, `--allocator: allocator address "allocator:8470" is not a URL such as http://127.0.0.1:8470`},
		{" ", "", tokenFile, "--allocator: no allocator address given"},
		{"https://127.0.0.1:8470", tokenFile, tokenFile, "--allocator-ca-file: the allocator's CA: " + tokenFile + " holds no PEM certificate"},
	} {
		c, err := NewFromFlags(Flags{Allocator: tc.addresses, CAFile: tc.caFile, TokenFile: tc.tokenFile, TokenFlag: "--admin-token-file"})
		if got := fmt.Sprint(err); got != tc.want || (err == nil) != (c != nil) {
			t.Errorf("%q %q %q: client %v, error %s; want %s", tc.addresses, tc.caFile, tc.tokenFile, c != nil, got, tc.want)
		}
		if c != nil && tc.tokenFile != "" && c.token != "admin-token" {
			t.Errorf("%q: token %q; want the file's, its newline trimmed", tc.addresses, c.token)
		}
	}
}
