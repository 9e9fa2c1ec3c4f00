package publish_test

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/publish"
	"github.com/tapflow/tapflow/transport/publish/spool"
)

// TestReplayBeforeTheFirstConnect: an agent's connection that has never
// reached a server (transport.ConnectBackground, NATS down at start, or
// a listener that accepts and never speaks NATS) has no server INFO, and
// nats.go refuses a publish with headers on it as "headers not supported
// by this server". The replayer must not publish on it at all: it waits
// (no failed attempt, no backoff), and once the real nats-server appears
// on that address every spooled batch reaches the stream once, in order.
// Before the fix the replayer published at once and failed with
// ErrHeadersNotSupported (tapflow_publish_retries_total > 0 while the
// connection was down, backoff grown to 5 s by the time NATS answered).
func TestReplayBeforeTheFirstConnect(t *testing.T) {
	for _, tc := range []struct {
		name string
		// down occupies addr until the real server should appear; the
		// returned func frees it.
		down func(t *testing.T, addr string) func()
	}{
		{"nothing listens", func(*testing.T, string) func() { return func() {} }},
		{"a listener accepts and stalls", func(t *testing.T, addr string) func() {
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			var conns []net.Conn
			accepted := make(chan struct{})
			go func() {
				defer close(accepted)
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					conns = append(conns, c) // held open, never a byte of INFO
				}
			}()
			return func() {
				ln.Close()
				<-accepted
				for _, c := range conns {
					c.Close()
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close()
			free := tc.down(t, addr)

			logs := &logBuffer{}
			log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			cfg := transport.DefaultConfig()
			cfg.URL = "nats://" + addr
			cfg.PublishTimeout = units.Duration(2 * time.Second)
			nc, err := transport.ConnectBackground(cfg, "agent", log, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			js, _ := jetstream.New(nc)
			dir := t.TempDir()
			scfg := spool.DefaultConfig()
			scfg.Dir, scfg.MaxBytes = dir+"/spool", 64<<20
			sp, err := spool.New(scfg, spool.Options{Logger: log, Registry: prometheus.NewRegistry()})
			if err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewRegistry()
			pub, err := publish.New(js, publish.Options{AgentID: "agent-a", Node: "cmp1", StateDir: dir, NATS: cfg, Logger: log, Registry: reg, Spool: sp})
			if err != nil {
				t.Fatal(err)
			}
			a := &agent{pub: pub, sp: sp, in: make(chan *pipeline.Batch, 4), done: make(chan error, 1)}
			go func() { a.done <- pub.Run(t.Context(), a.in) }()

			const batches, size = 30, 200
			a.send(batches, size, 0, 0)
			waitFor(t, "every batch in the spool", func() bool { return testutil.ToFloat64(sp.Metrics().Appended) == batches })
			// The replayer has looked at the first entry once it says it
			// waits, or once it made an attempt (the bug).
			retries := func() float64 { v, _ := gathered(t, reg, "tapflow_publish_retries_total", nil); return v }
			waitFor(t, "the replayer to look at the spool", func() bool {
				return logs.line("spool replay: NATS not connected") != "" || retries() > 0
			})
			if nc.IsConnected() {
				t.Fatal("connected although no nats-server runs")
			}
			if v := retries(); v != 0 {
				t.Fatalf("%v publish attempts on a connection that never reached a server; want none (log: %s)", v, logs.line("publish failed"))
			}

			free()
			s := transporttest.Listen(t, "", addr)
			if err := transport.EnsureStreams(t.Context(), s.JS, cfg, slog.New(slog.DiscardHandler)); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the spool to be replayed", sp.Empty)
			a.stop(t)
			if l := logs.line("headers not supported"); l != "" {
				t.Errorf("a publish went out on a connection without server INFO: %s", l)
			}
			if a.lost.Load() != 0 {
				t.Fatalf("%d records lost", a.lost.Load())
			}
			if r := testutil.ToFloat64(sp.Metrics().Replayed); r != batches {
				t.Fatalf("replayed %v of %d spooled batches", r, batches)
			}
			seen := checkStream(t, readStream(t, s))
			if len(seen) != batches*size {
				t.Fatalf("stream holds %d records, want %d", len(seen), batches*size)
			}
		})
	}
}
