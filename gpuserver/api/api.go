// Package api holds the GPU-server daemon's wire types and the small
// clients of its three services, shared by the daemon (gpuserver) and its
// readers (the adapter's direct backend, `gpupool run`), which need not
// link the daemon's telemetry sources:
//
//	GET  /v1/usage      over TCP: the latest sampling round per GPU and lease (Usage; FetchUsage)
//	POST /v1/processes  over the Unix socket: a process runs under a lease (ProcessReport; ReportProcess)
//	the probe port      a TCP ping-echo exchange on the data path (DialProbe; bitfusion_rdma_latency_seconds)
package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	allocapi "github.com/gpupool/gpupool/allocator/api"
)

// LabelDaemonURL is the server label (set at registration) that tells
// clients where the server's daemon answers GET /v1/usage.
const LabelDaemonURL = "gpupool.io/daemon-url"

// LabelProcessSocket is the server label that names the Unix socket, a
// path on the server's host, where its daemon takes process reports.
const LabelProcessSocket = "gpupool.io/process-socket"

// ProcessReport is what `gpupool run` tells the daemon: a process runs
// under this lease, and so do its descendants.
type ProcessReport struct {
	// PID is the process, in the daemon's PID namespace; omitted (0) it is
	// the reporter itself, as the socket's peer credentials tell, which
	// is right from a container too.
	PID   int    `json:"pid,omitempty"`
	Lease string `json:"lease"`
}

// ReportProcess sends r to the daemon's process socket, with the
// allocator bearer token that may use the lease ("" when the allocator
// runs without tokens). A refusal is an *allocapi.Error.
//
// The token goes to whatever listens on the socket, and the socket's path
// comes from a server label, so ReportProcess first checks that the path
// is a socket, not a symbolic link, owned by root or by this process's own
// user; and, once connected, that the process listening on it runs as one
// of them too (its peer credentials), which a socket swapped in between
// the check and the dial cannot fake. A socket another local user planted
// (or a link to one) would otherwise collect the token and could use the
// lease's namespace with it: such a socket is refused, with nothing sent.
func ReportProcess(ctx context.Context, socket, token string, r ProcessReport) error {
	body, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := checkSocket(socket); err != nil {
		return err
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", socket)
		if err != nil {
			return nil, err
		}
		if err := checkListener(c, socket); err != nil {
			_ = c.Close()
			return nil, err
		}
		return c, nil
	}}
	defer tr.CloseIdleConnections()
	// The host is a placeholder: the transport dials the socket.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://gpupool-server/v1/processes", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return failure(resp)
	}
	return nil
}

// FetchUsage reads a daemon's latest sampling round (GET /v1/usage) from
// daemonURL, the server's LabelDaemonURL, through hc.
func FetchUsage(ctx context.Context, hc *http.Client, daemonURL string) (*Usage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(daemonURL, "/")+"/v1/usage", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, failure(resp)
	}
	var u Usage
	if err := json.NewDecoder(resp.Body).Decode(&u); err != nil {
		return nil, fmt.Errorf("decoding the daemon's usage: %w", err)
	}
	return &u, nil
}

// failure is a daemon's refusal: the *allocapi.Error it answered with, or
// its HTTP status when the body is none.
func failure(resp *http.Response) error {
	e := &allocapi.Error{}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(e); err != nil || e.Reason == "" {
		return fmt.Errorf("daemon answered %s", resp.Status)
	}
	return e
}

// trustedUID reports whether a daemon's socket (or the process listening
// on it) may be owned by uid: root's, or this process's own user's.
func trustedUID(uid uint32) bool { return uid == 0 || int64(uid) == int64(os.Getuid()) }

// checkSocket refuses a process socket that is not a socket (a symbolic
// link included) owned by root or by this process's user.
func checkSocket(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("process socket: %w", err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("process socket %s is a symbolic link, not the daemon's socket: not sending the bearer token there", path)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("process socket %s is not a socket (%v): not sending the bearer token there", path, fi.Mode().Type())
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("process socket %s: cannot tell its owner: not sending the bearer token there", path)
	}
	if !trustedUID(st.Uid) {
		return fmt.Errorf("process socket %s is owned by uid %d, neither root nor this user (uid %d): not sending the bearer token there", path, st.Uid, os.Getuid())
	}
	return nil
}

