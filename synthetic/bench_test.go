package synthetic

import (
	"context"
	"testing"

	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

// BenchmarkGenerate: records/s of generation alone (default cloud and mix,
// 10,000 active flows) into a reused batch of 16384 records.
func BenchmarkGenerate(b *testing.B) {
	for _, attributed := range []bool{false, true} {
		name := "raw"
		if attributed {
			name = "attributed"
		}
		b.Run(name, func(b *testing.B) {
			c := DefaultConfig()
			c.Attributed = attributed
			s := newSource(b, c, Options{})
			g := newGenerator(c, s.topo, "node-1", 0)
			buf := make([]schemas.Flow, 0, c.BatchRecords)
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				buf = g.fill(buf[:0], c.BatchRecords, 1)
				n += len(buf)
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/record")
		})
	}
}

// BenchmarkRun: records/s through Run at records_per_second 0, batches of
// 16384 allocated per batch and handed to a consumer that acks them.
func BenchmarkRun(b *testing.B) {
	c := DefaultConfig()
	c.RecordsPerSecond = 0
	s := newSource(b, c, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan *pipeline.Batch, 4)
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx, out); close(out) }()
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		bt := <-out
		n += len(bt.Records)
		bt.Ack(nil)
	}
	b.StopTimer()
	cancel()
	for bt := range out {
		bt.Ack(nil)
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
}
