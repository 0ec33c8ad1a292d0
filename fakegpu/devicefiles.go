package fakegpu

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
)

// A simulated GPU's device file (Source.DeviceDir) stands for its
// /dev/nvidiaN: a process holding it open is on the GPU, as a CUDA process
// is on the GPUs whose device nodes it holds.

// fileID names a file whatever path a process opened it by: a container
// sees the device file at a path of its own, not the daemon's.
type fileID struct{ dev, ino uint64 }

func statFileID(path string) (fileID, error) {
	st, err := os.Stat(path)
	if err != nil {
		return fileID{}, err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, fmt.Errorf("%s: the system gives no device and inode", path)
	}
	return fileID{dev: uint64(sys.Dev), ino: sys.Ino}, nil //nolint:unconvert // Dev is not 64 bits everywhere
}

// deviceFile is the path of GPU i's device file.
func (s *Source) deviceFile(i int) string { return filepath.Join(s.DeviceDir, s.UUID(i)) }

// CreateDeviceFiles makes DeviceDir and in it a file for each GPU, named
// by its UUID. A file already there is kept: the processes that hold it
// (containers that outlived a restart of the daemon) stay on its GPU.
func (s *Source) CreateDeviceFiles() error {
	//nolint:gosec // read by every container user, as /dev/nvidiaN is
	if err := os.MkdirAll(s.DeviceDir, 0o755); err != nil {
		return fmt.Errorf("simulated GPUs' device files: %w", err)
	}
	for i := range s.GPUs {
		//nolint:gosec // opened by every container user, as /dev/nvidiaN is
		f, err := os.OpenFile(s.deviceFile(i), os.O_CREATE|os.O_RDONLY, 0o444)
		if err != nil {
			return fmt.Errorf("simulated GPUs' device files: %w", err)
		}
		_ = f.Close()
	}
	return nil
}

// deviceFiles reads which file is each GPU's device file now, by its
// identity; a GPU whose file is gone is lost, and so is in lost with why.
func (s *Source) deviceFiles() (files map[fileID]int, lost map[int]error) {
	files = make(map[fileID]int, len(s.GPUs))
	for i := range s.GPUs {
		id, err := statFileID(s.deviceFile(i))
		if err != nil {
			if lost == nil {
				lost = map[int]error{}
			}
			lost[i] = fmt.Errorf("simulated GPU lost: %w", err)
			continue
		}
		files[id] = i
	}
	return files, lost
}

// holdersOf finds the processes under proc that hold one of files open:
// by the file's value in files, their PIDs in ascending order. It is one
// stat per open descriptor on the host, so it runs on the rounds that read
// processes only. Processes that end while it looks, and those whose
// descriptors this process may not read (another user's, without
// CAP_SYS_PTRACE), are passed over.
func holdersOf(proc string, files map[fileID]int) (map[int][]int, error) {
	entries, err := os.ReadDir(proc)
	if err != nil {
		return nil, err
	}
	held := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue // not a process: self, sys, meminfo...
		}
		fdDir := filepath.Join(proc, e.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			id, err := statFileID(filepath.Join(fdDir, fd.Name()))
			if err != nil {
				continue
			}
			// Several descriptors of one process on a file count once.
			if k, ok := files[id]; ok && !slices.Contains(held[k], pid) {
				held[k] = append(held[k], pid)
			}
		}
	}
	for _, pids := range held {
		slices.Sort(pids)
	}
	return held, nil
}
