package ociimage

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// sources writes the given files into a fresh directory and returns it.
func sources(t *testing.T, contents map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for file, content := range contents {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// twoLayers is an image of a program and a library, each in a layer, read
// from dir.
func twoLayers(dir string) Image {
	return Image{
		Ref: "example.com/team/tool:v1",
		Layers: [][]File{
			{{Path: "lib/x86_64-linux-gnu/libc.so.6", Mode: 0o644, Source: filepath.Join(dir, "libc")}},
			{{Path: "usr/local/bin/tool", Mode: 0o755, Source: filepath.Join(dir, "tool")}},
		},
		Entrypoint: []string{"/usr/local/bin/tool"},
		Env:        []string{"PATH=/usr/local/bin"},
		Labels:     map[string]string{"org.example.libc": "2.36"},
		User:       "65532",
	}
}

func build(t *testing.T, spec Image) Built {
	t.Helper()
	b, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSameFilesGiveTheSameDigest(t *testing.T) {
	files := map[string]string{"libc": "the C library", "tool": "#!the program"}
	first := build(t, twoLayers(sources(t, files)))

	// The same bytes elsewhere, written later, with other permissions on
	// the host: none of that reaches the image.
	elsewhere := sources(t, files)
	later := time.Now().Add(time.Hour)
	for _, f := range []string{"libc", "tool"} {
		if err := os.Chtimes(filepath.Join(elsewhere, f), later, later); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(elsewhere, f), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	second := build(t, twoLayers(elsewhere))
	if first.Digest != second.Digest || first.ID != second.ID {
		t.Errorf("the same files gave %s (ID %s), then %s (ID %s)", first.Digest, first.ID, second.Digest, second.ID)
	}
	if !strings.HasPrefix(first.Digest, "sha256:") || first.Size <= 0 {
		t.Errorf("digest %q, size %d", first.Digest, first.Size)
	}

	// And the tarballs are the same bytes.
	a, b := filepath.Join(t.TempDir(), "a.tar"), filepath.Join(t.TempDir(), "b.tar")
	if err := WriteTarball(a, first); err != nil {
		t.Fatal(err)
	}
	if err := WriteTarball(b, second); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readFile(t, a), readFile(t, b)) {
		t.Error("the same images gave two different tarballs")
	}
}

func TestAnyChangeGivesAnotherDigest(t *testing.T) {
	files := map[string]string{"libc": "the C library", "tool": "#!the program"}
	base := build(t, twoLayers(sources(t, files))).Digest

	changes := map[string]func(*Image){
		"a file's bytes": func(img *Image) {
			img.Layers[1][0].Source = filepath.Join(sources(t, map[string]string{"tool": "#!the program, fixed"}), "tool")
		},
		"a file's mode":   func(img *Image) { img.Layers[1][0].Mode = 0o750 },
		"a file's path":   func(img *Image) { img.Layers[1][0].Path = "bin/tool" },
		"a label":         func(img *Image) { img.Labels = map[string]string{"org.example.libc": "2.41"} },
		"the entrypoint":  func(img *Image) { img.Entrypoint = []string{"/usr/local/bin/tool", "--verbose"} },
		"the user":        func(img *Image) { img.User = "0" },
		"the env":         func(img *Image) { img.Env = nil },
		"the layer order": func(img *Image) { slices.Reverse(img.Layers) },
	}
	for what, change := range changes {
		t.Run(what, func(t *testing.T) {
			spec := twoLayers(sources(t, files))
			change(&spec)
			if got := build(t, spec).Digest; got == base {
				t.Errorf("changing %s kept the digest %s", what, got)
			}
		})
	}
}

func TestTarballHoldsEveryRef(t *testing.T) {
	dir := sources(t, map[string]string{"libc": "the C library", "tool": "#!the program", "pause": "#!pause"})
	tool := build(t, twoLayers(dir))
	pause := build(t, Image{
		Ref:        "registry.k8s.io/pause:3.6",
		Layers:     [][]File{{{Path: "pause", Mode: 0o755, Source: filepath.Join(dir, "pause")}}},
		Entrypoint: []string{"/pause"},
	})
	path := filepath.Join(t.TempDir(), "images.tar")
	if err := WriteTarball(path, tool, pause); err != nil {
		t.Fatal(err)
	}

	for _, want := range []Built{tool, pause} {
		tag, err := name.NewTag(want.Ref)
		if err != nil {
			t.Fatal(err)
		}
		img, err := tarball.ImageFromPath(path, &tag)
		if err != nil {
			t.Fatalf("%s: %v", want.Ref, err)
		}
		digest, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		id, err := img.ConfigName()
		if err != nil {
			t.Fatal(err)
		}
		if digest.String() != want.Digest || id.String() != want.ID {
			t.Errorf("%s in the tarball is %s (ID %s), built as %s (ID %s)", want.Ref, digest, id, want.Digest, want.ID)
		}
	}

	tag, _ := name.NewTag(tool.Ref)
	img, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH || !cfg.Created.IsZero() ||
		!slices.Equal(cfg.Config.Entrypoint, []string{"/usr/local/bin/tool"}) ||
		!slices.Equal(cfg.Config.Env, []string{"PATH=/usr/local/bin"}) ||
		cfg.Config.Labels["org.example.libc"] != "2.36" || cfg.Config.User != "65532" {
		t.Errorf("config: %+v", cfg)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, layer := range layers {
		rc, err := layer.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, entries(t, rc)...)
		rc.Close()
	}
	want := []string{
		"lib/ dir 755", "lib/x86_64-linux-gnu/ dir 755", "lib/x86_64-linux-gnu/libc.so.6 file 644 the C library",
		"usr/ dir 755", "usr/local/ dir 755", "usr/local/bin/ dir 755", "usr/local/bin/tool file 755 #!the program",
	}
	if !slices.Equal(got, want) {
		t.Errorf("the layers hold\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// entries lists a layer's tar entries in order as "name type mode [content]",
// and fails t on an entry not owned by root at the epoch.
func entries(t *testing.T, r io.Reader) []string {
	t.Helper()
	var list []string
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return list
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Uid != 0 || hdr.Gid != 0 || hdr.Uname != "" || !hdr.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s: uid %d gid %d uname %q mtime %v", hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.ModTime)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			list = append(list, hdr.Name+" dir "+modeString(hdr.Mode))
		case tar.TypeReg:
			content, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			list = append(list, hdr.Name+" file "+modeString(hdr.Mode)+" "+string(content))
		default:
			t.Errorf("%s: type %c", hdr.Name, hdr.Typeflag)
		}
	}
}

func modeString(mode int64) string { return strconv.FormatInt(mode, 8) }

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestBuildRefusesBadLayers(t *testing.T) {
	dir := sources(t, map[string]string{"tool": "#!the program"})
	tool := filepath.Join(dir, "tool")
	cases := map[string]Image{
		"no tag":           {Ref: "UPPER/case"},
		"an absolute path": {Ref: "x:1", Layers: [][]File{{{Path: "/bin/tool", Mode: 0o755, Source: tool}}}},
		"outside the root": {Ref: "x:1", Layers: [][]File{{{Path: "../tool", Mode: 0o755, Source: tool}}}},
		"the root itself":  {Ref: "x:1", Layers: [][]File{{{Path: ".", Mode: 0o755, Source: tool}}}},
		"a path twice": {Ref: "x:1", Layers: [][]File{{
			{Path: "bin/tool", Mode: 0o755, Source: tool}, {Path: "bin//tool", Mode: 0o755, Source: tool},
		}}},
		"a file under a file": {Ref: "x:1", Layers: [][]File{{
			{Path: "bin", Mode: 0o755, Source: tool}, {Path: "bin/tool", Mode: 0o755, Source: tool},
		}}},
		"a file where a directory is": {Ref: "x:1", Layers: [][]File{{
			{Path: "bin/tool", Mode: 0o755, Source: tool}, {Path: "bin", Mode: 0o755, Source: tool},
		}}},
		"a missing source": {Ref: "x:1", Layers: [][]File{{{Path: "bin/tool", Mode: 0o755, Source: filepath.Join(dir, "nothing")}}}},
	}
	for what, spec := range cases {
		if _, err := Build(spec); err == nil {
			t.Errorf("%s: built", what)
		}
	}
}

func TestPushGivesTheBuiltDigest(t *testing.T) {
	registry := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	defer registry.Close()
	built := build(t, twoLayers(sources(t, map[string]string{"libc": "the C library", "tool": "#!the program"})))

	ref := strings.TrimPrefix(registry.URL, "http://") + "/team/tool:v1"
	if err := Push(t.Context(), built, ref); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := remote.Head(tag)
	if err != nil {
		t.Fatal(err)
	}
	if pushed.Digest.String() != built.Digest {
		t.Errorf("the registry has %s, built %s", pushed.Digest, built.Digest)
	}
}
