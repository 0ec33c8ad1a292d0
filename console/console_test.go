package console

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// TestPageLoadsOnlyItsOwnFiles: every file the page names is served from
// the binary, nothing is loaded from elsewhere, and nothing is inline,
// which its Content-Security-Policy would block.
func TestPageLoadsOnlyItsOwnFiles(t *testing.T) {
	srv := httptest.NewServer(Handler())
	t.Cleanup(srv.Close)
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	resp, page := get(Path)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("%s: %d %s", Path, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	refs := regexp.MustCompile(`(?:src|href)="([^"#]+)"`).FindAllStringSubmatch(page, -1)
	if len(refs) < 2 {
		t.Fatalf("the page names %d files, want its script and style", len(refs))
	}
	for _, ref := range refs {
		if strings.Contains(ref[1], ":") || strings.HasPrefix(ref[1], "/") {
			t.Errorf("the page loads %q, from outside its folder", ref[1])
			continue
		}
		if resp, _ := get(Path + ref[1]); resp.StatusCode != http.StatusOK || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: %d", ref[1], resp.StatusCode)
		}
	}
	for _, inline := range []string{"<script>", "style=", "onclick=", "onload="} {
		if strings.Contains(page, inline) {
			t.Errorf("the page has inline %q, which its policy blocks", inline)
		}
	}
	if _, script := get(Path + "app.js"); strings.Contains(script, `style="`) || strings.Contains(script, "eval(") {
		t.Error("the script writes inline styles or evaluates strings, which the policy blocks")
	}
	if resp, _ := get(Path + "missing.js"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a missing file: %d", resp.StatusCode)
	}
}
