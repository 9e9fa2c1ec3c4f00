package consume_test

import (
	"context"
	"crypto/rand"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
	"github.com/tapflow/tapflow/transport/dlq"
)

// TestDLQOneSenderCannotEvictAnother is issue 25's attack against a real
// server: agent cmp2 has 3 batches dead-lettered for clock skew (the only
// copy of their records), then agent cmp1 publishes 40 MiB of garbage on
// its own subject: 10 times the DLQ and 16 times its own letter bound. cmp2's 3 letters survive
// whole; cmp1 keeps its newest collector.dlq_letters_per_node letters;
// the 30 it lost are counted (tapflow_consume_dlq_evictions_total, 0 at
// start) and tallied for cmp1 alone (dlq.Evictions, what `tapflow dlq
// inspect` prints); no dead-letter publish failed. Run with the shipped
// stream config (discard new) and with a DLQ an older tapflow left with
// discard old (a collector with nats.manage_streams: false never updates
// it): the per-sender bound alone protects cmp2 in both.
//
// Deviations from the shipped defaults, so the flood takes seconds under
// -race on a shared box: nats.dlq_max_bytes 4MiB (default 1GiB) and
// collector.dlq_letters_per_node 10 (default 100) with 256 KiB garbage
// messages: one sender's bound (2.5 MiB) is below the DLQ size, as the
// defaults' is (100 × the 8 MiB max payload = 800 MiB < 1 GiB).
func TestDLQOneSenderCannotEvictAnother(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: floods 40 MiB through a real server")
	}
	const (
		dlqMax    = 4 << 20
		perNode   = 10
		garbage   = 160
		msgSize   = 256 << 10
		skewed    = 3
		skewedRec = 20
	)
	for _, tc := range []struct {
		name    string
		discard js.DiscardPolicy
	}{
		{"shipped stream config", js.DiscardNew},
		{"DLQ left with discard old", js.DiscardOld},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := transporttest.Listen(t, "", "127.0.0.1:0")
			ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
			defer cancel()
			ncfg := transport.DefaultConfig()
			ncfg.DLQMaxBytes = dlqMax
			if err := transport.EnsureStreams(ctx, s.JS, ncfg, slog.New(slog.DiscardHandler)); err != nil {
				t.Fatal(err)
			}
			st, err := s.JS.Stream(ctx, transport.DLQStream)
			if err != nil {
				t.Fatal(err)
			}
			if sc := st.CachedInfo().Config; sc.Discard != tc.discard {
				sc.Discard = tc.discard
				if _, err := s.JS.UpdateStream(ctx, sc); err != nil {
					t.Fatal(err)
				}
			}

			cfg := consume.DefaultConfig()
			cfg.AckWait = units.Duration(10 * time.Second)
			cfg.DLQLettersPerNode = perNode
			reg := prometheus.NewRegistry()
			src, err := consume.New(s.JS, cfg, consume.Options{Logger: quiet, Registry: reg})
			if err != nil {
				t.Fatal(err)
			}
			evictions := func() float64 { return gaugeOrCounter(t, reg, "tapflow_consume_dlq_evictions_total") }
			if e := evictions(); e != 0 {
				t.Fatalf("evictions %v at start, want 0", e)
			}
			out := make(chan *pipeline.Batch, 4)
			done := make(chan error, 1)
			go func() { done <- src.Run(ctx, out) }()
			wait := func(what string, cond func() bool) {
				t.Helper()
				for !cond() {
					if ctx.Err() != nil {
						t.Fatalf("waiting for %s: %v", what, ctx.Err())
					}
					time.Sleep(20 * time.Millisecond)
				}
			}

			// cmp2: three batches 2 h ahead (reason time).
			for i := 1; i <= skewed; i++ {
				m := &nats.Msg{Subject: transport.FlowsSubject("cmp2"), Data: encodeFlows(t, stamped(skewedRec, "cmp2", int64(i), time.Now().Add(2*time.Hour)))}
				if _, err := s.JS.PublishMsg(ctx, m, js.WithMsgID("cmp2-"+strconv.Itoa(i))); err != nil {
					t.Fatal(err)
				}
			}
			wait("cmp2's dead letters", func() bool {
				return counterValue(t, reg, "tapflow_consume_rejected_messages_total", consume.ReasonTime) == skewed
			})

			// cmp1: garbage on its own subject, 256 KiB each, 40 MiB in all.
			start := time.Now()
			body := make([]byte, msgSize)
			for i := 1; i <= garbage; i++ {
				_, _ = rand.Read(body)
				m := &nats.Msg{Subject: transport.FlowsSubject("cmp1"), Data: body, Header: nats.Header{}}
				m.Header.Set("X-Garbage", strconv.Itoa(i))
				if _, err := s.JS.PublishMsg(ctx, m, js.WithMsgID("cmp1-"+strconv.Itoa(i))); err != nil {
					t.Fatal(err)
				}
			}
			wait("cmp1's evictions", func() bool { return evictions() >= garbage-perNode })
			flood := time.Since(start)
			wait("the consumer to finish", func() bool {
				c, err := s.JS.Consumer(ctx, transport.FlowsStream, cfg.Durable)
				if err != nil {
					return false
				}
				info, err := c.Info(ctx)
				return err == nil && info.NumPending == 0 && info.NumAckPending == 0
			})
			if err := stopSource(cancel, out, done, nil); err != nil {
				t.Fatal(err)
			}
			bg := context.Background()

			if e := evictions(); e != garbage-perNode {
				t.Errorf("evictions %v, want %d", e, garbage-perNode)
			}
			if e := gaugeOrCounter(t, reg, "tapflow_consume_dlq_errors_total"); e != 0 {
				t.Errorf("dead-letter publish errors %v, want 0", e)
			}
			var cmp2, cmp1 []dlq.Letter
			err = dlq.List(bg, s.JS, dlq.Filter{}, func(l dlq.Letter) error {
				switch l.Sender {
				case "cmp2":
					cmp2 = append(cmp2, l)
				case "cmp1":
					cmp1 = append(cmp1, l)
				default:
					t.Errorf("letter of sender %q (%s)", l.Sender, l.OrigSubject)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(cmp2) != skewed {
				t.Fatalf("cmp2 has %d dead letters after cmp1's flood, want %d", len(cmp2), skewed)
			}
			for i, l := range cmp2 {
				if l.Reason != consume.ReasonTime || l.Records != skewedRec || l.MsgID != "cmp2-"+strconv.Itoa(i+1) || l.Subject != "tapflow.dlq.flows.cmp2" {
					t.Errorf("cmp2 letter %d: %+v", i, l)
				}
			}
			if len(cmp1) != perNode {
				t.Fatalf("cmp1 kept %d letters, want its newest %d", len(cmp1), perNode)
			}
			for i, l := range cmp1 {
				if want := "cmp1-" + strconv.Itoa(garbage-perNode+1+i); l.MsgID != want || l.Reason != consume.ReasonDecode {
					t.Errorf("cmp1 letter %d: %s (%s), want %s (decode)", i, l.MsgID, l.Reason, want)
				}
			}
			evs, err := dlq.Evictions(bg, s.JS)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != 1 {
				t.Fatalf("eviction tallies %+v, want cmp1's only", evs)
			}
			e := evs[0]
			if e.Sender != "cmp1" || e.Stream != transport.FlowsStream || e.Letters != garbage-perNode || e.Bytes != (garbage-perNode)*msgSize ||
				e.ByReason[consume.ReasonDecode] != garbage-perNode || len(e.ByReason) != 1 || e.LastMsgID != "cmp1-"+strconv.Itoa(garbage-perNode) {
				t.Errorf("cmp1's tally %+v", e)
			}
			info, err := st.Info(bg)
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Bytes > dlqMax {
				t.Errorf("DLQ holds %d bytes, more than its %d", info.State.Bytes, dlqMax)
			}
			t.Logf("DLQ after the flood: %d messages, %d bytes (max %d); cmp1 evicted %d letters (%d bytes), cmp2 kept %d; %d MiB published and dead-lettered in %s",
				info.State.Msgs, info.State.Bytes, dlqMax, e.Letters, e.Bytes, len(cmp2), garbage*msgSize>>20, flood.Round(time.Millisecond))
		})
	}
}
