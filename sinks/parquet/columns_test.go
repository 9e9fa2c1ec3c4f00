package parquet

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
	"weak"

	pq "github.com/parquet-go/parquet-go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/internal/units"

	"github.com/tapflow/tapflow/internal/testkit/parquettest"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

// wireRows turns records into the Rows the collector decodes from the
// wire (codec as the agent publishes), one chunk per batch of size.
func wireRows(t testing.TB, recs []schemas.Flow, size int, codec string) [][]schemas.Row {
	t.Helper()
	enc, err := schemas.NewEncoder(codec)
	if err != nil {
		t.Fatal(err)
	}
	dec := schemas.NewDecoderFor(schemas.FlowRows)
	var out [][]schemas.Row
	for i := 0; i < len(recs); i += size {
		body, err := enc.Encode(nil, recs[i:min(i+size, len(recs))])
		if err != nil {
			t.Fatal(err)
		}
		rows, err := dec.Decode(nil, body)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rows)
	}
	return out
}

// TestRowsRoundTrip writes the same records through FlowRowSchema (the
// collector's columnar path) and FlowSchema (records): the files read
// back hold the same rows, with the same Parquet schema and metadata.
func TestRowsRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name        string
		records     int
		batch       int
		span        time.Duration
		codec       string
		compression string
		rowGroup    int
		partitions  int
	}{
		{"zstd wire, zstd files, 4 hours", 40000, 1000, 3 * time.Hour, schemas.CodecZstd, CompressionZstd, 4096, 4},
		{"plain wire, snappy, one hour", 5000, 5000, 10 * time.Minute, schemas.CodecNone, CompressionSnappy, 1024, 1},
		{"lz4 wire, small batches", 3000, 7, 2 * time.Hour, schemas.CodecLZ4, CompressionNone, 1024, 3},
		{"hours interleaved in every batch", 20000, 4096, 5 * time.Hour, schemas.CodecArrowZstd, CompressionZstd, 1024, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := parquettest.Flows(parquettest.Spec{Records: tc.records, Span: tc.span})
			if tc.name == "hours interleaved in every batch" {
				// time_end not in order: the sink groups each batch by hour.
				for i, j := 0, len(want)-1; i < j; i, j = i+2, j-2 {
					want[i], want[j] = want[j], want[i]
				}
			}
			for i := range want {
				want[i].AgentID, want[i].BatchSeq, want[i].RecordIndex = "agent-x", int64(i/tc.batch)+1, int32(i%tc.batch)
			}
			cfg := testConfig(t)
			cfg.Compression, cfg.RowGroupRows = tc.compression, tc.rowGroup
			s, err := NewFor(cfg, FlowRowSchema, Options{Node: "node-a", Logger: slog.New(&logCounter{}), Dedupe: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			in := make(chan *pipeline.BatchOf[schemas.Row])
			done := make(chan error, 1)
			go func() { done <- s.Run(context.Background(), in) }()
			a := newAcks()
			chunks := wireRows(t, want, tc.batch, tc.codec)
			for k, rows := range chunks {
				seq := int64(k + 1)
				b := pipeline.NewBatchOf(rows, func(err error) {
					a.mu.Lock()
					defer a.mu.Unlock()
					a.err[seq] = err
					a.calls[seq]++
				})
				b.Seq = seq
				in <- b
			}
			close(in)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if ok, failed := a.state(); ok != len(chunks) || failed != 0 {
				t.Fatalf("acks: %d ok, %d failed; want %d ok", ok, failed, len(chunks))
			}
			got := readOutput(t, cfg.Output, "node-a")
			if len(got.rows) != tc.records {
				t.Fatalf("read %d rows, wrote %d", len(got.rows), tc.records)
			}
			sortFlows(got.rows)
			sorted := append([]schemas.Flow(nil), want...)
			sortFlows(sorted)
			if !reflect.DeepEqual(got.rows, sorted) {
				t.Error("records read back differ from the records written")
			}
			if len(got.files) != tc.partitions {
				t.Errorf("files %v, want one per partition (%d)", got.files, tc.partitions)
			}
			for _, rel := range got.files {
				pf := openParquet(t, filepath.Join(cfg.Output, "flows", rel))
				if !pq.EqualNodes(pf.Schema(), schemas.ParquetSchema()) {
					t.Errorf("%s: schema\n%s\nwant\n%s", rel, pf.Schema(), schemas.ParquetSchema())
				}
				if v, _ := pf.Lookup(schemas.VersionKey); v != schemas.FlowTable.Version() {
					t.Errorf("%s: %s=%q, want %q", rel, schemas.VersionKey, v, schemas.FlowTable.Version())
				}
				if v, _ := pf.Lookup(MetadataBatches); v == "" {
					t.Errorf("%s: no %s", rel, MetadataBatches)
				}
				for _, rg := range pf.Metadata().RowGroups {
					if rg.NumRows > int64(tc.rowGroup) {
						t.Errorf("%s: row group of %d rows > row_group_rows %d", rel, rg.NumRows, tc.rowGroup)
					}
				}
			}
		})
	}
}

