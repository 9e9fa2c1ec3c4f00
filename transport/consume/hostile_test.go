package consume_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/testkit/wirecraft"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
)

// stamped returns n flow records as the agent of node (agent_id = node) stamps batch seq,
// all with time_end te.
func stamped(n int, node string, seq int64, te time.Time) []schemas.Flow {
	recs := make([]schemas.Flow, n)
	for i := range recs {
		recs[i] = schemas.Flow{Node: node, AgentID: node, BatchSeq: seq, RecordIndex: int32(i), TimeEnd: te.UnixMicro(), Bytes: 1, Packets: 1}
	}
	return recs
}

func encodeFlows(t *testing.T, recs []schemas.Flow) []byte {
	t.Helper()
	enc, err := schemas.NewEncoder(schemas.CodecZstd)
	if err != nil {
		t.Fatal(err)
	}
	body, err := enc.Encode(nil, recs)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// TestHostileMessagesGoToDLQ: against a real server, every kind of broken
// or hostile message between good batches goes whole (body and original
// headers) to tapflow.dlq.flows.<node> with its reason, is counted by reason and
// terminated; the good batches all arrive; the collector neither crashes
// nor holds anything back.
func TestHostileMessagesGoToDLQ(t *testing.T) {
	s := transporttest.Run(t, "")
	now := time.Now()
	cfg := consume.DefaultConfig()
	cfg.AckWait = units.Duration(5 * time.Second)
	cfg.MaxBatchRecords = 500
	cfg.MaxMessageBytes = 1 << 20
	reg := prometheus.NewRegistry()
	src, err := consume.New(s.JS, cfg, consume.Options{Logger: quiet, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	rejected := func(reason string) float64 {
		return counterValue(t, reg, "tapflow_consume_rejected_messages_total", reason)
	}
	for _, r := range consume.Reasons {
		if got := rejected(r); got != 0 {
			t.Fatalf("rejected{reason=%s} = %v at start, want 0", r, got)
		}
	}

	type hostile struct {
		name   string
		node   string // subject node
		msgID  string // "" = none
		body   []byte
		reason string
	}
	good := func(n int, seq int64) hostile {
		return hostile{"good", "cmp1", "cmp1-" + strconv.FormatInt(seq, 10), encodeFlows(t, stamped(n, "cmp1", seq, now)), ""}
	}
	// Agent cmp1 claims agent cmp2's batch on its own subject
	// (collector.agent_id_is_node, on by default).
	otherAgent := stamped(10, "cmp1", 20, now)
	for i := range otherAgent {
		otherAgent[i].AgentID = "cmp2"
	}
	withDupIndex := stamped(10, "cmp1", 6, now)
	withDupIndex[9].RecordIndex = 0
	cases := []hostile{
		good(100, 1),
		{"garbage", "cmp1", "cmp1-2", []byte("definitely not arrow"), consume.ReasonDecode},
		{"records of another node", "cmp1", "cmp2-3", encodeFlows(t, stamped(10, "cmp2", 3, now)), consume.ReasonIdentity},
		{"message id of another batch", "cmp1", "cmp1-99", encodeFlows(t, stamped(10, "cmp1", 4, now)), consume.ReasonIdentity},
		{"no message id", "cmp1", "", encodeFlows(t, stamped(10, "cmp1", 5, now)), consume.ReasonIdentity},
		{"agent_id of another node", "cmp1", "cmp2-20", encodeFlows(t, otherAgent), consume.ReasonIdentity},
		{"duplicate record_index", "cmp1", "cmp1-6", encodeFlows(t, withDupIndex), consume.ReasonIdentity},
		good(200, 7),
		{"clock 2h ahead", "cmp1", "cmp1-8", encodeFlows(t, stamped(10, "cmp1", 8, now.Add(2*time.Hour))), consume.ReasonTime},
		{"8 days old", "cmp1", "cmp1-9", encodeFlows(t, stamped(10, "cmp1", 9, now.Add(-8*24*time.Hour))), consume.ReasonTime},
		{"year -144169", "cmp1", "cmp1-10", encodeFlows(t, stamped(10, "cmp1", 10, time.UnixMicro(-4611686018427387904))), consume.ReasonTime},
		{"more than max_batch_records", "cmp1", "cmp1-11", encodeFlows(t, stamped(501, "cmp1", 11, now)), consume.ReasonSize},
		{"zstd bomb: 100k empty rows in a few KB", "cmp1", "cmp1-12", encodeFlows(t, make([]schemas.Flow, 100_000)), consume.ReasonSize},
		good(300, 13),
		{"dictionary index out of range", "cmp1", "cmp1-14", craft(t, stamped(10, "cmp1", 14, now), "zone",
			wirecraft.Dict(arrow.PrimitiveTypes.Int32, wirecraft.Keys(10, 2, 7, 2), wirecraft.Strings("same_tenant", "external"))), consume.ReasonDecode},
		{"dictionary of int64 values", "cmp1", "cmp1-15", craft(t, stamped(10, "cmp1", 15, now), "tenant_id",
			wirecraft.Dict(arrow.PrimitiveTypes.Int32, wirecraft.Keys(10, 2, -1, 0), wirecraft.Int64s(1, 2))), consume.ReasonDecode},
		{"dictionary of 4107 entries for 10 rows", "cmp1", "cmp1-16", craft(t, stamped(10, "cmp1", 16, now), "port_id",
			wirecraft.Dict(arrow.PrimitiveTypes.Int32, wirecraft.Keys(10, 2, -1, 0), wirecraft.NStrings(10+4097))), consume.ReasonDecode},
		{"dictionary of 2 MiB", "cmp1", "cmp1-17", craft(t, stamped(10, "cmp1", 17, now), "server_id",
			wirecraft.Dict(arrow.PrimitiveTypes.Int32, wirecraft.Keys(10, 2, -1, 0), wirecraft.Strings(strings.Repeat("a", 1<<20), strings.Repeat("b", 1<<20)))), consume.ReasonSize},
		{"dictionary bomb: 2 MiB in a few KB of lz4", "cmp1", "cmp1-19", craft(t, stamped(10, "cmp1", 19, now), "server_id",
			wirecraft.Dict(arrow.PrimitiveTypes.Int32, wirecraft.Keys(10, 2, -1, 0), wirecraft.Strings(strings.Repeat("a", 1<<20), strings.Repeat("b", 1<<20))), ipc.WithLZ4()), consume.ReasonSize},
		{"good, plain utf8 (agent before wire dictionaries)", "cmp1", "cmp1-18", encodePlain(t, stamped(50, "cmp1", 18, now)), ""},
		// Empty batches (issue 25 item 5): acked, they would burn the
		// message id for its owner within the duplicate window.
		{"empty body under another agent's next id", "cmp1", "cmp2-21", []byte{}, consume.ReasonEmpty},
		{"empty body, no id", "cmp1", "", nil, consume.ReasonEmpty},
		{"arrow stream of 0 rows under another agent's id", "cmp1", "cmp2-22", encodeFlows(t, []schemas.Flow{}), consume.ReasonEmpty},
		{"arrow stream of 0 rows under its own id", "cmp1", "cmp1-23", encodePlain(t, []schemas.Flow{}), consume.ReasonEmpty},
		good(10, 24),
		// Batch headers naming another batch: subscribers dedupe on them.
		{"Tapflow-Agent of another agent", "cmp1", "cmp1-25", encodeFlows(t, stamped(10, "cmp1", 25, now)), consume.ReasonIdentity},
		{"Tapflow-Batch-Seq of another batch", "cmp1", "cmp1-26", encodeFlows(t, stamped(10, "cmp1", 26, now)), consume.ReasonIdentity},
		{"second Tapflow-Agent value", "cmp1", "cmp1-27", encodeFlows(t, stamped(10, "cmp1", 27, now)), consume.ReasonIdentity},
		{"good, with its batch headers", "cmp1", "cmp1-28", encodeFlows(t, stamped(10, "cmp1", 28, now)), ""},
	}
	headers := map[string]nats.Header{
		"Tapflow-Agent of another agent":     transport.BatchHeader("flow.v1", "zstd", "cmp2", 25, 10),
		"Tapflow-Batch-Seq of another batch": transport.BatchHeader("flow.v1", "zstd", "cmp1", 17, 10),
		"second Tapflow-Agent value":         {transport.HeaderAgent: {"cmp1", "cmp2"}},
		"good, with its batch headers":       transport.BatchHeader("flow.v1", "zstd", "cmp1", 28, 10),
	}
	want := map[string]int{}
	wantRecords := 0
	for _, h := range cases {
		m := &nats.Msg{Subject: transport.FlowsSubject(h.node), Data: h.body, Header: nats.Header{}}
		for k, v := range headers[h.name] {
			m.Header[k] = v
		}
		m.Header.Set("X-Tapflow-Test", h.name)
		var opts []js.PublishOpt
		if h.msgID != "" {
			opts = append(opts, js.WithMsgID(h.msgID))
		}
		if _, err := s.JS.PublishMsg(context.Background(), m, opts...); err != nil {
			t.Fatal(err)
		}
		if h.reason == "" {
			wantRecords += len(mustDecode(t, h.body))
		} else {
			want[h.reason]++
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := make(chan *pipeline.Batch, 4)
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, out) }()
	got := 0
	for got < wantRecords {
		select {
		case b := <-out:
			got += len(b.Records)
			b.Ack(nil)
		case <-ctx.Done():
			t.Fatalf("got %d good records, want %d", got, wantRecords)
		}
	}
	// Poll: the dead letters are published before later messages are
	// forwarded, but the counters are read from another goroutine.
	for _, r := range consume.Reasons {
		for rejected(r) != float64(want[r]) && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}
		if g := rejected(r); g != float64(want[r]) {
			t.Errorf("rejected{reason=%s} = %v, want %d", r, g, want[r])
		}
	}
	if err := stopSource(cancel, out, done, nil); err != nil {
		t.Fatal(err)
	}
	if got != wantRecords {
		t.Fatalf("good records %d, want %d", got, wantRecords)
	}

	// Every hostile message is in the DLQ once, whole, with its reason.
	dlq, err := s.JS.Stream(context.Background(), transport.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*js.RawStreamMsg{}
	for seq := uint64(1); ; {
		m, err := dlq.GetMsg(context.Background(), seq, js.WithGetMsgSubject(transport.DLQFlowsSubject+".>"))
		if err != nil {
			break
		}
		name := m.Header.Get("X-Tapflow-Test")
		if byName[name] != nil {
			t.Errorf("%s dead-lettered twice", name)
		}
		byName[name] = m
		seq = m.Sequence + 1
	}
	for i, h := range cases {
		m := byName[h.name]
		if h.reason == "" {
			if m != nil {
				t.Errorf("good message %d dead-lettered: %s", i, m.Header.Get(transport.HeaderError))
			}
			continue
		}
		if m == nil {
			t.Errorf("%s: not in the DLQ", h.name)
			continue
		}
		if r := m.Header.Get(transport.HeaderReason); r != h.reason {
			t.Errorf("%s: reason %q (%s), want %q", h.name, r, m.Header.Get(transport.HeaderError), h.reason)
		}
		if string(m.Data) != string(h.body) {
			t.Errorf("%s: DLQ body differs from the original (%d vs %d bytes)", h.name, len(m.Data), len(h.body))
		}
		if id := m.Header.Get(transport.HeaderOrigMsgID); id != h.msgID {
			t.Errorf("%s: original msg id %q, want %q", h.name, id, h.msgID)
		}
		if m.Header.Get(transport.HeaderOrigSubject) != transport.FlowsSubject(h.node) || m.Header.Get(transport.HeaderOrigStream) != transport.FlowsStream ||
			m.Header.Get(transport.HeaderOrigSeq) != strconv.Itoa(i+1) || m.Header.Get(transport.HeaderError) == "" {
			t.Errorf("%s: dead-letter headers %v", h.name, m.Header)
		}
		t.Logf("%-40s %-8s %s", h.name, h.reason, m.Header.Get(transport.HeaderError))
	}
	c, err := s.JS.Consumer(context.Background(), transport.FlowsStream, cfg.Durable)
	if err != nil {
		t.Fatal(err)
	}
	// The server applies acks and terms asynchronously: poll (a single
	// read right after the last term failed under load).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		info, err := c.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer left pending=%d ack_pending=%d", info.NumPending, info.NumAckPending)
		}
	}
}

// craft is recs as a plain Arrow IPC body with column name replaced by
// col (wirecraft.Body).
func craft(t *testing.T, recs []schemas.Flow, name string, col arrow.Array, opts ...ipc.Option) []byte {
	t.Helper()
	body, err := wirecraft.Body(recs, name, col, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// encodePlain encodes recs as an agent before wire dictionaries did.
func encodePlain(t *testing.T, recs []schemas.Flow) []byte {
	t.Helper()
	enc, err := schemas.NewEncoder(schemas.CodecLZ4)
	if err != nil {
		t.Fatal(err)
	}
	body, err := enc.PlainStrings().Encode(nil, recs)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

func mustDecode(t *testing.T, body []byte) []schemas.Flow {
	t.Helper()
	recs, err := schemas.NewDecoder().Decode(nil, body)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// counterValue reads the counter name{reason} (any stream) from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{reason=%q}", name, reason)
	return 0
}
