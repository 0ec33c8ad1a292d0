package gpuserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpupool/gpupool/allocator"
	"github.com/gpupool/gpupool/allocator/api"
	"github.com/gpupool/gpupool/allocator/client"
	gpuapi "github.com/gpupool/gpupool/gpuserver/api"
	"github.com/gpupool/gpupool/internal/httpserver"
)

// The process-report server: `gpupool run` on this host reports the
// processes of its lease over a Unix socket, where the kernel says who
// sends each report (SO_PEERCRED), and the daemon checks the sender may
// speak for the process and the lease is its namespace's on this server.

const (
	// maxReportBody bounds a process report; one is under 100 bytes.
	maxReportBody = 4096
	// maxPID is Linux's PID_MAX_LIMIT on 64-bit hosts.
	maxPID = 1 << 22
	// maxLeaseIDLen bounds a lease ID; the allocator's are 12 bytes.
	maxLeaseIDLen = 64
	// leaseCheckTimeout bounds asking the allocator about a reported
	// lease, failovers included.
	leaseCheckTimeout = 5 * time.Second
)

// ListenProcessSocket listens for process reports on the Unix socket at
// path. It creates the directory, replaces a socket that no daemon answers
// on (left by one that was killed), refuses one that a daemon answers on,
// and lets every local user connect: reports are checked, not reporters.
// Closing the listener removes the socket.
//
// The directory must be a directory, not a symbolic link, owned by root or
// this user, and writable by no one else unless sticky (as /tmp): others
// could otherwise swap the socket for a link between its creation and the
// chmod that opens it, and have a file of their choice made writable to
// all. The chmod itself goes through a handle opened without following
// links, and only when that is a socket of this user's.
func ListenProcessSocket(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil { //nolint:gosec // local users must reach the socket in it
		return nil, err
	}
	if err := checkSocketDir(dir); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			_ = c.Close()
			return nil, fmt.Errorf("%s: another daemon answers on it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if afterListen != nil {
		afterListen(path)
	}
	if err := chmodSocket(path, 0o666); err != nil { // every local process may report; each report is checked
		_ = ln.Close()
		return nil, err
	}
	return ln, nil
}

// afterListen, when set (by tests), runs between creating the socket and
// opening it to all.
var afterListen func(path string)

// checkSocketDir refuses a socket directory that is a symbolic link, owned
// by another user than root or this one, or writable by others without
// the sticky bit.
func checkSocketDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("socket directory %s is not a directory (%v): a symbolic link is refused", dir, fi.Mode().Type())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int64(st.Uid) != int64(os.Geteuid()) {
		return fmt.Errorf("socket directory %s is owned by uid %d, neither root nor this user", dir, st.Uid)
	}
	if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
		return fmt.Errorf("socket directory %s (mode %v) is writable by others and not sticky: they could replace the socket", dir, fi.Mode())
	}
	return nil
}

// chmodSocket sets the mode of the socket at path, which must be a socket
// of this user's: it opens the path itself (O_PATH|O_NOFOLLOW: a link is
// not followed), checks what it opened, and changes that very file's mode
// through /proc/self/fd (fchmod does not take an O_PATH handle).
func chmodSocket(path string, mode uint32) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer func() { _ = unix.Close(fd) }()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &fs.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK || int64(st.Uid) != int64(os.Geteuid()) {
		return fmt.Errorf("%s was replaced after the daemon created its socket: not changing its mode", path)
	}
	if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), mode); err != nil {
		return &fs.PathError{Op: "chmod", Path: path, Err: err}
	}
	return nil
}

// ProcessServer serves POST /v1/processes (a gpuapi.ProcessReport) on the
// listener of ListenProcessSocket. A report is taken when the kernel's
// word on the sender (its peer credentials) shows that it may speak for
// the process, and the allocator, asked with the sender's bearer token,
// that the token may use the lease and the lease is on this server.
func ProcessServer(d *Daemon) *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/processes", func(w http.ResponseWriter, r *http.Request) {
		if ref := d.takeReport(w, r); ref != nil {
			api.WriteError(w, ref.status, &ref.body)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	srv := httpserver.New(mux, httpserver.Default)
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		cred, err := gpuapi.PeerCredentials(c)
		p := peer{err: err}
		if err == nil && cred.Pid > 0 {
			// As near the connection as can be: the sender, not a later
			// process that took its PID.
			p.pid = int(cred.Pid)
			p.start, p.running = d.startTime(p.pid)
		}
		return context.WithValue(ctx, peerKey{}, p)
	}
	return srv
}

