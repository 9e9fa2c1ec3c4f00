package publish_test

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/testkit/chaos"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/publish"
	"github.com/tapflow/tapflow/transport/publish/spool"
)

// TestResendAfterServerRestart: the agent publishes without pause while
// Debian 12's nats-server (2.9.10, as an operator runs it) is restarted
// gracefully again and again, the streams created as tapflow creates them
// (interest retention) with the collector's durable consumer, which
// consumes nothing here. Every batch JetStream acknowledged is in the
// stream afterwards. That server acknowledged messages in the last
// milliseconds of its shutdown that were gone after the restart (about
// one restart in seven with a publisher at full speed, stop 33); the
// publisher publishes again what was acknowledged just before the
// connection was lost, and the stream drops what it did keep as
// duplicates.
func TestResendAfterServerRestart(t *testing.T) {
	bin, version := chaos.DebianNATS(t)
	const restarts = 16
	for _, tc := range []struct {
		name  string
		spool bool
	}{{"with the spool (flows, the default)", true}, {"without a spool (meters)", false}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			srv, err := chaos.NewStockNATS(bin, filepath.Join(dir, "nats"), filepath.Join(dir, "nats.log"))
			if err != nil {
				t.Fatal(err)
			}
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = srv.Close() })
			cfg := transport.DefaultConfig()
			cfg.URL = "nats://" + srv.Addr()
			// Shorter than the default (so a publish stuck on a stopping
			// server gives way to the spool within a restart cycle).
			cfg.PublishTimeout = units.Duration(500 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			nc, err := transport.Connect(ctx, cfg, "agent", quiet)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			js, _ := jetstream.New(nc)
			if err := transport.EnsureStreams(ctx, js, cfg, quiet); err != nil {
				t.Fatal(err)
			}
			cc := transport.CollectorConsumerConfigs(transport.DefaultCollectorConsumer())[transport.FlowsStream]
			if _, err := js.CreateOrUpdateConsumer(ctx, transport.FlowsStream, *cc); err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewRegistry()
			opts := publish.Options{AgentID: "agent-r", Node: "cmp1", StateDir: dir, NATS: cfg, Logger: quiet, Registry: reg}
			if tc.spool {
				scfg := spool.DefaultConfig()
				scfg.Dir = filepath.Join(dir, "spool")
				if opts.Spool, err = spool.New(scfg, spool.Options{Logger: quiet, Registry: prometheus.NewRegistry()}); err != nil {
					t.Fatal(err)
				}
			}
			pub, err := publish.New(js, opts)
			if err != nil {
				t.Fatal(err)
			}
			jsAcked := func() float64 { // batches JetStream acknowledged, replays included
				n, ok := gathered(t, reg, "tapflow_publish_batches_total", nil)
				if !ok {
					t.Fatal("no tapflow_publish_batches_total")
				}
				return n
			}
			in := make(chan *pipeline.Batch)
			done := make(chan error, 1)
			go func() { done <- pub.Run(context.Background(), in) }()

			seed := uint64(time.Now().UnixNano())
			rng := rand.New(rand.NewPCG(seed, 3))    // the restarts' timing
			recRng := rand.New(rand.NewPCG(seed, 4)) // the records (the feeder's own)
			var mu sync.Mutex
			acked := map[int64]bool{} // batch_seq of every batch acked nil
			stop := make(chan struct{})
			fed := make(chan struct{})
			go func() { // batches back to back: acks land in the server's last milliseconds
				defer close(fed)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					// The size of the chaos test's batches, as incompressible:
					// the loss was likelier with larger messages.
					recs := make([]schemas.Flow, 400)
					for j := range recs {
						recs[j] = schemas.Flow{Bytes: recRng.Int64(), Packets: recRng.Int64(), TimeStart: recRng.Int64(), TenantID: "t1", Direction: "tx"}
					}
					var b *pipeline.Batch
					b = pipeline.NewBatch(recs, func(err error) {
						if err == nil {
							mu.Lock()
							acked[b.Seq] = true
							mu.Unlock()
						}
					})
					in <- b
				}
			}()
			// Each restart lands in a burst of publishes, as in the chaos
			// run that lost batches: while the server is down the batches
			// wait (in the spool, or in memory); once the connection is back
			// they go out back to back, and the server is stopped a few
			// acknowledgements into that.
			for range restarts {
				srv.Stop()
				time.Sleep(300 * time.Millisecond)
				before := nc.Stats().Reconnects
				if err := srv.Start(); err != nil {
					t.Fatal(err)
				}
				for deadline := time.Now().Add(10 * time.Second); nc.Stats().Reconnects == before || !nc.IsConnected(); time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the agent did not reconnect in 10 s")
					}
				}
				// Stop a few JetStream acknowledgements into the burst:
				// counted by the publisher, not by the batches' acks (with
				// the spool a batch is acked once spooled, so under load
				// the server was stopped before anything reached it on the
				// new connection and nothing was there to publish again).
				want := jsAcked() + 1 + float64(rng.IntN(8))
				for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
					n := jsAcked()
					if n >= want {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("JetStream acknowledged %v of %v batches in 20 s after reconnecting", n, want)
					}
				}
			}
			time.Sleep(500 * time.Millisecond)
			close(stop)
			<-fed
			close(in)
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("publisher did not stop")
			}

			stored := storedBatchSeqs(t, js)
			mu.Lock()
			defer mu.Unlock()
			var missing []int64
			for seq := range acked {
				if !stored[seq] {
					missing = append(missing, seq)
				}
			}
			resent, ok := gathered(t, reg, "tapflow_publish_resent_total", nil)
			if !ok {
				t.Fatal("no tapflow_publish_resent_total")
			}
			t.Logf("nats-server %s, %d graceful restarts: %d batches acknowledged, %d in the stream, %d published again after a reconnect",
				version, restarts, len(acked), len(stored), int(resent))
			if len(missing) > 0 {
				t.Fatalf("%d acknowledged batches not in the stream: batch_seqs %v (nats log %s)", len(missing), missing, srv.LogPath())
			}
			if resent == 0 {
				t.Fatalf("nothing published again after %d reconnects", restarts)
			}
		})
	}
}

// storedBatchSeqs reads the batch_seq (from Nats-Msg-Id) of every message
// TAPFLOW_FLOWS holds.
func storedBatchSeqs(t *testing.T, js jetstream.JetStream) map[int64]bool {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, transport.FlowsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]bool{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue // a sequence the server lost (or never stored)
		}
		id := m.Header.Get(jetstream.MsgIDHeader)
		bs, err := strconv.ParseInt(id[strings.LastIndexByte(id, '-')+1:], 10, 64)
		if err != nil {
			t.Fatalf("msg id %q: %v", id, err)
		}
		out[bs] = true
	}
	return out
}
