package parquet

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/testkit/parquettest"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

// broker plays JetStream for the release tests: wire bodies by stream
// sequence, each delivery decoded anew (as consume does) by a decoder
// recycling its buffers through a poisoning pool.
type broker struct {
	t      *testing.T
	bodies map[int64][]byte
	dec    *schemas.DecoderOf[schemas.Row]
	pool   *schemas.BufferPool
	// maxLive is the most messages decoded and not yet released at once.
	mu      sync.Mutex
	maxLive int64
	maxIdle int64
}

// round delivers seqs to a new sink (a collector process) over cfg and
// returns each seq's ack.
func (br *broker) round(cfg Config, seqs []int64, commitEvery int) map[int64]error {
	t := br.t
	t.Helper()
	batches := 0
	s, err := NewFor(cfg, FlowRowSchema, Options{Node: "node-a", Logger: slog.New(slog.DiscardHandler), Dedupe: true,
		CommitDue: func() string {
			if batches++; commitEvery > 0 && batches%commitEvery == 0 {
				return "test"
			}
			return ""
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	in := make(chan *pipeline.BatchOf[schemas.Row])
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background(), in) }()
	var mu sync.Mutex
	acked := map[int64]error{}
	for _, seq := range seqs {
		rows, err := br.dec.Decode(nil, br.bodies[seq])
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		br.observe()
		b := pipeline.NewBatchOf(rows, func(err error) {
			br.observe()
			mu.Lock()
			defer mu.Unlock()
			if _, again := acked[seq]; again {
				t.Errorf("seq %d acked twice", seq)
			}
			acked[seq] = err
		})
		b.Seq = seq
		in <- b
	}
	close(in)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(acked) != len(seqs) {
		t.Fatalf("%d of %d deliveries acked", len(acked), len(seqs))
	}
	return acked
}

func (br *broker) observe() {
	st := br.pool.Stats()
	br.mu.Lock()
	br.maxLive = max(br.maxLive, st.Messages)
	br.maxIdle = max(br.maxIdle, st.Idle)
	br.mu.Unlock()
}

// TestPooledRowsReleasedOnlyWhenWritten: the collector's decode buffers
// are recycled (through a pool far smaller than what passes) and
// poisoned the moment they are given back, yet every record written
// reads back from the Parquet files exactly as sent: the sink releases a
// message's rows only once nothing reads them any more, across size and
// early rolls, row-group flushes, a failed partition (its batches nacked
// and redelivered, decoded anew), a batch the sink refuses, and a crash
// after commit (every message redelivered to a new sink, its committed
// pieces dropped by the ledger). Any early release would put poison or
// another message's bytes into a file, or trip -race.
func TestPooledRowsReleasedOnlyWhenWritten(t *testing.T) {
	const (
		perMsg   = 500
		msgs     = 60
		poolCap  = 256 << 10
		rowGroup = 1024 // the least allowed: flushed inside files and messages
	)
	for _, codec := range []string{schemas.CodecLZ4, schemas.CodecNone, schemas.CodecArrowZstd, schemas.CodecZstd} {
		t.Run(codec, func(t *testing.T) {
			all := parquettest.Flows(parquettest.Spec{Records: msgs * perMsg, Span: 3 * time.Hour})
			for i := range all {
				all[i].AgentID, all[i].BatchSeq, all[i].RecordIndex = "agent-x", int64(i/perMsg)+1, int32(i%perMsg)
			}
			const bad = 9 // its time_end is 1970: the sink refuses it (consume dead-letters such)
			enc, err := schemas.NewEncoder(codec)
			if err != nil {
				t.Fatal(err)
			}
			bodies := map[int64][]byte{}
			var want []schemas.Flow
			for k := range msgs {
				recs := append([]schemas.Flow(nil), all[k*perMsg:(k+1)*perMsg]...)
				seq := int64(k + 1)
				if seq == bad {
					for i := range recs {
						recs[i].TimeEnd = 1000
					}
				} else {
					want = append(want, recs...)
				}
				if bodies[seq], err = enc.Encode(nil, recs); err != nil {
					t.Fatal(err)
				}
			}
			pool := schemas.NewBufferPool(poolCap).Poisoned()
			lim, err := schemas.NewDecoderFor(schemas.FlowRows).Limited(64<<20, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			br := &broker{t: t, bodies: bodies, dec: lim.WithPool(pool), pool: pool}
			cfg := testConfig(t)
			cfg.RowGroupRows = rowGroup

			// Round 1: the first 40 messages; the hour of message 20 is
			// unwritable (a file where its partition directory goes).
			blocked := filepath.Join(cfg.Output, "flows", partition(hourOf(all[20*perMsg].TimeEnd)))
			mustMkdir(t, filepath.Dir(blocked))
			if err := os.WriteFile(blocked, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			seqs := make([]int64, 40)
			for i := range seqs {
				seqs[i] = int64(i + 1)
			}
			acks := br.round(cfg, seqs, 3)
			var failed []int64
			for _, seq := range seqs {
				switch err := acks[seq]; {
				case seq == bad:
					var re *RangeError
					if !errors.As(err, &re) {
						t.Fatalf("bad message acked with %v, want a *RangeError", err)
					}
				case err != nil:
					failed = append(failed, seq)
				}
			}
			if len(failed) == 0 {
				t.Fatal("no batch failed in the blocked partition")
			}
			if err := os.Remove(blocked); err != nil {
				t.Fatal(err)
			}

			// Round 2, a new sink after a crash that lost every ack of
			// round 1: all of round 1 again (committed pieces dropped, the
			// failed ones written), then the rest.
			var again []int64
			for _, seq := range seqs {
				if seq != bad {
					again = append(again, seq)
				}
			}
			for seq := int64(41); seq <= msgs; seq++ {
				again = append(again, seq)
			}
			for seq, err := range br.round(cfg, again, 4) {
				if err != nil {
					t.Fatalf("round 2: seq %d: %v", seq, err)
				}
			}

			got := readOutput(t, cfg.Output, "node-a")
			if len(got.temps) > 0 {
				t.Errorf("temp files left: %v", got.temps)
			}
			if len(got.rows) != len(want) {
				t.Fatalf("read %d rows, want %d", len(got.rows), len(want))
			}
			sortFlows(got.rows)
			sortFlows(want)
			if !reflect.DeepEqual(got.rows, want) {
				for i := range want {
					if !reflect.DeepEqual(got.rows[i], want[i]) {
						t.Fatalf("row %d read back\n%+v\nwant\n%+v", i, got.rows[i], want[i])
					}
				}
			}

			st := pool.Stats()
			t.Logf("pool: %+v; at most %d messages held, %d bytes idle", st, br.maxLive, br.maxIdle)
			if st.Messages != 0 || st.Out != 0 {
				t.Errorf("%d messages (%d bytes) never released", st.Messages, st.Out)
			}
			if br.maxIdle > poolCap {
				t.Errorf("idle buffers reached %d bytes, cap %d", br.maxIdle, poolCap)
			}
			if br.maxLive > 3 {
				t.Errorf("%d messages held at once; the sink releases each as it writes it", br.maxLive)
			}
			if codec != schemas.CodecZstd { // zstd frames decompress outside the pool
				if st.Bytes < 10*poolCap {
					t.Errorf("%d bytes through the pool, want ≥ 10× its cap %d", st.Bytes, poolCap)
				}
				if st.Hits == 0 || st.Returned == 0 {
					t.Errorf("nothing recycled: %+v", st)
				}
			}
		})
	}
}