// TestRowsDedupe: a redelivered message (the same agent batch in a new
// stream sequence) is not written twice by the columnar path, across a
// restart of the sink.
func TestRowsDedupe(t *testing.T) {
	want := parquettest.Flows(parquettest.Spec{Records: 6000, Span: 2 * time.Hour})
	for i := range want {
		want[i].AgentID, want[i].BatchSeq, want[i].RecordIndex = "agent-x", int64(i/1000)+1, int32(i%1000)
	}
	chunks := wireRows(t, want, 1000, schemas.CodecZstd)
	cfg := testConfig(t)
	runOnce := func(seqs []int64, msgs [][]schemas.Row) {
		s, err := NewFor(cfg, FlowRowSchema, Options{Node: "node-a", Logger: slog.New(&logCounter{}), Dedupe: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		in := make(chan *pipeline.BatchOf[schemas.Row], len(msgs))
		for k, rows := range msgs {
			b := pipeline.NewBatchOf(rows, func(err error) {
				if err != nil {
					t.Errorf("batch %d: %v", k, err)
				}
			})
			b.Seq = seqs[k]
			in <- b
		}
		close(in)
		if err := s.Run(context.Background(), in); err != nil {
			t.Fatal(err)
		}
	}
	runOnce([]int64{1, 2, 3, 4}, chunks[:4])
	// Redelivery of 3 and 4 (decoded again), then the rest.
	again := wireRows(t, want, 1000, schemas.CodecZstd)
	runOnce([]int64{7, 8, 9, 10}, [][]schemas.Row{again[2], again[3], chunks[4], chunks[5]})
	got := readOutput(t, cfg.Output, "node-a")
	if len(got.rows) != len(want) {
		t.Fatalf("read %d rows, want %d (duplicates written?)", len(got.rows), len(want))
	}
	sortFlows(got.rows)
	sortFlows(want)
	if !reflect.DeepEqual(got.rows, want) {
		t.Error("records read back differ")
	}
	if _, err := os.Stat(cfg.Output); err != nil {
		t.Fatal(err)
	}
}

// settledGrowth is the live heap's growth since before, the least of
// three samples 20 ms apart: a sample can land while the sink is in the
// middle of a roll and read a transient that the next one no longer
// sees; memory the sink keeps stays in every sample.
func settledGrowth(before uint64) int64 {
	g := int64(liveHeap()) - int64(before)
	for range 2 {
		time.Sleep(20 * time.Millisecond)
		g = min(g, int64(liveHeap())-int64(before))
	}
	return g
}

// TestRowsMemoryBounded is TestMemoryBounded for the columnar path: a
// written message's Arrow columns are let go while its file is open
// (only its ack waits for the commit), and pushing 10× roll_size through
// keeps the live heap bounded, with every record committed once.
func TestRowsMemoryBounded(t *testing.T) {
	const perBatch = 4096
	const bound = 16 << 20 // live-heap growth allowed (settled), bytes
	base := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	enc, err := schemas.NewEncoder(schemas.CodecLZ4)
	if err != nil {
		t.Fatal(err)
	}
	dec := schemas.NewDecoderFor(schemas.FlowRows)
	for _, tc := range []struct {
		name     string
		rollSize int64
		batches  int
		hours    int
		open     bool // the file stays open until the input closes
	}{
		{name: "one open file holds many messages", rollSize: 1 << 30, batches: 96, hours: 1, open: true},
		{name: "10x roll_size over several hours", rollSize: 64 << 10, batches: 96, hours: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.RollSize = units.ByteSize(tc.rollSize)
			cfg.RollAge = units.Duration(time.Hour)
			cfg.RowGroupRows = 4096
			s, err := NewFor(cfg, FlowRowSchema, Options{Node: "node-a", Logger: slog.New(&logCounter{}), Dedupe: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			a := newAcks()
			in := make(chan *pipeline.BatchOf[schemas.Row])
			done := make(chan error, 1)
			go func() { done <- s.Run(context.Background(), in) }()
			before := liveHeap()
			var released []weak.Pointer[schemas.Chunk]
			var sent uint64
			maxGrowth := int64(0)
			for i := range tc.batches {
				seq := int64(i + 1)
				body, err := enc.Encode(nil, agentBatch("agent-a", seq, perBatch, tc.hours, base))
				if err != nil {
					t.Fatal(err)
				}
				rows, err := dec.Decode(nil, body)
				if err != nil {
					t.Fatal(err)
				}
				sent += uint64(len(body)) * 3 // the decoded columns: ≥ 3× the lz4 body
				released = append(released, weak.Make(rows[0].Chunk()))
				b := pipeline.NewBatchOf(rows, func(err error) {
					a.mu.Lock()
					defer a.mu.Unlock()
					a.err[seq] = err
					a.calls[seq]++
				})
				b.Seq = seq
				in <- b
				if i%16 == 15 {
					maxGrowth = max(maxGrowth, settledGrowth(before))
				}
			}
			maxGrowth = max(maxGrowth, settledGrowth(before))
			if tc.open {
				if ok, failed := a.state(); ok+failed != 0 {
					t.Fatalf("%d messages acked before the commit; want none (the file is open)", ok+failed)
				}
				kept := 0
				for _, w := range released[:len(released)-2] { // the last may still be in the sink's hands
					if w.Value() != nil {
						kept++
					}
				}
				if kept > 0 {
					t.Errorf("%d of %d written messages still have their columns in memory while the file is open; want 0", kept, len(released)-2)
				}
			}
			if maxGrowth > bound {
				t.Errorf("live heap grew by %d MiB while ≥ %d MiB of columns went through; want at most %d MiB", maxGrowth>>20, sent>>20, bound>>20)
			}
			close(in)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if ok, failed := a.state(); ok != tc.batches || failed != 0 {
				t.Fatalf("%d messages acked ok, %d failed; want %d ok", ok, failed, tc.batches)
			}
			committed := testutil.ToFloat64(s.m.bytes)
			if !tc.open && committed < 10*float64(tc.rollSize) {
				t.Errorf("%v bytes committed; want at least 10× roll_size (%d)", committed, 10*tc.rollSize)
			}
			want := make([][]schemas.Flow, tc.batches)
			for i := range want {
				want[i] = agentBatch("agent-a", int64(i+1), perBatch, tc.hours, base)
			}
			exactlyOnce(t, cfg.Output, want)
			t.Logf("%d records (≥ %d MiB of columns, %v bytes committed): live heap growth at most %d KiB", tc.batches*perBatch, sent>>20, committed, maxGrowth>>10)
		})
	}
}