// peerKey keys the sender's peer in a connection's context.
type peerKey struct{}

type peer struct {
	pid int
	err error
	// start is when the sender started (Daemon.startTime) as the daemon
	// accepted its connection; running is false when it had ended.
	start   uint64
	running bool
}

// refusal is a report refused: the status and the body.
type refusal struct {
	status int
	body   api.Error
}

func refuse(status int, reason, field, value, limit, message string) *refusal {
	return &refusal{status: status, body: api.Error{Reason: reason, Message: message, Field: field, Value: value, Limit: limit}}
}

func invalid(field, value, limit string) *refusal {
	e := allocator.FieldError{Field: field, Value: value, Limit: limit}
	return refuse(http.StatusBadRequest, api.ReasonInvalid, field, value, limit, e.Error())
}

// takeReport checks a process report and registers it, or says why not.
func (d *Daemon) takeReport(w http.ResponseWriter, r *http.Request) *refusal {
	sender, _ := r.Context().Value(peerKey{}).(peer)
	if sender.err != nil {
		d.cfg.Log.Error("process report: cannot tell who sent it", "err", sender.err)
		return refuse(http.StatusInternalServerError, api.ReasonInternal, "", "", "", "cannot read the sender's credentials")
	}
	if sender.pid <= 0 {
		return refuse(http.StatusForbidden, api.ReasonForbidden, "", "", "",
			"the sender runs in a PID namespace this daemon cannot see: report from the host's namespace or one below it")
	}
	rep, ref := parseReport(http.MaxBytesReader(w, r.Body, maxReportBody))
	if ref != nil {
		return ref
	}
	if !sender.running {
		return refuse(http.StatusBadRequest, api.ReasonInvalid, "", "", "", fmt.Sprintf("the sender (pid %d) ended before its report was read", sender.pid))
	}
	pid, start := rep.PID, sender.start
	if pid == 0 {
		pid = sender.pid
	} else if pid != sender.pid {
		// Read before the ancestry check, and checked again below: the
		// process checked is the one registered.
		var ok bool
		if start, ok = d.startTime(pid); !ok {
			return noSuchProcess(pid)
		}
	}
	if ref := d.mayReport(sender.pid, pid); ref != nil {
		return ref
	}
	token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if ref := d.checkLease(r.Context(), token, rep.Lease); ref != nil {
		return ref
	}
	// The allocator took a while: the sender, and the process it spoke
	// for, must still be the ones checked, not later ones with their PIDs.
	if now, ok := d.startTime(sender.pid); !ok || now != sender.start {
		return refuse(http.StatusBadRequest, api.ReasonInvalid, "", "", "", fmt.Sprintf("the sender (pid %d) ended before its report was taken", sender.pid))
	}
	if pid != sender.pid {
		if now, ok := d.startTime(pid); !ok || now != start {
			return noSuchProcess(pid)
		}
	}
	var full *registryFullError
	if err := d.registerPID(pid, rep.Lease, start); errors.As(err, &full) {
		return refuse(http.StatusServiceUnavailable, api.ReasonUnavailable, "pid", strconv.Itoa(pid), full.limit,
			err.Error()+"; reports are taken again as reported processes end")
	}
	return nil
}

// pidLimit is the limit of a report's pid.
var pidLimit = fmt.Sprintf("must be a process ID 2..%d, or omitted for the sender itself", maxPID)

// reportBodyLimit is the limit of a report's body as a whole.
const reportBodyLimit = `one JSON object {"pid": N, "lease": "lease-..."}, pid optional`

