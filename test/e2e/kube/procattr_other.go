//go:build !linux

package kube

import "syscall"

// sysProcAttr puts a component in a process group of its own, so that stop
// kills all of it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
