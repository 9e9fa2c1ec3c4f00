package consume_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
)

// TestRowSourceReleasesDeadLetters: the row source decodes through its
// pool (poisoning what comes back); a message it dead-letters after
// decoding gives its buffers back at once, its letter is the message's
// own body, and the good messages' rows, held meanwhile as a sink holds
// them until written, keep their values: nothing recycled under them.
// The pool's series exist from the start.
func TestRowSourceReleasesDeadLetters(t *testing.T) {
	s := transporttest.Run(t, "")
	now := time.Now()
	cfg := consume.DefaultConfig()
	cfg.AckWait = units.Duration(5 * time.Second)
	reg := prometheus.NewRegistry()
	pool := schemas.NewBufferPool(64 << 10).Poisoned()
	src, err := consume.NewRows(s.JS, cfg, consume.Options{Logger: quiet, Registry: reg, DecodePool: pool})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tapflow_consume_decode_pool_idle_bytes", "tapflow_consume_decode_pool_held_bytes",
		"tapflow_consume_decode_pool_gets_total", "tapflow_consume_decode_pool_hits_total", "tapflow_consume_decode_pool_dropped_total"} {
		if v := gaugeOrCounter(t, reg, name); v != 0 {
			t.Fatalf("%s = %v at start, want 0", name, v)
		}
	}
	enc, err := schemas.NewEncoder(schemas.CodecLZ4)
	if err != nil {
		t.Fatal(err)
	}
	body := func(recs []schemas.Flow) []byte {
		b, err := enc.Encode(nil, recs)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	type msg struct {
		name, msgID string
		recs        []schemas.Flow
		reason      string
	}
	var msgs []msg
	wantGood := map[int64][]schemas.Flow{}
	for seq := int64(1); seq <= 30; seq++ {
		recs := stamped(400, "cmp1", seq, now)
		for i := range recs {
			recs[i].Bytes = seq*1000 + int64(i)
		}
		m := msg{name: "good", msgID: "cmp1-" + strconv.FormatInt(seq, 10), recs: recs}
		switch seq % 3 { // decoded, then refused
		case 1:
			m.name, m.msgID, m.reason = "message id of another batch", "cmp1-"+strconv.FormatInt(9000+seq, 10), consume.ReasonIdentity
		case 2:
			for i := range m.recs {
				m.recs[i].TimeEnd = now.Add(-8 * 24 * time.Hour).UnixMicro()
			}
			m.name, m.reason = "8 days old", consume.ReasonTime
		default:
			wantGood[seq] = recs
		}
		msgs = append(msgs, m)
	}
	bodies := map[uint64][]byte{} // by stream seq
	for i, m := range msgs {
		b := body(m.recs)
		bodies[uint64(i+1)] = b
		nm := &nats.Msg{Subject: transport.FlowsSubject("cmp1"), Data: b, Header: nats.Header{}}
		if _, err := s.JS.PublishMsg(context.Background(), nm, js.WithMsgID(m.msgID)); err != nil {
			t.Fatal(err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := make(chan *pipeline.BatchOf[schemas.Row], len(msgs))
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, out) }()
	var held []*pipeline.BatchOf[schemas.Row]
	for len(held) < len(wantGood) {
		select {
		case b := <-out:
			held = append(held, b)
		case <-ctx.Done():
			t.Fatalf("got %d good messages, want %d", len(held), len(wantGood))
		}
	}
	rejected := func() (n float64) {
		for _, r := range []string{consume.ReasonIdentity, consume.ReasonTime} {
			n += counterValue(t, reg, "tapflow_consume_rejected_messages_total", r)
		}
		return n
	}
	for rejected() < float64(len(msgs)-len(wantGood)) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	if st := pool.Stats(); st.Messages != int64(len(wantGood)) {
		t.Errorf("pool holds %d messages with the %d good ones held: the dead-lettered ones were not released", st.Messages, len(wantGood))
	}
	bytesCol := schemas.FlowRows.ColumnIndex("bytes")
	for _, b := range held {
		want := wantGood[b.Records[0].BatchSeq()]
		if len(b.Records) != len(want) {
			t.Fatalf("stream seq %d: %d rows, want %d", b.Seq, len(b.Records), len(want))
		}
		for i, r := range b.Records {
			w := want[i]
			if r.BatchSeq() != w.BatchSeq || r.RecordIndex() != w.RecordIndex || r.Int64(bytesCol) != w.Bytes ||
				r.Node() != w.Node || r.AgentID() != w.AgentID || r.TimeEnd() != w.TimeEnd {
				t.Fatalf("stream seq %d row %d reads %d/%d/%d/%q, want %d/%d/%d/%q: recycled under the rows?",
					b.Seq, i, r.BatchSeq(), r.RecordIndex(), r.Int64(bytesCol), r.Node(), w.BatchSeq, w.RecordIndex, w.Bytes, w.Node)
			}
		}
		schemas.ReleaseRows(b.Records) // as the sink does once written
		b.Ack(nil)
	}
	if st := pool.Stats(); st.Messages != 0 || st.Out != 0 || st.Hits == 0 {
		t.Errorf("after every release: %+v; want nothing held and buffers recycled", st)
	}
	if v := gaugeOrCounter(t, reg, "tapflow_consume_decode_pool_gets_total"); v == 0 {
		t.Error("tapflow_consume_decode_pool_gets_total still 0")
	}
	if err := stopSource(cancel, out, done, nil); err != nil {
		t.Fatal(err)
	}

	// Each letter is the message's own body, byte for byte.
	dlq, err := s.JS.Stream(context.Background(), transport.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	letters := 0
	for seq := uint64(1); ; {
		m, err := dlq.GetMsg(context.Background(), seq, js.WithGetMsgSubject(transport.DLQFlowsSubject+".>"))
		if err != nil {
			break
		}
		seq = m.Sequence + 1
		orig, _ := strconv.ParseUint(m.Header.Get(transport.HeaderOrigSeq), 10, 64)
		if string(m.Data) != string(bodies[orig]) {
			t.Errorf("letter of stream seq %d differs from the message's body", orig)
		}
		letters++
	}
	if letters != len(msgs)-len(wantGood) {
		t.Errorf("%d letters, want %d", letters, len(msgs)-len(wantGood))
	}
}