// checkListener refuses a connection whose listening process (as of
// listen(2), in the kernel's word) runs as neither root nor this user.
func checkListener(c net.Conn, path string) error {
	cred, err := PeerCredentials(c)
	if err != nil {
		return fmt.Errorf("process socket %s: %w", path, err)
	}
	if !trustedUID(cred.Uid) {
		return fmt.Errorf("process socket %s is served by uid %d, neither root nor this user (uid %d): not sending the bearer token there", path, cred.Uid, os.Getuid())
	}
	return nil
}

// LabelName makes a pod label key a Prometheus label name (anything but
// letters and digits becomes _); the daemon's per-lease series carry the
// allowlisted pod labels as label_<LabelName(key)>, as kube-state-metrics
// names them, and PromQL written from a label selector must match that.
func LabelName(key string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, key)
}

// Usage is what a GPU server's leases and GPUs use, as of its latest
// sampling round.
type Usage struct {
	Server string `json:"server"`
	// SampledAt is when the oldest of the daemon's sources last read its
	// GPUs successfully: every value below is at least this fresh. Zero
	// before the first good round.
	SampledAt time.Time    `json:"sampledAt"`
	GPUs      []GPUUsage   `json:"gpus"`
	Leases    []LeaseUsage `json:"leases"`
	// Latency is the round trips the daemon measured over the window.
	Latency []LatencyWindow `json:"latency,omitempty"`
}

// GPUUsage is one GPU's reading; nil values are readings the source does
// not offer.
type GPUUsage struct {
	Index           int      `json:"index"`
	UUID            string   `json:"uuid"`
	Model           string   `json:"model"`
	Healthy         bool     `json:"healthy"`
	Utilization     *float64 `json:"utilization,omitempty"`
	MemoryUsedBytes int64    `json:"memoryUsedBytes"`
	MemoryBytes     int64    `json:"memoryBytes"`
}

// LeaseGPU names one lease's share of one GPU: the key of what the
// daemon measures and the adapter reads.
type LeaseGPU struct {
	Lease string
	GPU   int
}

// Key is the lease and GPU u is about.
func (u *LeaseUsage) Key() LeaseGPU { return LeaseGPU{u.Lease, u.GPU} }

// LeaseUsage is what one lease's processes use of one GPU it holds.
type LeaseUsage struct {
	Lease     string `json:"lease"`
	Namespace string `json:"namespace"`
	GPU       int    `json:"gpu"`
	// Milli is the share granted, in milli-GPUs (allocator.Share);
	// SMUtilization the processes' share of the GPU's SM time (0..1), nil
	// when the source cannot tell.
	Milli              int32    `json:"milli"`
	SMUtilization      *float64 `json:"smUtilization,omitempty"`
	MemoryUsedBytes    int64    `json:"memoryUsedBytes"`
	MemoryGrantedBytes int64    `json:"memoryGrantedBytes"`
	Processes          int      `json:"processes"`
}

// LatencyWindow counts the round trips of one transport measured during
// the window, in the buckets of bitfusion_rdma_latency_seconds.
type LatencyWindow struct {
	Transport string        `json:"transport"`
	Window    time.Duration `json:"window"`
	// Buckets are the finite buckets; Count is every round trip (the
	// +Inf bucket, which JSON cannot write).
	Buckets []Bucket `json:"buckets"`
	Count   uint64   `json:"count"`
}

// Bucket is a histogram bucket: Count observations at most UpperBound
// seconds (cumulative across buckets, as in Prometheus).
type Bucket struct {
	UpperBound float64 `json:"upperBound"`
	Count      uint64  `json:"count"`
}

// PeerCredentials reads who is at the other end of a Unix socket
// connection (SO_PEERCRED): the kernel's word, as of connect(2) or
// listen(2), with the PID in the reader's PID namespace (0 when the peer's
// namespace is not visible from it).
func PeerCredentials(c net.Conn) (*unix.Ucred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("not a Unix socket connection but %s", c.LocalAddr().Network())
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if credErr != nil {
		return nil, fmt.Errorf("reading the peer credentials: %w", credErr)
	}
	return cred, nil
}
