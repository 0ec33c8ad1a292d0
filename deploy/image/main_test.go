package main

import (
	"archive/tar"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/gpupool/gpupool/internal/ociimage"
)

// loadNVML stands in for gpupool-server: a program linked against this
// machine's glibc that loads libnvidia-ml.so.1 at run time, as go-nvml does.
const loadNVML = `#include <dlfcn.h>
#include <stdio.h>
int main(void) {
	if (!dlopen("libnvidia-ml.so.1", RTLD_NOW)) { puts(dlerror()); return 1; }
	puts("NVML loaded");
	return 0;
}
`

// fakeNVML links what NVIDIA's libnvidia-ml.so.1 links: libpthread, libdl
// and librt by name, which glibc 2.34 and later keep only as stubs, and libm.
const fakeNVML = `int nvmlInit_v2(void) { return 0; }`

// gcc compiles C source into out with the given arguments, or skips t
// when there is no C compiler.
func gcc(t *testing.T, source, out string, args ...string) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc: the images' glibc layer is read from a dynamic binary gcc builds")
	}
	src := filepath.Join(t.TempDir(), "src.c")
	if err := os.WriteFile(src, []byte(source), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("gcc", append([]string{"-o", out, src}, args...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
}

// binaries writes a bin directory as make does: a static client and a
// dynamic server-side binary that loads NVML.
func binaries(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	gcc(t, `int main(void) { return 0; }`, filepath.Join(bin, client), "-static")
	gcc(t, loadNVML, filepath.Join(bin, "gpupool-server"))
	return bin
}

func TestImagesOfTheBinaries(t *testing.T) {
	specs, err := images("v9.9.9", binaries(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 2 || specs[0].Ref != "gpupool/gpupool:v9.9.9" || specs[1].Ref != "gpupool/gpupool-client:v9.9.9" {
		t.Fatalf("images %+v", specs)
	}
	server, clientImage := specs[0], specs[1]

	if len(clientImage.Layers) != 1 || !slices.Equal(paths(clientImage.Layers[0]), []string{"usr/local/bin/gpupool"}) ||
		clientImage.Entrypoint[0] != "/usr/local/bin/gpupool" || clientImage.Labels[versionLabel] != "v9.9.9" {
		t.Errorf("client image %+v", clientImage)
	}
	if len(server.Layers) != 2 || !slices.Equal(paths(server.Layers[1]), []string{"usr/local/bin/gpupool-server"}) ||
		server.Entrypoint != nil || !slices.Equal(server.Env, []string{"PATH=/usr/local/bin"}) || server.User != nonRoot {
		t.Errorf("server image %+v", server)
	}
	interp, _, err := ociimage.Linking(server.Layers[1][0].Source)
	if err != nil {
		t.Fatal(err)
	}
	libs := paths(server.Layers[0])
	for _, want := range append([]string{"libc.so.6"}, nvmlLinks...) {
		if !slices.Contains(libs, libDir(t, server)+"/"+want) {
			t.Errorf("the glibc layer lacks %s: %v", want, libs)
		}
	}
	if !slices.Contains(libs, strings.TrimPrefix(interp, "/")) {
		t.Errorf("the glibc layer lacks the loader %s: %v", interp, libs)
	}
	if !strings.Contains(server.Labels[glibcLabel], "GLIBC") || server.Labels[versionLabel] != "v9.9.9" {
		t.Errorf("server labels %v", server.Labels)
	}
}

func paths(layer []ociimage.File) []string {
	var p []string
	for _, f := range layer {
		p = append(p, f.Path)
	}
	return p
}

// libDir is the directory of libc.so.6 in the server image, relative to its
// root: where the NVIDIA container runtime mounts libnvidia-ml.so.1 too.
func libDir(t *testing.T, server ociimage.Image) string {
	t.Helper()
	for _, p := range paths(server.Layers[0]) {
		if filepath.Base(p) == "libc.so.6" {
			return filepath.Dir(p)
		}
	}
	t.Fatalf("no libc.so.6 in %v", paths(server.Layers[0]))
	return ""
}

func TestADynamicClientIsRefused(t *testing.T) {
	bin := binaries(t)
	gcc(t, `int main(void) { return 0; }`, filepath.Join(bin, client))
	if _, err := images("v9.9.9", bin); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("a dynamic client: %v", err)
	}
}

// TestServerImageLoadsNVMLOnItsOwnGlibc runs the server-side binary in the
// image's root filesystem alone, as the user the manifests name, with a
// libnvidia-ml.so.1 where the NVIDIA container runtime mounts it: nothing
// of this machine's libraries is there to help.
func TestServerImageLoadsNVMLOnItsOwnGlibc(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	bin := binaries(t)
	specs, err := images("v9.9.9", bin)
	if err != nil {
		t.Fatal(err)
	}
	lib := libDir(t, specs[0])
	tarballPath := filepath.Join(t.TempDir(), "images.tar")
	if err := run(t.Context(), io.Discard, "v9.9.9", bin, tarballPath, ""); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	unpack(t, image(t, tarballPath, "gpupool/gpupool:v9.9.9"), root)
	// The stubs are named by their files, so that the link records them
	// although their symbols are in libc.
	gcc(t, fakeNVML, filepath.Join(root, lib, "libnvidia-ml.so.1"), "-shared", "-fPIC", "-Wl,--no-as-needed", "-lm",
		"/"+lib+"/libpthread.so.0", "/"+lib+"/libdl.so.2", "/"+lib+"/librt.so.1")
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command("/usr/local/bin/gpupool-server")
	cmd.Env = []string{"PATH=/usr/local/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: 65532, Gid: 65532}}
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "NVML loaded" {
		t.Errorf("in the image: %v\n%s", err, out)
	}
}

func TestRunPushesWhatItWrites(t *testing.T) {
	registry := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	defer registry.Close()
	host := strings.TrimPrefix(registry.URL, "http://")
	tarballPath := filepath.Join(t.TempDir(), "images.tar")
	if err := run(t.Context(), io.Discard, "v9.9.9", binaries(t), tarballPath, host+"/team/"); err != nil {
		t.Fatal(err)
	}
	for ref, pushed := range map[string]string{
		"gpupool/gpupool:v9.9.9":        host + "/team/gpupool:v9.9.9",
		"gpupool/gpupool-client:v9.9.9": host + "/team/gpupool-client:v9.9.9",
	} {
		written, err := image(t, tarballPath, ref).Digest()
		if err != nil {
			t.Fatal(err)
		}
		tag, err := name.NewTag(pushed)
		if err != nil {
			t.Fatal(err)
		}
		desc, err := remote.Head(tag)
		if err != nil {
			t.Fatalf("%s: %v", pushed, err)
		}
		if desc.Digest != written {
			t.Errorf("%s is %s in the registry, %s in the tarball", pushed, desc.Digest, written)
		}
	}
}

func image(t *testing.T, tarballPath, ref string) v1.Image {
	t.Helper()
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(tarballPath, &tag)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// unpack writes the image's filesystem under root: directories and regular
// files are all the images hold.
func unpack(t *testing.T, img v1.Image, root string) {
	t.Helper()
	fs := mutate.Extract(img)
	defer fs.Close()
	tr := tar.NewReader(fs)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(hdr.Mode))
		case tar.TypeReg:
			var data []byte
			if data, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, data, os.FileMode(hdr.Mode))
			}
		default:
			t.Fatalf("%s: type %c", hdr.Name, hdr.Typeflag)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
