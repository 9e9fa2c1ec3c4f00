package dlq_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/dlq"
)

func TestSubjectMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, subject string
		want             bool
	}{
		{"tapflow.flows.v1.cmp1", "tapflow.flows.v1.cmp1", true},
		{"tapflow.flows.v1.cmp1", "tapflow.flows.v1.cmp10", false},
		{"tapflow.flows.v1.*", "tapflow.flows.v1.cmp1", true},
		{"tapflow.*.v1.cmp1", "tapflow.meters.v1.cmp1", true},
		{"tapflow.>", "tapflow.flows.v1.cmp1", true},
		{"tapflow.flows.v1.>", "tapflow.flows.v1", false},
		{"tapflow.flows.v1.*", "tapflow.flows.v1.a.b", false},
		{"tapflow.flows", "tapflow.flows.v1.cmp1", false},
	} {
		if got := dlq.SubjectMatch(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("SubjectMatch(%q, %q) = %v", tc.pattern, tc.subject, got)
		}
	}
}

// TestReplayOutcomes: a letter whose message id the stream already holds
// from a later publish (an earlier replay that landed, its delete lost)
// is deleted as already delivered, without a second copy; a letter
// without a message id is skipped and kept.
func TestReplayOutcomes(t *testing.T) {
	s := transporttest.Run(t, "")
	ctx := context.Background()
	subj := transport.FlowsSubject("cmp1")
	if _, err := s.JS.PublishMsg(ctx, &nats.Msg{Subject: subj, Data: []byte("x")}, jetstream.WithMsgID("agent-z-1")); err != nil {
		t.Fatal(err)
	}
	letter := func(id, origSeq string) {
		m := &nats.Msg{Subject: transport.DLQFlowsSubject, Data: []byte("x"), Header: nats.Header{}}
		m.Header.Set(transport.HeaderOrigSubject, subj)
		m.Header.Set(transport.HeaderOrigSeq, origSeq)
		m.Header.Set(transport.HeaderReason, "time")
		if id != "" {
			m.Header.Set(transport.HeaderOrigMsgID, id)
		}
		if _, err := s.JS.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	letter("agent-z-1", "77") // the rejected original was seq 77; seq 1 is a later copy
	letter("", "78")
	got := map[dlq.Outcome]int{}
	if err := dlq.Replay(ctx, s.JS, dlq.Filter{}, false, 10*time.Second, func(r dlq.Result) { got[r.Outcome]++ }); err != nil {
		t.Fatal(err)
	}
	if got[dlq.AlreadyDelivered] != 1 || got[dlq.Skipped] != 1 || len(got) != 2 {
		t.Fatalf("outcomes %v", got)
	}
	n := 0
	_ = dlq.List(ctx, s.JS, dlq.Filter{}, func(l dlq.Letter) error {
		n++
		if l.MsgID != "" {
			t.Errorf("delivered letter kept: %+v", l)
		}
		return nil
	})
	st, _ := s.JS.Stream(ctx, transport.FlowsStream)
	info, _ := st.Info(ctx)
	if n != 1 || info.State.Msgs != 1 {
		t.Fatalf("DLQ keeps %d letters (want 1), flow stream %d messages (want 1)", n, info.State.Msgs)
	}
}

// TestReplayKeepsTheBatchHeaders: a replayed letter goes back with the
// batch's contract headers (Tapflow-Schema, -Codec, …) and without the
// DLQ's own.
func TestReplayKeepsTheBatchHeaders(t *testing.T) {
	s := transporttest.Run(t, "")
	ctx := context.Background()
	subj := transport.FlowsSubject("cmp1")
	m := &nats.Msg{Subject: transport.DLQFlowsSubject, Data: []byte("x"),
		Header: transport.BatchHeader("flow.v1", "zstd", "agent-q", 5, 1)}
	m.Header.Set(transport.HeaderOrigSubject, subj)
	m.Header.Set(transport.HeaderOrigSeq, "9")
	m.Header.Set(transport.HeaderOrigStream, transport.FlowsStream)
	m.Header.Set(transport.HeaderOrigMsgID, "agent-q-5")
	m.Header.Set(transport.HeaderReason, "time")
	m.Header.Set(transport.HeaderError, "time: 2h ahead")
	if _, err := s.JS.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	got := map[dlq.Outcome]int{}
	if err := dlq.Replay(ctx, s.JS, dlq.Filter{}, false, 10*time.Second, func(r dlq.Result) { got[r.Outcome]++ }); err != nil {
		t.Fatal(err)
	}
	if got[dlq.Replayed] != 1 {
		t.Fatalf("outcomes %v", got)
	}
	st, err := s.JS.Stream(ctx, transport.FlowsStream)
	if err != nil {
		t.Fatal(err)
	}
	back, err := st.GetLastMsgForSubject(ctx, subj)
	if err != nil {
		t.Fatal(err)
	}
	want := transport.BatchHeader("flow.v1", "zstd", "agent-q", 5, 1)
	for k := range want {
		if back.Header.Get(k) != want.Get(k) {
			t.Errorf("replayed %s = %q, want %q", k, back.Header.Get(k), want.Get(k))
		}
	}
	for k := range back.Header {
		if k == transport.HeaderReason || k == transport.HeaderError || k == transport.HeaderOrigSubject {
			t.Errorf("replayed message keeps DLQ header %s", k)
		}
	}
	if back.Header.Get(jetstream.MsgIDHeader) != "agent-q-5" {
		t.Errorf("replayed Nats-Msg-Id %q", back.Header.Get(jetstream.MsgIDHeader))
	}
}

// TestReplaySkipsEmpty: a letter without records (reason empty) is never
// republished: it would only burn its message id again.
func TestReplaySkipsEmpty(t *testing.T) {
	s := transporttest.Run(t, "")
	ctx := context.Background()
	m := &nats.Msg{Subject: transport.DLQSubject(transport.DLQFlowsSubject, transport.FlowsSubject("cmp1")), Header: nats.Header{}}
	m.Header.Set(transport.HeaderOrigSubject, transport.FlowsSubject("cmp1"))
	m.Header.Set(transport.HeaderReason, "empty")
	m.Header.Set(transport.HeaderOrigMsgID, "cmp2-9")
	if _, err := s.JS.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	var got []dlq.Result
	if err := dlq.Replay(ctx, s.JS, dlq.Filter{}, false, 5*time.Second, func(r dlq.Result) { got = append(got, r) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Outcome != dlq.Skipped {
		t.Fatalf("replay of an empty letter: %+v", got)
	}
	st, err := s.JS.Stream(ctx, transport.FlowsStream)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Fatalf("%s after replay: %v, %v", transport.FlowsStream, info, err)
	}
}
