package main

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// silentServer accepts TCP connections and never writes a byte: a NATS
// port behind a hung proxy, or some other service's port.
func silentServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// TestCLIFailsFastOnSilentNATS: every client command that connects to
// NATS gives up within 5 s (its default --timeout is 30 s) on a server
// that accepts TCP and never answers, and says which server and what to
// check.
func TestCLIFailsFastOnSilentNATS(t *testing.T) {
	addr := silentServer(t)
	url := "nats://" + addr
	for _, args := range [][]string{
		{"dlq", "inspect", "--nats-url", url},
		{"dlq", "replay", "--nats-url", url},
		{"dlq", "replay", "--dry-run", "--nats-url", url},
		{"tap", "--nats-url", url},
	} {
		t.Run(strings.Join(args[:len(args)-2], " "), func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			code, _, stderr := runCLI(args...)
			took := time.Since(start)
			if took > 5*time.Second {
				t.Errorf("failed after %s, want within 5s", took.Round(time.Millisecond))
			}
			if code == exitOK {
				t.Fatalf("exit 0 against a silent server; stderr %q", stderr)
			}
			for _, want := range []string{url, "no NATS server answered within 4s", "client port"} {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr does not say %q:\n%s", want, stderr)
				}
			}
			t.Logf("exit %d after %s", code, took.Round(time.Millisecond))
		})
	}
}
