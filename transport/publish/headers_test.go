package publish_test

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/klauspost/compress/zstd"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/publish"
)

// TestEveryMessageCarriesTheContract publishes one batch per codec and
// reads it back as a subscriber would, with stock arrow-go and klauspost
// zstd only (no tapflow decoder): the headers say what the body is, and
// the body is a standard Arrow IPC stream (zstd: after one decompress).
func TestEveryMessageCarriesTheContract(t *testing.T) {
	for _, codec := range schemas.Codecs {
		t.Run(codec, func(t *testing.T) {
			s := transporttest.Run(t, "")
			cfg := transport.DefaultConfig()
			cfg.Codec = codec
			pub, err := publish.New(s.JS, publish.Options{AgentID: "agent-x", Node: "cmp9", StateDir: t.TempDir(), NATS: cfg, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			recs := make([]schemas.Flow, 1234)
			var want int64
			for i := range recs {
				recs[i] = schemas.Flow{Node: "cmp9", TenantID: "t-" + strconv.Itoa(i%3), Zone: "external", Bytes: int64(i), TimeEnd: time.Now().UnixMicro()}
				want += int64(i)
			}
			in := make(chan *pipeline.Batch, 1)
			var seq int64
			b := pipeline.NewBatch(recs, func(err error) {
				if err != nil {
					t.Errorf("publish: %v", err)
				}
			})
			in <- b
			close(in)
			if err := pub.Run(context.Background(), in); err != nil {
				t.Fatal(err)
			}
			seq = b.Seq

			msg := firstMessage(t, s, transport.FlowsStream)
			h := msg.Headers()
			for k, v := range map[string]string{
				transport.HeaderSchema: "flow.v1", transport.HeaderCodec: codec, transport.HeaderRecords: "1234",
				transport.HeaderAgent: "agent-x", transport.HeaderBatchSeq: strconv.FormatInt(seq, 10),
				jetstream.MsgIDHeader: "agent-x-" + strconv.FormatInt(seq, 10),
			} {
				if got := h.Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			body := msg.Data()
			if h.Get(transport.HeaderCodec) == schemas.CodecZstd {
				d, _ := zstd.NewReader(nil)
				defer d.Close()
				if body, err = d.DecodeAll(body, nil); err != nil {
					t.Fatal(err)
				}
			}
			r, err := ipc.NewReader(bytes.NewReader(body))
			if err != nil {
				t.Fatalf("stock arrow reader: %v", err)
			}
			defer r.Release()
			var rows, sum int64
			for r.Next() {
				rec := r.RecordBatch()
				col := rec.Column(rec.Schema().FieldIndices("bytes")[0]).(*array.Int64)
				for i := range col.Len() {
					sum += col.Value(i)
				}
				rows += rec.NumRows()
			}
			if rows != 1234 || sum != want {
				t.Fatalf("stock reader got %d rows / %d bytes, want 1234 / %d", rows, sum, want)
			}
			if md, _ := r.Schema().Metadata().GetValue(schemas.MetadataKey); !strings.EqualFold(md, "flow.v1") {
				t.Fatalf("arrow metadata %s = %q", schemas.MetadataKey, md)
			}
		})
	}
}

// TestMeterMessagesCarryTheContract: meter.v1 batches get the same
// headers, naming their own schema.
func TestMeterMessagesCarryTheContract(t *testing.T) {
	s := transporttest.Run(t, "")
	pub, err := publish.NewMeters(s.JS, publish.MeterOptions{AgentID: "agent-x", Node: "cmp9", StateDir: t.TempDir(), NATS: transport.DefaultConfig(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan *pipeline.BatchOf[schemas.Meter], 1)
	b := pipeline.NewBatchOf([]schemas.Meter{{Node: "cmp9", Ifname: "tap1", Direction: "tx", Bytes: 5, TimeEnd: time.Now().UnixMicro()}}, func(err error) {
		if err != nil {
			t.Errorf("publish: %v", err)
		}
	})
	in <- b
	close(in)
	if err := pub.Run(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	h := firstMessage(t, s, transport.MetersStream).Headers()
	if h.Get(transport.HeaderSchema) != "meter.v1" || h.Get(transport.HeaderCodec) != transport.DefaultConfig().Codec || h.Get(transport.HeaderRecords) != "1" ||
		h.Get(transport.HeaderBatchSeq) != strconv.FormatInt(b.Seq, 10) || h.Get(transport.HeaderAgent) != "agent-x" {
		t.Fatalf("meter headers %v", h)
	}
}

// firstMessage reads the stream's first message as a subscriber would.
func firstMessage(t *testing.T, s *transporttest.Server, stream string) jetstream.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := s.JS.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return msg
}
