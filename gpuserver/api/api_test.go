package api

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	allocapi "github.com/gpupool/gpupool/allocator/api"
)

// serveSocket serves 204 to every request on a Unix socket in a fresh
// directory, and counts the requests that carried a bearer token.
func serveSocket(t *testing.T) (path string, tokens func() int) {
	t.Helper()
	// A short directory: a socket path has at most 107 bytes.
	dir, err := os.MkdirTemp("", "gpupool")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	path = filepath.Join(dir, "d.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{}, 100)
	srv := &http.Server{ReadHeaderTimeout: time.Minute, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
			got <- struct{}{}
		}
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return path, func() int { return len(got) }
}

func report(socket string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return ReportProcess(ctx, socket, "secret", ProcessReport{Lease: "lease-000001"})
}

// TestReportProcessSendsTheTokenOnlyToATrustedSocket: the bearer token
// goes to a socket of this user's (or root's), never through a symbolic
// link, to a file that is no socket, or to another user's socket.
func TestReportProcessSendsTheTokenOnlyToATrustedSocket(t *testing.T) {
	socket, tokens := serveSocket(t)
	if err := report(socket); err != nil {
		t.Fatalf("a socket of this user's: %v", err)
	}
	if tokens() != 1 {
		t.Fatalf("the daemon got %d tokens, want 1", tokens())
	}

	link := filepath.Join(filepath.Dir(socket), "link.sock")
	if err := os.Symlink(socket, link); err != nil {
		t.Fatal(err)
	}
	if err := report(link); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("a symbolic link to the socket: %v, want refused as a link", err)
	}
	file := filepath.Join(filepath.Dir(socket), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := report(file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("a regular file: %v, want refused as no socket", err)
	}
	if tokens() != 1 {
		t.Errorf("the token was sent %d times, want only to the trusted socket", tokens())
	}

	if os.Getuid() != 0 {
		t.Skip("a socket of another user's needs root to make (os.Chown): not tested")
	}
	if err := os.Chown(socket, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := report(socket); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Errorf("a socket of uid 65534's: %v, want refused", err)
	}
	if tokens() != 1 {
		t.Errorf("the token was sent %d times, want only to the trusted socket", tokens())
	}
}

// TestFetchUsage: the daemon's round comes back decoded; a refusal comes
// back as the daemon's error, or its status when it sent no error body.
func TestFetchUsage(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ok/v1/usage", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(Usage{Server: "gpu-a", Leases: []LeaseUsage{{Lease: "lease-1", GPU: 1, Milli: 500}}})
	})
	mux.HandleFunc("GET /refusing/v1/usage", func(w http.ResponseWriter, _ *http.Request) {
		allocapi.WriteError(w, http.StatusServiceUnavailable, &allocapi.Error{Reason: allocapi.ReasonUnavailable, Message: "not sampled yet"})
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx := context.Background()

	u, err := FetchUsage(ctx, srv.Client(), srv.URL+"/ok/")
	if err != nil {
		t.Fatal(err)
	}
	if u.Server != "gpu-a" || len(u.Leases) != 1 || u.Leases[0] != (LeaseUsage{Lease: "lease-1", GPU: 1, Milli: 500}) {
		t.Errorf("usage = %+v", u)
	}
	var refusal *allocapi.Error
	if _, err := FetchUsage(ctx, srv.Client(), srv.URL+"/refusing"); !errors.As(err, &refusal) || refusal.Message != "not sampled yet" {
		t.Errorf("a refusal: %v, want the daemon's error", err)
	}
	if _, err := FetchUsage(ctx, srv.Client(), srv.URL+"/gone"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("no such page: %v, want the status", err)
	}
}
