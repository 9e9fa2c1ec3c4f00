package parquet

import (
	"context"
	"sync/atomic"

	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

// sliceSource emits recs in batches, signals sent, then waits for ctx.
type sliceSource struct {
	recs       []schemas.Flow
	size       int
	sent       chan struct{}
	ok, failed atomic.Int64
}

func (s *sliceSource) Name() string { return "slice" }

func (s *sliceSource) Run(ctx context.Context, out chan<- *pipeline.Batch) error {
	for i := 0; i < len(s.recs); i += s.size {
		part := s.recs[i:min(i+s.size, len(s.recs))]
		b := pipeline.NewBatch(part, func(err error) {
			if err != nil {
				s.failed.Add(int64(len(part)))
				return
			}
			s.ok.Add(int64(len(part)))
		})
		b.Seq = int64(i/s.size) + 1
		out <- b
	}
	close(s.sent)
	<-ctx.Done()
	return nil
}
