package app

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tapflow/tapflow/transport"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestExternalNATSUnreachableRetries: a collector pointed at a NATS that
// is not there keeps retrying with backoff and says so, then connects when
// the server appears. (An agent does not wait: TestAgentStartsDuringOutage.)
func TestExternalNATSUnreachableRetries(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens here yet

	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	cfg := testConfig(t, t.TempDir())
	cfg.NATS.URL = "nats://" + addr
	cfg.Metrics.Listen = ""
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- RunCollector(ctx, cfg, log) }()

	waitLog := func(s string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if strings.Contains(logs.String(), s) {
				return
			}
		}
		t.Fatalf("log never said %q:\n%s", s, logs.String())
	}
	waitLog("NATS unreachable; retrying")

	// Now start the server on that address: the agent connects and runs.
	srv, err := transport.NewEmbedded(t.TempDir(), addr, "late", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	waitLog("connected to NATS")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("collector: %v", err)
	}
}
