package kube

import "syscall"

// sysProcAttr puts a component in a process group of its own, so that stop
// kills all of it, and has the kernel kill it if the test binary dies
// without calling Stop. Pdeathsig fires when the thread that started the
// child ends; Go ends a thread only when a goroutine locked to it
// (runtime.LockOSThread) exits, which nothing here does.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