// parseReport decodes and validates a process report's body, which the
// caller bounds with http.MaxBytesReader.
func parseReport(body io.Reader) (gpuapi.ProcessReport, *refusal) {
	var rep gpuapi.ProcessReport
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	err := dec.Decode(&rep)
	if err == nil {
		// Anything but white space after the object is refused, not
		// ignored: the sender meant something else.
		if _, err = dec.Token(); errors.Is(err, io.EOF) {
			err = nil
		} else if err == nil {
			err = errors.New("more after the JSON object")
		}
	}
	var tooLarge *http.MaxBytesError
	var wrongType *json.UnmarshalTypeError
	switch {
	case errors.As(err, &tooLarge):
		limit := fmt.Sprintf("at most %d bytes", tooLarge.Limit)
		return rep, refuse(http.StatusRequestEntityTooLarge, api.ReasonRequestTooLarge, "", "", limit, "process report larger than "+limit)
	case errors.As(err, &wrongType) && wrongType.Field != "":
		limit := pidLimit
		if wrongType.Field != "pid" {
			limit = "must be a string, the lease ID"
		}
		return rep, invalid(wrongType.Field, wrongType.Value, limit)
	case err != nil && strings.HasPrefix(err.Error(), "json: unknown field "):
		name, _ := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field "))
		return rep, invalid(name, "", "is not a field of a process report (pid, lease)")
	case err != nil:
		return rep, refuse(http.StatusBadRequest, api.ReasonInvalid, "", "", reportBodyLimit, "body is not a process report: "+err.Error())
	}
	if rep.PID < 0 || rep.PID == 1 || rep.PID > maxPID {
		return rep, invalid("pid", strconv.Itoa(rep.PID), pidLimit)
	}
	if !validLeaseID(rep.Lease) {
		return rep, invalid("lease", rep.Lease, fmt.Sprintf("must be a lease ID of 1..%d letters, digits, '.', '_' or '-'", maxLeaseIDLen))
	}
	return rep, nil
}

func validLeaseID(s string) bool { return gpuapi.IsNameToken(s, maxLeaseIDLen) }

// mayReport refuses a report of pid by the process sender unless pid is
// the sender, a descendant of it, or a process of the sender's pod: a
// process speaks for what it started and for its pod, never for another's
// processes, whose use would move to the sender's lease.
func (d *Daemon) mayReport(sender, pid int) *refusal {
	if pid == sender {
		return nil
	}
	value := strconv.Itoa(pid)
	if d.cfg.Parent != nil {
		p := pid
		for range maxAncestry {
			parent, ok := d.cfg.Parent(p)
			if !ok || parent <= 1 {
				break
			}
			if parent == sender {
				return nil
			}
			p = parent
		}
	}
	if d.cfg.PodOf != nil {
		if pod := d.cfg.PodOf(sender); pod != "" && pod == d.cfg.PodOf(pid) {
			return nil
		}
	}
	return refuse(http.StatusForbidden, api.ReasonForbidden, "pid", value, "must be the sender itself, a descendant of it, or a process of its pod",
		fmt.Sprintf("pid %d is not the sender (pid %d), a descendant of it, or a process of its pod", pid, sender))
}

func noSuchProcess(pid int) *refusal {
	value := strconv.Itoa(pid)
	return refuse(http.StatusBadRequest, api.ReasonInvalid, "pid", value, "must be a running process", "pid "+value+": no such process")
}

// checkLease refuses a lease unless the allocator, asked with the sender's
// token, shows it (so the token may use its namespace) on this server.
func (d *Daemon) checkLease(ctx context.Context, token, id string) *refusal {
	server := d.cfg.Inventory.Name
	limit := "must be a live lease on server " + server + " that the bearer token may use"
	cl, err := client.New(d.cfg.AllocatorURLs, token)
	if err != nil {
		d.cfg.Log.Error("process report: no allocator to check the lease with", "err", err)
		return refuse(http.StatusInternalServerError, api.ReasonInternal, "", "", "", "the daemon cannot check leases")
	}
	ctx, cancel := context.WithTimeout(ctx, leaseCheckTimeout)
	defer cancel()
	l, err := cl.Lease(ctx, id)
	switch {
	case client.IsReason(err, api.ReasonNotFound):
		return refuse(http.StatusNotFound, api.ReasonNotFound, "lease", id, limit, "lease "+id+" not found, or the bearer token may not use it")
	case client.IsReason(err, api.ReasonUnauthorized):
		return refuse(http.StatusUnauthorized, api.ReasonUnauthorized, "", "", "", "the allocator refused the bearer token: "+err.Error())
	case err != nil:
		d.cfg.Log.Warn("process report: checking the lease", "lease", id, "err", err)
		return refuse(http.StatusServiceUnavailable, api.ReasonUnavailable, "", "", "", "cannot check the lease with the allocator now; retry")
	case l.Server != server:
		return refuse(http.StatusForbidden, api.ReasonForbidden, "lease", id, limit, fmt.Sprintf("lease %s is on server %s, not %s", id, l.Server, server))
	}
	return nil
}
