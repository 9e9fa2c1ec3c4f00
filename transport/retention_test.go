package transport_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/transport"
)

// syncBuf is a log sink safe for concurrent writes.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func streamInfo(t *testing.T, js jetstream.JetStream, name string) *jetstream.StreamInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// waitFor polls cond until it holds or the (generous) deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
	}
}

// recreate replaces the tapflow streams transporttest created with sc
// (an older tapflow's, or an operator's), without consumers.
func recreate(t *testing.T, js jetstream.JetStream, scs ...jetstream.StreamConfig) {
	t.Helper()
	ctx := context.Background()
	for _, sc := range scs {
		if err := js.DeleteStream(ctx, sc.Name); err != nil {
			t.Fatal(err)
		}
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
}

func publishN(t *testing.T, js jetstream.JetStream, subject string, n, size int) {
	t.Helper()
	body := bytes.Repeat([]byte{'x'}, size)
	for i := range n {
		if _, err := js.Publish(context.Background(), subject, body, jetstream.WithMsgID(fmt.Sprintf("%s-%d", subject, i))); err != nil {
			t.Fatalf("publish %d on %s: %v", i, subject, err)
		}
	}
}

// fetchAck fetches n messages from cons and acks the first ack of them
// (synchronously, so the server has applied the acks on return).
func fetchAck(t *testing.T, cons jetstream.Consumer, n, ack int) []uint64 {
	t.Helper()
	var seqs []uint64
	for len(seqs) < n {
		batch, err := cons.Fetch(n-len(seqs), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			md, _ := msg.Metadata()
			seqs = append(seqs, md.Sequence.Stream)
			if len(seqs) <= ack {
				if err := msg.DoubleAck(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
		}
		if got == 0 {
			t.Fatalf("fetched %d of %d messages", len(seqs), n)
		}
	}
	return seqs
}

// TestMigrateLimitsToInterest: streams an older tapflow created with
// limits retention are switched to interest in place by EnsureStreams:
// messages the collector already acked leave, the ones it holds stay and
// are still delivered, and the migration is logged.
func TestMigrateLimitsToInterest(t *testing.T) {
	s := transporttest.Run(t, "")
	ctx := context.Background()
	cfg := transport.DefaultConfig()
	var old []jetstream.StreamConfig
	for _, sc := range transport.StreamConfigs(cfg)[:2] {
		sc.Retention = jetstream.LimitsPolicy // what tapflow created before interest retention
		old = append(old, sc)
	}
	recreate(t, s.JS, old...)
	consumers := transport.CollectorConsumerConfigs(cfg.Collector)
	subjects := map[string]string{transport.FlowsStream: transport.FlowsSubject("n1"), transport.MetersStream: transport.MetersSubject("n1")}
	for _, sc := range old {
		cons, err := s.JS.CreateOrUpdateConsumer(ctx, sc.Name, *consumers[sc.Name])
		if err != nil {
			t.Fatal(err)
		}
		publishN(t, s.JS, subjects[sc.Name], 10, 100)
		fetchAck(t, cons, 10, 4) // 4 acked, 6 held
		if got := streamInfo(t, s.JS, sc.Name).State.Msgs; got != 10 {
			t.Fatalf("%s with limits retention holds %d messages, want all 10 (acked ones stay)", sc.Name, got)
		}
	}
	var logs syncBuf
	if err := transport.EnsureStreams(ctx, s.JS, cfg, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
		t.Fatal(err)
	}
	for _, sc := range old {
		t.Run(sc.Name, func(t *testing.T) {
			info := streamInfo(t, s.JS, sc.Name)
			if info.Config.Retention != jetstream.InterestPolicy || info.Config.Discard != jetstream.DiscardNew {
				t.Fatalf("retention %s discard %s, want interest, new", info.Config.Retention, info.Config.Discard)
			}
			if info.State.Msgs != 6 || info.State.FirstSeq != 5 {
				t.Fatalf("after migration %d messages from seq %d; want the 6 held ones from 5", info.State.Msgs, info.State.FirstSeq)
			}
			// The held messages are redelivered once the collector nacks them.
			cons, _ := s.JS.Consumer(ctx, sc.Name, consumers[sc.Name].Durable)
			ci, _ := cons.Info(ctx)
			if ci.NumAckPending != 6 {
				t.Fatalf("consumer holds %d unacked, want 6", ci.NumAckPending)
			}
			for _, want := range []string{"stream retention migrated", "stream=" + sc.Name, "old=Limits", "new=Interest", "messages_before=10", "messages_after=6"} {
				if !strings.Contains(logs.String(), want) {
					t.Errorf("log lacks %q:\n%s", want, logs.String())
				}
			}
		})
	}
	// A second run changes nothing and logs no migration.
	before := strings.Count(logs.String(), "migrated")
	if err := transport.EnsureStreams(ctx, s.JS, cfg, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
		t.Fatal(err)
	}
	if strings.Count(logs.String(), "migrated") != before {
		t.Errorf("second EnsureStreams logged a migration again:\n%s", logs.String())
	}
}

// TestWorkQueueStreamRefused: NATS refuses to change work-queue retention
// in place; EnsureStreams fails at once, naming the commands to run.
func TestWorkQueueStreamRefused(t *testing.T) {
	s := transporttest.Run(t, "")
	cfg := transport.DefaultConfig()
	wq := transport.StreamConfigs(cfg)[0]
	wq.Retention = jetstream.WorkQueuePolicy
	recreate(t, s.JS, wq)
	publishN(t, s.JS, transport.FlowsSubject("n1"), 3, 10)

	// What NATS does with the plain update: refused.
	want := transport.StreamConfigs(cfg)[0]
	if _, err := s.JS.UpdateStream(context.Background(), want); err == nil || !strings.Contains(err.Error(), "workqueue") {
		t.Fatalf("NATS update work queue -> interest: err %v, want a refusal", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := transport.EnsureStreams(ctx, s.JS, cfg, slog.New(slog.DiscardHandler))
	if err == nil {
		t.Fatal("EnsureStreams accepted a work-queue stream")
	}
	if ctx.Err() != nil {
		t.Fatalf("EnsureStreams retried until the deadline instead of failing fast: %v", err)
	}
	for _, w := range []string{"TAPFLOW_FLOWS", "work-queue", "3 messages", "nats stream rm -f TAPFLOW_FLOWS", "nats stream backup TAPFLOW_FLOWS"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	if got := streamInfo(t, s.JS, transport.FlowsStream).State.Msgs; got != 3 {
		t.Errorf("the refused stream holds %d messages, want its 3 untouched", got)
	}
}

// TestCollectorConsumersBeforeAgents: EnsureStreams (run by agents too)
// creates the collector's durables, named by the config, with the config
// the collector uses, so a batch published before any collector ever ran
// is kept (interest retention drops messages nobody is interested in).
func TestCollectorConsumersBeforeAgents(t *testing.T) {
	s := transporttest.Run(t, "")
	ctx := context.Background()
	cfg := transport.DefaultConfig()
	cfg.Collector = transport.CollectorConsumer{Durable: "coll-x", AckWait: 3 * time.Minute, MaxAckPending: 500}
	for _, name := range []string{transport.FlowsStream, transport.MetersStream} {
		if err := s.JS.DeleteStream(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	// A fresh server as far as these streams go: no stream, no consumer.
	if err := transport.EnsureStreams(ctx, s.JS, cfg, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	publishN(t, s.JS, transport.FlowsSubject("n1"), 5, 10)
	publishN(t, s.JS, transport.MetersSubject("n1"), 5, 10)
	for stream, durable := range map[string]string{transport.FlowsStream: "coll-x", transport.MetersStream: "coll-x-meters"} {
		info := streamInfo(t, s.JS, stream)
		if info.Config.Retention != jetstream.InterestPolicy || info.State.Msgs != 5 {
			t.Errorf("%s: retention %s, %d messages; want interest with the 5 published kept", stream, info.Config.Retention, info.State.Msgs)
		}
		cons, err := s.JS.Consumer(ctx, stream, durable)
		if err != nil {
			t.Fatalf("%s: collector consumer %s: %v", stream, durable, err)
		}
		ci := cons.CachedInfo()
		want := transport.CollectorConsumerConfigs(cfg.Collector)[stream]
		if ci.Config.AckWait != want.AckWait || ci.Config.MaxAckPending != 500 || ci.Config.FilterSubject != want.FilterSubject || ci.Config.AckPolicy != jetstream.AckExplicitPolicy {
			t.Errorf("%s: consumer config %+v, want %+v", stream, ci.Config, want)
		}
		// The server counts a consumer's pending messages after storing
		// them, asynchronously: under load its info can lag the publish
		// acks for a moment (CI saw 4 of 5).
		pending := ci.NumPending
		for deadline := time.Now().Add(10 * time.Second); pending != 5 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			info, err := cons.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			pending = info.NumPending
		}
		if pending != 5 {
			t.Errorf("%s: consumer has %d pending after 10 s, want 5", stream, pending)
		}
	}
}

// TestInterestBoundsBacklogNotTotal is the regression behind issue 11:
// with limits retention a stream refuses every publish once max_bytes have
// passed through in total, acked or not; with interest retention the same
// traffic (8× max_bytes, each message acked) passes.
func TestInterestBoundsBacklogNotTotal(t *testing.T) {
	const maxBytes, size, n = 256 << 10, 16 << 10, 128 // 2 MiB through a 256 KiB stream
	for _, tc := range []struct {
		retention jetstream.RetentionPolicy
		ok        bool
	}{{jetstream.LimitsPolicy, false}, {jetstream.InterestPolicy, true}} {
		t.Run(tc.retention.String(), func(t *testing.T) {
			s := transporttest.Run(t, "")
			ctx := context.Background()
			cfg := transport.DefaultConfig()
			cfg.StreamMaxBytes = maxBytes
			sc := transport.StreamConfigs(cfg)[0]
			sc.Retention = tc.retention
			recreate(t, s.JS, sc)
			cons, err := s.JS.CreateOrUpdateConsumer(ctx, sc.Name, *transport.CollectorConsumerConfigs(cfg.Collector)[sc.Name])
			if err != nil {
				t.Fatal(err)
			}
			body := bytes.Repeat([]byte{'x'}, size)
			var perr error
			sent := 0
			for ; sent < n; sent++ {
				if _, perr = s.JS.Publish(ctx, transport.FlowsSubject("n1"), body); perr != nil {
					break
				}
				fetchAck(t, cons, 1, 1)
			}
			t.Logf("%s: %d of %d messages (%d KiB through a %d KiB stream), err %v", tc.retention, sent, n, sent*size>>10, maxBytes>>10, perr)
			if tc.ok && perr != nil {
				t.Fatalf("publish %d refused: %v", sent, perr)
			}
			if !tc.ok && (perr == nil || !errors.Is(perr, jetstream.ErrNoStreamResponse) && !strings.Contains(perr.Error(), "maximum bytes")) {
				t.Fatalf("limits retention took %d acked messages (%d× max_bytes); err %v, want maximum bytes exceeded", sent, sent*size/maxBytes, perr)
			}
		})
	}
}

// TestSubscriberConsumer (issue 11 item 5): an analytics subscriber's
// durable sees every message the collector sees without taking any from
// it; messages stay until both acked; once the subscriber is gone past
// its InactiveThreshold the server deletes its consumer and the messages
// the collector acked leave the stream.
func TestSubscriberConsumer(t *testing.T) {
	s := transporttest.Run(t, "")
	ctx := context.Background()
	const n = 20
	scfg := transport.SubscriberConsumer("analytics", 2*time.Second)
	// The server counts the inactive threshold from the last pull or,
	// when later, from the ack wait of the last unacked delivery.
	scfg.AckWait = 2 * time.Second
	sub, err := s.JS.CreateOrUpdateConsumer(ctx, transport.FlowsStream, scfg)
	if err != nil {
		t.Fatal(err)
	}
	coll, err := s.JS.Consumer(ctx, transport.FlowsStream, transport.DefaultDurable) // made by EnsureStreams
	if err != nil {
		t.Fatal(err)
	}
	publishN(t, s.JS, transport.FlowsSubject("n1"), n, 100)

	got := fetchAck(t, coll, n, n) // the collector commits and acks everything
	if info := streamInfo(t, s.JS, transport.FlowsStream); info.State.Msgs != n {
		t.Fatalf("stream holds %d messages after the collector acked all; want %d kept for the subscriber", info.State.Msgs, n)
	}
	seen := fetchAck(t, sub, n, 5) // the subscriber sees all, acks 5
	if fmt.Sprint(seen) != fmt.Sprint(got) {
		t.Fatalf("subscriber saw %v, collector %v", seen, got)
	}
	if info := streamInfo(t, s.JS, transport.FlowsStream); info.State.Msgs != n-5 {
		t.Fatalf("stream holds %d messages after the subscriber acked 5; want %d", info.State.Msgs, n-5)
	}
	// The subscriber goes away without acking the rest: 2 s (ack wait)
	// + 2 s (inactive threshold) later the server deletes it and the rest
	// leave.
	waitFor(t, "subscriber consumer deleted", 60*time.Second, func() bool {
		_, err := s.JS.Consumer(ctx, transport.FlowsStream, "analytics")
		return errors.Is(err, jetstream.ErrConsumerNotFound)
	})
	waitFor(t, "stream emptied", 60*time.Second, func() bool {
		return streamInfo(t, s.JS, transport.FlowsStream).State.Msgs == 0
	})
	if _, err := s.JS.Consumer(ctx, transport.FlowsStream, transport.DefaultDurable); err != nil {
		t.Fatalf("the collector's durable went too: %v", err)
	}
}

// TestBacklogMonitor: the gauges exist from construction and follow the
// stream and its consumers (the collector's and a subscriber that comes
// and goes).
func TestBacklogMonitor(t *testing.T) {
	s := transporttest.Run(t, "")
	ctx := context.Background()
	cfg := transport.DefaultConfig()
	reg := prometheus.NewRegistry()
	m, err := transport.NewBacklogMonitor(s.JS, cfg, transport.BacklogOptions{Interval: 100 * time.Millisecond, Registry: reg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tapflow_stream_messages", "tapflow_stream_bytes", "tapflow_stream_max_bytes", "tapflow_consumer_pending_messages", "tapflow_consumer_ack_pending_messages", "tapflow_backlog_poll_errors_total"} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n == 0 {
			t.Errorf("%s: %d series before Run (%v), want them at 0 from the start", name, n, err)
		}
	}
	if got := gauge(t, reg, "tapflow_stream_max_bytes", transport.FlowsStream, ""); got != float64(cfg.StreamMaxBytes) {
		t.Errorf("max bytes gauge %v before Run, want %d", got, cfg.StreamMaxBytes)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(rctx) }()
	defer func() { stop(); <-done }()

	if _, err := s.JS.CreateOrUpdateConsumer(ctx, transport.FlowsStream, transport.SubscriberConsumer("analytics", time.Hour)); err != nil {
		t.Fatal(err)
	}
	publishN(t, s.JS, transport.FlowsSubject("n1"), 10, 1000)
	coll, _ := s.JS.Consumer(ctx, transport.FlowsStream, transport.DefaultDurable)
	fetchAck(t, coll, 4, 0) // delivered, not acked
	g := func(metric, consumer string) float64 {
		return gauge(t, reg, metric, transport.FlowsStream, consumer)
	}
	waitFor(t, "gauges follow the stream", 30*time.Second, func() bool {
		return g("tapflow_stream_messages", "") == 10 && g("tapflow_stream_bytes", "") > 10000 &&
			g("tapflow_consumer_pending_messages", transport.DefaultDurable) == 6 &&
			g("tapflow_consumer_ack_pending_messages", transport.DefaultDurable) == 4 &&
			g("tapflow_consumer_pending_messages", "analytics") == 10
	})
	if err := s.JS.DeleteConsumer(ctx, transport.FlowsStream, "analytics"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "gone subscriber's series removed", 30*time.Second, func() bool {
		n, _ := testutil.GatherAndCount(reg, "tapflow_consumer_pending_messages")
		return n == 2 // the collector's flows and meters durables
	})
}

// gauge is the value of one series in reg (consumer "" for stream
// gauges), -1 when there is none.
func gauge(t *testing.T, reg *prometheus.Registry, name, stream, consumer string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["stream"] == stream && labels["consumer"] == consumer {
				return mt.GetGauge().GetValue()
			}
		}
	}
	return -1
}
