// Package transporttest starts a real embedded nats-server with JetStream for
// tests: in-process, store in t.TempDir(), streams created, shut down in
// t.Cleanup.
package transporttest

import (
	"context"
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/transport"
)

// Server is a running embedded server with a client connection.
type Server struct {
	*transport.Embedded
	NC  *nats.Conn
	JS  jetstream.JetStream
	Dir string
}

// Run starts a server storing in dir (t.TempDir() when empty) listening on
// a random loopback port, and creates the tapflow streams.
func Run(t testing.TB, dir string) *Server {
	t.Helper()
	s := Listen(t, dir, "127.0.0.1:0")
	if err := transport.EnsureStreams(context.Background(), s.JS, transport.DefaultConfig(), slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	return s
}

// Listen starts a server storing in dir (t.TempDir() when empty) on addr
// and creates no streams: for a process under test that connects before
// the server exists and creates them itself.
func Listen(t testing.TB, dir, addr string) *Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	log := slog.New(slog.DiscardHandler)
	e, err := transport.NewEmbedded(dir, addr, "test", log)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	nc, err := e.Connect("test", log)
	if err != nil {
		_ = e.Close()
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Embedded: e, NC: nc, JS: js, Dir: dir}
	t.Cleanup(func() { nc.Close(); _ = e.Close() })
	return s
}
