package httpserver

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// short are the test's timeouts. net/http falls back to the read timeout
// for an unset header or idle timeout: the read timeout is far longer
// here, so each cut-off shows which timeout made it, however loaded the
// machine (slowBody's read timeout is short, for the body test).
var (
	short    = Timeouts{ReadHeader: 300 * time.Millisecond, Read: 20 * time.Second, Write: 30 * time.Second, Idle: 500 * time.Millisecond}
	slowBody = Timeouts{ReadHeader: 300 * time.Millisecond, Read: 1500 * time.Millisecond, Write: 30 * time.Second, Idle: 20 * time.Second}
)

func serve(t *testing.T, timeouts Timeouts) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	}), timeouts)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// closedWithin writes what, then reports how long the server took to
// close the connection (failing when it did not within limit), and what
// it answered before.
func closedWithin(t *testing.T, addr, what string, limit time.Duration) (time.Duration, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	start := time.Now()
	if _, err := io.WriteString(conn, what); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(start.Add(limit))
	got, err := io.ReadAll(conn)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("after %s the connection is still open (sent %q, got %q)", limit, what, got)
	}
	return time.Since(start), string(got)
}

func TestSlowHeadersAreCutOff(t *testing.T) {
	took, _ := closedWithin(t, serve(t, short), "GET / HTTP/1.1\r\nHost: x\r\n", 15*time.Second)
	if took < short.ReadHeader/2 || took >= short.Read {
		t.Errorf("closed after %s, want about the header timeout %s", took, short.ReadHeader)
	}
}

func TestSlowBodyIsCutOff(t *testing.T) {
	took, got := closedWithin(t, serve(t, slowBody), "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789", 15*time.Second)
	if took < slowBody.Read/2 {
		t.Errorf("closed after %s, before the read timeout %s", took, slowBody.Read)
	}
	if strings.Contains(got, "ok") {
		t.Errorf("a request whose body never came was answered: %q", got)
	}
}

func TestIdleKeepAliveIsClosed(t *testing.T) {
	conn, err := net.Dial("tcp", serve(t, short))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("first request: %s, close %v; want 200 on a kept-alive connection", resp.Status, resp.Close)
	}
	idle := time.Now()
	_ = conn.SetReadDeadline(idle.Add(15 * time.Second))
	if _, err := r.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection: read %v, want the server to close it (EOF)", err)
	}
	if took := time.Since(idle); took < short.Idle/2 || took >= short.Read {
		t.Errorf("idle connection closed after %s, want about the idle timeout %s", took, short.Idle)
	}
}

// TestDefault: every phase is bounded, and a scrape has longer to answer
// than Prometheus waits by default.
func TestDefault(t *testing.T) {
	srv := New(http.NotFoundHandler(), Default)
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout < srv.ReadHeaderTimeout || srv.IdleTimeout <= 0 {
		t.Errorf("read header %s, read %s, idle %s: each must be set, read at least read header",
			srv.ReadHeaderTimeout, srv.ReadTimeout, srv.IdleTimeout)
	}
	if srv.WriteTimeout < 10*time.Second {
		t.Errorf("write timeout %s is shorter than Prometheus's default scrape timeout, 10s", srv.WriteTimeout)
	}
}
