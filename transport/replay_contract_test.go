package transport_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/transport"
)

// TestReplayFromStartTime backs docs/subscribers.md: an ordered consumer
// with DeliverByStartTime gets exactly the messages stored since that
// time that the stream still holds (interest retention: what the
// collector has not acked), and taking them leaves the collector's
// durable untouched.
func TestReplayFromStartTime(t *testing.T) {
	s := transporttest.Run(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub := func(i int) {
		msg := &nats.Msg{Subject: transport.FlowsSubject("cmp1"), Data: []byte("batch " + strconv.Itoa(i)), Header: nats.Header{}}
		if _, err := s.JS.PublishMsg(ctx, msg, jetstream.WithMsgID("a-"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		pub(i)
	}
	time.Sleep(50 * time.Millisecond) // stored times are the server's clock
	start := time.Now()
	time.Sleep(50 * time.Millisecond)
	for i := 3; i < 5; i++ {
		pub(i)
	}
	cons, err := s.JS.OrderedConsumer(ctx, transport.FlowsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{transport.FlowsSubjectRoot + ".>"},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &start,
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 2 {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		got = append(got, string(m.Data()))
	}
	if got[0] != "batch 3" || got[1] != "batch 4" {
		t.Fatalf("replay from the start time got %q, want batch 3 and batch 4", got)
	}
	if m, err := cons.Next(jetstream.FetchMaxWait(300 * time.Millisecond)); err == nil {
		t.Fatalf("unexpected message %q after the replay", m.Data())
	}
	dur, err := s.JS.Consumer(ctx, transport.FlowsStream, transport.DefaultDurable)
	if err != nil {
		t.Fatal(err)
	}
	info, err := dur.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumPending != 5 || info.Delivered.Consumer != 0 {
		t.Fatalf("collector durable: %d pending, %d delivered; want all 5 pending", info.NumPending, info.Delivered.Consumer)
	}
	// Once the collector acked them, they are gone: replay reaches back
	// only as far as the backlog.
	batch, err := dur.Fetch(5, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.JS.Stream(ctx, transport.FlowsStream)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		si, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if si.State.Msgs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages still in the stream after every consumer acked", si.State.Msgs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	late, err := s.JS.OrderedConsumer(ctx, transport.FlowsStream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start,
	})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := late.Next(jetstream.FetchMaxWait(300 * time.Millisecond)); err == nil {
		t.Fatalf("replay after the collector acked got %q; the stream should be empty", m.Data())
	}
}
