package consume_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/transport/consume"
)

// TestRowsSourceExactCounts: the collector's columnar source (NewRows)
// delivers every published record once, as schemas.Row whose identity
// and values read back from the message's columns.
func TestRowsSourceExactCounts(t *testing.T) {
	for _, sizes := range [][]int{{1}, {10, 0, 2000}, {5000, 5000, 7}} {
		t.Run(fmt.Sprint(sizes), func(t *testing.T) {
			s := transporttest.Run(t, "")
			publishBatches(t, s, sizes)
			want, wantBytes := 0, int64(0)
			for i, n := range sizes {
				want += n
				for j := range n {
					wantBytes += int64(100*i + j)
				}
			}
			cfg := consume.DefaultConfig()
			cfg.AckWait = units.Duration(2 * time.Second)
			src, err := consume.NewRows(s.JS, cfg, consume.Options{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			out := make(chan *pipeline.BatchOf[schemas.Row], 4)
			done := make(chan error, 1)
			go func() { done <- src.Run(ctx, out) }()
			bytesCol := schemas.FlowRows.ColumnIndex("bytes")
			got, bytes := 0, int64(0)
			seen := map[[2]int64]bool{}
			for got < want {
				select {
				case b := <-out:
					for _, r := range b.Records {
						k := [2]int64{r.BatchSeq(), int64(r.RecordIndex())}
						if seen[k] || r.AgentID() != "cmp1" || r.Node() != "cmp1" {
							t.Fatalf("duplicate or unstamped row %v agent %q node %q", k, r.AgentID(), r.Node())
						}
						seen[k] = true
						bytes += r.Int64(bytesCol)
					}
					got += len(b.Records)
					b.Ack(nil)
				case <-ctx.Done():
					t.Fatalf("got %d rows, want %d", got, want)
				}
			}
			cancel()
			go func() {
				for b := range out {
					b.Ack(nil)
				}
			}()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			close(out)
			if got != want || bytes != wantBytes {
				t.Fatalf("got %d rows / %d bytes, want %d / %d", got, bytes, want, wantBytes)
			}
		})
	}
}
