package kube

import (
	"path/filepath"
	"testing"
)

func TestRestartedProcessKeepsItsLog(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "component.log")
	var p *process
	for _, word := range []string{"first", "second"} {
		var err error
		if p, err = startProcess("component", "/bin/sh", nil, []string{"-c", "echo " + word}, logFile); err != nil {
			t.Fatal(err)
		}
		<-p.exited
	}
	if got, want := p.tail(10), "first\nsecond"; got != want {
		t.Errorf("log after two runs %q, want %q", got, want)
	}
}
