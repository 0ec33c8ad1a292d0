package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

const (
	// waitTimeout bounds every wait in this package: a component that is
	// not up by then will not be. It is generous for busy 2-core machines.
	waitTimeout  = 90 * time.Second
	pollInterval = 200 * time.Millisecond
	// logTailLines is how much of a component's log an error carries.
	logTailLines = 40
)

// process is one running component, its output going to its own log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logFile string
	exited  chan struct{} // closed once the process has exited
	err     error         // what cmd.Wait returned; read after exited is closed
}

// startProcess starts bin, its output appended to logFile, so that a
// component started again (a kubelet restarted) keeps its earlier log.
func startProcess(name, bin string, env, args []string, logFile string) (*process, error) {
	log, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	// The child writes to its own copy of the descriptor.
	defer func() { _ = log.Close() }()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logFile: logFile, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// stop kills the process's group, which takes its children too, and waits
// for it to exit. There is no state to save, so there is no need to be gentle.
func (p *process) stop() {
	select {
	case <-p.exited:
	default:
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

// waitFor polls check until it succeeds. Its error names the process, says
// whether it exited, and ends with the tail of its log.
func (p *process) waitFor(ctx context.Context, what string, check func(context.Context) error) error {
	err := poll(ctx, p.exited, check)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errExited):
		err = fmt.Errorf("%s exited (%w) before %s", p.name, p.err, what)
	default:
		err = fmt.Errorf("%s: waiting for %s: %w", p.name, what, err)
	}
	return fmt.Errorf("%w\nlast lines of %s:\n%s", err, p.logFile, p.tail(logTailLines))
}

// logTails returns the last lines of each process's log, under its name;
// nil processes, never started, are left out.
func logTails(lines int, procs ...*process) string {
	var b strings.Builder
	for _, p := range procs {
		if p != nil {
			fmt.Fprintf(&b, "==> %s <==\n%s\n", p.logFile, p.tail(lines))
		}
	}
	return b.String()
}

// tail returns the last n lines of the process's log.
func (p *process) tail(n int) string {
	data, err := os.ReadFile(p.logFile)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

var errExited = errors.New("exited")

// poll calls check every pollInterval until it returns nil. It gives up
// with errExited once exited is closed (a nil channel never is), and with
// check's last error when ctx is done or waitTimeout has passed.
func poll(ctx context.Context, exited <-chan struct{}, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return errExited
		case <-ctx.Done():
			return fmt.Errorf("%w; last error: %w", ctx.Err(), err)
		case <-time.After(pollInterval):
		}
	}
}

// getOK is a check that a GET of url answers 200 OK.
func getOK(client *http.Client, url string) func(context.Context) error {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
			return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
		}
		return nil
	}
}
