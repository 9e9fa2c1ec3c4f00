package transport_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/transport"
)

type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Write(p) }
func (l *logBuf) String() string              { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestConnectBackground: with nothing listening, ConnectBackground returns
// a connection at once, a JetStream publish on it fails fast (no client
// buffer: the agent spools instead of waiting publish_timeout per batch),
// and once a server appears on the address the connection comes up by
// itself and publishes succeed.
func TestConnectBackground(t *testing.T) {
	addr := freeAddr(t)
	cfg := transport.DefaultConfig()
	cfg.URL = "nats://" + addr
	var logs logBuf
	log := slog.New(slog.NewTextHandler(&logs, nil))
	start := time.Now()
	nc, err := transport.ConnectBackground(cfg, "agent", log, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("ConnectBackground blocked %s with NATS down", d)
	}
	if !strings.Contains(logs.String(), "NATS unreachable at start") {
		t.Errorf("no outage line in the log:\n%s", logs.String())
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start = time.Now()
	_, err = js.PublishMsg(ctx, &nats.Msg{Subject: transport.FlowsSubject("n"), Data: []byte("x")})
	if err == nil {
		t.Fatal("publish succeeded with no server")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("publish on a not yet connected conn took %s (err %v): it must fail fast", d, err)
	}
	t.Logf("publish while down failed after %s: %v", time.Since(start), err)

	srv, err := transport.NewEmbedded(t.TempDir(), addr, "late", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for deadline := time.Now().Add(20 * time.Second); !nc.IsConnected(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("connection did not come up after the server started")
		}
	}
	if err := transport.EnsureStreams(ctx, js, cfg, log); err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: transport.FlowsSubject("n"), Data: []byte("x")}); err != nil {
		t.Fatalf("publish once connected: %v", err)
	}
	if !strings.Contains(logs.String(), "connected to NATS") {
		t.Errorf("no connected line in the log:\n%s", logs.String())
	}
}
