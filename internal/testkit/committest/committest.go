// Package committest commits flow.v1 records through the real collector
// Parquet sink (sinks/parquet), the way the collector writes them, for
// the tests of the readers of its output (report, billing).
package committest

import (
	"context"
	"testing"

	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/sinks/parquet"
)

// Flows writes recs with a sink of cfg and opts, in batches of 1000
// (sequence numbers from 1), and fails t unless every batch is acked
// without error. The sink is closed in t.Cleanup.
func Flows(t testing.TB, recs []schemas.Flow, cfg parquet.Config, opts parquet.Options) {
	t.Helper()
	s, err := parquet.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	in := make(chan *pipeline.Batch, 4)
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background(), in) }()
	failed := 0
	for i := 0; i < len(recs); i += 1000 {
		b := pipeline.NewBatch(recs[i:min(i+1000, len(recs))], func(err error) {
			if err != nil {
				failed++
			}
		})
		b.Seq = int64(i/1000) + 1
		in <- b
	}
	close(in)
	if err := <-done; err != nil || failed > 0 {
		t.Fatalf("sink: %v, %d batches failed", err, failed)
	}
}
