package dlq_test

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/dlq"
)

// TestDLQUpgrade: a TAPFLOW_DLQ an older tapflow created (discard old,
// every letter on tapflow.dlq.flows / tapflow.dlq.meters) holding
// letters. An agent's start (EnsureStreamsKeepConsumers) leaves it as it
// is; a collector's (EnsureStreams) switches it to discard new with
// nats.dlq_max_bytes and keeps every old letter, which List still reads
// with its sender and Replay still replays.
func TestDLQUpgrade(t *testing.T) {
	s := transporttest.Listen(t, "", "127.0.0.1:0")
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	old := jetstream.StreamConfig{Name: transport.DLQStream, Subjects: []string{"tapflow.dlq.>"}, Storage: jetstream.FileStorage,
		Retention: jetstream.LimitsPolicy, MaxAge: 14 * 24 * time.Hour, MaxBytes: 1 << 30}
	if _, err := s.JS.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	legacy := map[string]string{"tapflow.dlq.flows": transport.FlowsSubject("cmp2"), "tapflow.dlq.meters": transport.MetersSubject("cmp3")}
	for i := range 3 {
		for dlqSubj, orig := range legacy {
			m := &nats.Msg{Subject: dlqSubj, Data: []byte("x"), Header: nats.Header{}}
			m.Header.Set(transport.HeaderOrigSubject, orig)
			m.Header.Set(transport.HeaderReason, "time")
			m.Header.Set(transport.HeaderOrigMsgID, transport.DLQSender(orig)+"-"+strconv.Itoa(i+1))
			if _, err := s.JS.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	cfg := transport.DefaultConfig()
	cfg.DLQMaxBytes = 64 << 20
	config := func() jetstream.StreamConfig {
		st, err := s.JS.Stream(ctx, transport.DLQStream)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().Config
	}
	if err := transport.EnsureStreamsKeepConsumers(ctx, s.JS, cfg, log); err != nil {
		t.Fatal(err)
	}
	if c := config(); c.Discard != jetstream.DiscardOld || c.MaxBytes != 1<<30 {
		t.Fatalf("an agent changed the DLQ: discard %v, max bytes %d", c.Discard, c.MaxBytes)
	}
	if err := transport.EnsureStreams(ctx, s.JS, cfg, log); err != nil {
		t.Fatal(err)
	}
	if c := config(); c.Discard != jetstream.DiscardNew || c.MaxBytes != 64<<20 {
		t.Fatalf("after a collector's start: discard %v, max bytes %d; want new, %d", c.Discard, c.MaxBytes, 64<<20)
	}
	senders := map[string]int{}
	if err := dlq.List(ctx, s.JS, dlq.Filter{}, func(l dlq.Letter) error { senders[l.Sender]++; return nil }); err != nil {
		t.Fatal(err)
	}
	if senders["cmp2"] != 3 || senders["cmp3"] != 3 || len(senders) != 2 {
		t.Fatalf("old letters by sender after the upgrade: %v, want cmp2 and cmp3 3 each", senders)
	}
	var outcomes []dlq.Outcome
	if err := dlq.Replay(ctx, s.JS, dlq.Filter{Subject: transport.FlowsSubject("cmp2")}, false, 10*time.Second, func(r dlq.Result) {
		outcomes = append(outcomes, r.Outcome)
	}); err != nil {
		t.Fatal(err)
	}
	if len(outcomes) != 3 || outcomes[0] != dlq.Replayed || outcomes[2] != dlq.Replayed {
		t.Fatalf("replay of old letters: %v", outcomes)
	}
}
