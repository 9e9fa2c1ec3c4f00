package schemas_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/pipeline/sources/synthetic"
	"github.com/tapflow/tapflow/schemas"
)

var (
	realOnce  sync.Once
	realBatch []schemas.Flow
)

// realistic is one default-size batch (16384) of attributed synthetic
// records: the mix of tenants, zones, addresses and counters the agent
// publishes, stamped like the publisher stamps them.
func realistic(b *testing.B) []schemas.Flow {
	realOnce.Do(func() {
		cfg := synthetic.DefaultConfig()
		cfg.RecordsPerSecond, cfg.Attributed = 0, true
		src, err := synthetic.New(cfg, synthetic.Options{Node: "cmp-17", Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		out := make(chan *pipeline.Batch, 1)
		go func() { _ = src.Run(ctx, out); close(out) }()
		for bt := range out {
			if realBatch == nil {
				realBatch = bt.Records
				cancel()
			}
			bt.Ack(nil)
		}
		cancel()
		for i := range realBatch {
			realBatch[i].AgentID, realBatch[i].BatchSeq, realBatch[i].RecordIndex = "agent-cmp-17", 1_764_000_000_000_000, int32(i)
		}
	})
	return realBatch
}

// BenchmarkWireCodec measures every wire codec on one realistic batch:
// B/record on the wire, agent encode and collector decode CPU per record,
// and size_vs_none (the uncompressed Arrow stream of the same run is the
// baseline). `make bench`; the numbers are in docs/subscribers.md.
func BenchmarkWireCodec(b *testing.B) {
	recs := realistic(b)
	enc, _ := schemas.NewEncoder(schemas.CodecNone)
	plain, err := enc.Encode(nil, recs)
	if err != nil {
		b.Fatal(err)
	}
	for _, codec := range schemas.Codecs {
		enc, err := schemas.NewEncoder(codec)
		if err != nil {
			b.Fatal(err)
		}
		body, err := enc.Encode(nil, recs)
		if err != nil {
			b.Fatal(err)
		}
		b.Run("encode/"+codec, func(b *testing.B) {
			var out []byte
			for b.Loop() {
				out, _ = enc.Encode(out[:0], recs)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
			b.ReportMetric(float64(len(out))/float64(len(recs)), "B/record")
			b.ReportMetric(float64(len(out))/float64(len(plain)), "size_vs_none")
		})
		b.Run("decode/"+codec, func(b *testing.B) {
			dec := schemas.NewDecoder()
			var out []schemas.Flow
			for b.Loop() {
				if out, err = dec.Decode(out[:0], body); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
		})
	}
}
