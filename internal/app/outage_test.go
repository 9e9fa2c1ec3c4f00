package app

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/obs"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/transport"
)

// gathered returns the first sample of metric name in reg (counter or
// gauge) and whether it is there at all.
func gathered(t *testing.T, reg prometheus.Gatherer, name string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.GetMetric()) == 0 {
			continue
		}
		m := mf.GetMetric()[0]
		if m.GetCounter() != nil {
			return m.GetCounter().GetValue(), true
		}
		return m.GetGauge().GetValue(), true
	}
	return 0, false
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens here until the test starts NATS
	return addr
}

func poll(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
	}
}

// TestAgentStartsDuringOutage (issue 11 item 8): an agent started while
// its external NATS is down captures from its first second — the source
// runs and batches go to the spool — and once a nats-server appears on
// that address the agent connects, creates the streams, replays the
// spool, and a collector writes every generated record to Parquet exactly
// once.
func TestAgentStartsDuringOutage(t *testing.T) {
	addr := freeLoopbackAddr(t)
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.NATS.URL = "nats://" + addr
	cfg.NATS.PublishTimeout = units.Duration(2 * time.Second) // the test is about the outage: a publish fails (and spools) in 2s
	cfg.Metrics.Listen = ""
	// A graceful stop publishes every batch still queued in the pipeline;
	// on a loaded CI box (-race, the lab and OpenStack phases beside it)
	// that took over 20 s at 20k records/s, the hard stop then failed the
	// rest. The test is about the outage, not shutdown speed: a gentler
	// rate and a longer drain keep it exact.
	cfg.Synthetic.RecordsPerSecond = 8000
	cfg.Agent.ShutdownTimeout = units.Duration(90 * time.Second)
	logs := &logSink{}
	log := slog.New(logs)

	ctx, stopAgent := context.WithCancel(context.Background())
	defer stopAgent()
	regc := make(chan *obs.Registry, 1)
	c := &counter{}
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		done <- withRuntime(ctx, cfg, log, "agent", natsInBackground, func(ctx context.Context, rt *runtime) error {
			a, err := newAgent(cfg, rt)
			if err != nil {
				return err
			}
			// The graceful stop publishes what the edges hold; under load
			// the publisher is slower than the source, so every edge is
			// full at the stop. At load 30 (-race, a collector in the same
			// process) that was ~60 batches at ~1.5 s each: over the 90 s
			// drain. Edges of 2 bound the stop to ~10 batches.
			a.runner, err = pipeline.NewRunner(pipeline.Config{Name: "agent", EdgeCapacity: 2, ShutdownTimeout: cfg.Agent.ShutdownTimeout.D()},
				a.source, []pipeline.Transform{a.engine, c}, a.sink, nil, log)
			if err != nil {
				return err
			}
			regc <- rt.reg
			return a.Run(ctx)
		})
	}()
	var reg *obs.Registry
	select {
	case reg = <-regc:
	case err := <-done:
		t.Fatalf("agent did not start while NATS is down: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("agent blocked at start while NATS is down")
	}
	poll(t, "batches in the spool while NATS is down", 30*time.Second, func() bool {
		v, _ := gathered(t, reg, "tapflow_spool_appended_batches_total")
		return v >= 5
	})
	firstSpooled := time.Since(start)
	if l := logs.find("NATS unreachable at start"); l == "" {
		t.Error("no log line says NATS is unreachable at start")
	}
	time.Sleep(time.Second) // capture keeps running into the spool
	spooledDown, _ := gathered(t, reg, "tapflow_spool_appended_batches_total")
	recordsDown := c.records.Load()

	// NATS appears on that address.
	srv, err := transport.NewEmbedded(t.TempDir(), addr, "late", quiet)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	nc, err := srv.Connect("test", quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The agent creates the streams once it is connected.
	poll(t, "the agent to create the streams", 60*time.Second, func() bool {
		_, err := js.Stream(context.Background(), transport.FlowsStream)
		return err == nil
	})
	t.Logf("streams created %s after start", time.Since(start).Round(time.Millisecond))
	collCtx, stopCollector := context.WithCancel(context.Background())
	defer stopCollector()
	collDone := make(chan error, 1)
	go func() { collDone <- runCollector(t, collCtx, cfg, js, true) }()
	poll(t, "the spool to be replayed", 60*time.Second, func() bool {
		replayed, _ := gathered(t, reg, "tapflow_spool_replayed_batches_total")
		entries, _ := gathered(t, reg, "tapflow_spool_entries")
		return replayed >= spooledDown && entries == 0
	})
	t.Logf("spool replayed %s after start", time.Since(start).Round(time.Millisecond))
	time.Sleep(time.Second) // and straight publishes again
	stopAgent()
	if err := <-done; err != nil {
		t.Fatalf("agent: %v", err)
	}
	t.Logf("agent stopped %s after start", time.Since(start).Round(time.Millisecond))
	// Everything the agent published is consumed and acked before the
	// collector stops (its drain has a timeout; a slow CI box must not
	// turn into a false loss).
	cons, err := js.Consumer(context.Background(), transport.FlowsStream, cfg.Collector.Consumer.Durable)
	if err != nil {
		t.Fatal(err)
	}
	poll(t, "the collector to ack everything", 60*time.Second, func() bool {
		info, err := cons.Info(context.Background())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	stopCollector()
	if err := <-collDone; err != nil {
		t.Fatalf("collector: %v", err)
	}
	if l := logs.find("connected to NATS"); l == "" {
		t.Error("no log line says the agent connected")
	}
	for _, name := range []string{"tapflow_spool_dropped_records_total"} {
		if v, _ := gathered(t, reg, name); v != 0 {
			t.Errorf("%s = %v", name, v)
		}
	}
	rows := readParquet(t, dir)
	if t.Failed() || int64(len(rows)) != c.records.Load() {
		logs.mu.Lock()
		for _, l := range logs.lines {
			if !strings.HasPrefix(l, "INFO") && !strings.HasPrefix(l, "DEBUG") {
				t.Log(l)
			}
		}
		logs.mu.Unlock()
		for _, n := range []string{"tapflow_publish_batches_total", "tapflow_publish_records_total", "tapflow_spool_appended_batches_total", "tapflow_spool_replayed_batches_total", "tapflow_publish_duplicates_total"} {
			v, _ := gathered(t, reg, n)
			t.Logf("%s %v", n, v)
		}
	}
	checkExact(t, rows, c)
	t.Logf("first 5 batches spooled %s after start; %d records (%v batches) captured while NATS was down; %d records in Parquet, each once",
		firstSpooled.Round(time.Millisecond), recordsDown, spooledDown, len(rows))
}
