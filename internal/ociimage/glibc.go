package ociimage

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// debianVersion tells the NVIDIA container runtime that an image lays its
// libraries out as Debian does: it then mounts libnvidia-ml.so.1 into
// /usr/lib/x86_64-linux-gnu, which Debian's loader searches, and not into
// /usr/lib64, which it does not. The image has it when its glibc is
// Debian's (or Ubuntu's).
const debianVersion = "/etc/debian_version"

// Glibc is the glibc dynamic binaries need: its files, a layer of an
// image, and the version its loader reports.
type Glibc struct {
	Files   []File
	Version string
}

// GlibcOf finds what the dynamic binaries among bins need to start: the
// ELF interpreter at the path they name, and the shared libraries they
// link, and those link, and alsoLibs (libraries loaded at run time, by
// name), from the interpreter's directory on this machine into the same
// directory of the image. Nothing when every binary is static.
func GlibcOf(bins []string, alsoLibs ...string) (Glibc, error) {
	interp := ""
	var libs []string
	for _, bin := range bins {
		p, needed, err := Linking(bin)
		if err != nil {
			return Glibc{}, err
		}
		if p == "" {
			continue
		}
		if interp != "" && p != interp {
			return Glibc{}, fmt.Errorf("%s wants the loader %s, another binary %s", bin, p, interp)
		}
		interp = p
		libs = append(libs, needed...)
	}
	if interp == "" {
		return Glibc{}, nil
	}
	loader, err := filepath.EvalSymlinks(interp)
	if err != nil {
		return Glibc{}, err
	}
	version, err := loaderVersion(loader)
	if err != nil {
		return Glibc{}, err
	}
	libDir := filepath.Dir(loader)
	files := []File{{Path: strings.TrimPrefix(interp, "/"), Mode: 0o755, Source: loader}}
	if _, err := os.Stat(debianVersion); err == nil {
		files = append(files, File{Path: strings.TrimPrefix(debianVersion, "/"), Mode: 0o644, Source: debianVersion})
	}
	seen := map[string]bool{path.Base(interp): true}
	for libs = append(libs, alsoLibs...); len(libs) > 0; {
		lib := libs[0]
		libs = libs[1:]
		if seen[lib] {
			continue
		}
		seen[lib] = true
		src, err := filepath.EvalSymlinks(filepath.Join(libDir, lib))
		if err != nil {
			return Glibc{}, fmt.Errorf("%s, which the binaries or NVML link: %w", lib, err)
		}
		_, needed, err := Linking(src)
		if err != nil {
			return Glibc{}, err
		}
		libs = append(libs, needed...)
		files = append(files, File{Path: strings.TrimPrefix(filepath.Join(libDir, lib), "/"), Mode: 0o755, Source: src})
	}
	return Glibc{Files: files, Version: version}, nil
}

// Linking reads an ELF file's interpreter ("" when static) and the shared
// libraries it names.
func Linking(file string) (interp string, needed []string, err error) {
	f, err := elf.Open(file)
	if err != nil {
		return "", nil, err
	}
	defer f.Close() //nolint:errcheck // only read
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, prog.Filesz)
		if _, err := prog.ReadAt(b, 0); err != nil {
			return "", nil, fmt.Errorf("%s: %w", file, err)
		}
		interp = strings.TrimRight(string(b), "\x00")
	}
	needed, err = f.ImportedLibraries()
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", file, err)
	}
	return interp, needed, nil
}

// loaderVersion is the first line the loader prints with --version:
// "ld.so (Debian GLIBC 2.36-9+deb12u14) stable release version 2.36".
func loaderVersion(loader string) (string, error) {
	out, err := exec.Command(loader, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", loader, err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSuffix(first, "."), nil
}
