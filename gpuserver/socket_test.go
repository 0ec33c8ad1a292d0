package gpuserver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// shortTempDir is a fresh directory with a short path (a socket path has
// at most 107 bytes).
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpupool")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// TestListenProcessSocketChecksTheDirectory: the socket's directory must
// not be a symbolic link, nor writable by others unless sticky (as /tmp),
// nor, when the daemon is root, another user's.
func TestListenProcessSocketChecksTheDirectory(t *testing.T) {
	base := shortTempDir(t)
	mkdir := func(name string, mode os.FileMode) string {
		dir := filepath.Join(base, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	private, open, sticky := mkdir("private", 0o755), mkdir("open", 0o777), mkdir("sticky", 0o777|os.ModeSticky)
	link := filepath.Join(base, "link")
	if err := os.Symlink(private, link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dir, refusal string
	}{
		{private, ""},
		{sticky, ""},
		{open, "writable by others"},
		{link, "symbolic link"},
	} {
		ln, err := ListenProcessSocket(filepath.Join(c.dir, "d.sock"))
		if err == nil {
			_ = ln.Close()
		}
		if c.refusal == "" && err != nil {
			t.Errorf("in %s: %v", filepath.Base(c.dir), err)
		}
		if c.refusal != "" && (err == nil || !strings.Contains(err.Error(), c.refusal)) {
			t.Errorf("in %s: %v, want refused as %s", filepath.Base(c.dir), err, c.refusal)
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("a directory of another user's needs root to make (os.Chown): not tested")
	}
	other := mkdir("other", 0o755)
	if err := os.Chown(other, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if ln, err := ListenProcessSocket(filepath.Join(other, "d.sock")); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
		if err == nil {
			_ = ln.Close()
		}
		t.Errorf("in a directory of uid 65534's: %v, want refused", err)
	}
}

// TestListenProcessSocketDoesNotChmodThroughALink: a socket swapped for a
// symbolic link between its creation and its chmod is refused, and the
// link's target keeps its mode.
func TestListenProcessSocketDoesNotChmodThroughALink(t *testing.T) {
	dir := shortTempDir(t)
	target := filepath.Join(dir, "secret")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	afterListen = func(path string) {
		if err := os.Remove(path); err != nil {
			t.Error(err)
		}
		if err := os.Symlink(target, path); err != nil {
			t.Error(err)
		}
	}
	defer func() { afterListen = nil }()
	ln, err := ListenProcessSocket(filepath.Join(dir, "run", "d.sock"))
	if err == nil {
		_ = ln.Close()
		t.Error("a socket swapped for a link was opened to all")
	}
	if fi, err := os.Stat(target); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the link's target: %v (%v), want it left 0600", fi.Mode(), err)
	}
}
