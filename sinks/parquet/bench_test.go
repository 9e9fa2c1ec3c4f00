package parquet

import (
	"context"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/testkit/jsonl"
	"github.com/tapflow/tapflow/internal/testkit/parquettest"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

const (
	benchRecords = 1_000_000
	benchBatch   = 8192 // records per batch (one NATS message)
)

// benchFlows is the shared benchmark set: 1M records, ~100 tenants, 7
// zones, 5000 ports on 200 nodes, over 2 hours (3 partitions).
var benchFlows = sync.OnceValue(func() []schemas.Flow {
	return parquettest.Flows(parquettest.Spec{Records: benchRecords, Span: 2 * time.Hour})
})

// BenchmarkParquetSink measures the Parquet sink end to end (partition,
// encode, compress, write, commit with fsync) per compression choice.
// Reported: records/s (wall), records/cpu-s, B/record on disk.
func BenchmarkParquetSink(b *testing.B) {
	for _, c := range []string{CompressionZstd, CompressionZstdDefault, CompressionSnappy} {
		b.Run(c, func(b *testing.B) {
			benchSink(b, func(dir string) (pipeline.Sink, func()) {
				cfg := DefaultConfig()
				cfg.Output, cfg.Compression = dir, c
				s, err := New(cfg, Options{Node: "bench", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				if err != nil {
					b.Fatal(err)
				}
				return s, func() { _ = s.Close() }
			})
		})
	}
}

// BenchmarkJSONLinesSink is the naive baseline: encoding/json per record
// into one file, fsynced at the end.
func BenchmarkJSONLinesSink(b *testing.B) {
	benchSink(b, func(dir string) (pipeline.Sink, func()) {
		s, err := jsonl.New(filepath.Join(dir, "flows.jsonl"))
		if err != nil {
			b.Fatal(err)
		}
		return s, func() { _ = s.Close() }
	})
}

func benchSink(b *testing.B, mk func(dir string) (pipeline.Sink, func())) {
	benchSinkRecs(b, benchFlows(), mk)
}

// BenchmarkParquetSinkDedupe is the default (zstd) sink with the
// committed-batch ledger on, as the collector runs it: every 8192-record
// batch carries its own (agent_id, batch_seq), like a NATS message.
func BenchmarkParquetSinkDedupe(b *testing.B) {
	recs := slices.Clone(benchFlows())
	for i := range recs {
		recs[i].AgentID, recs[i].BatchSeq, recs[i].RecordIndex = "agent-bench", int64(i/benchBatch)+1, int32(i%benchBatch)
	}
	benchSinkRecs(b, recs, func(dir string) (pipeline.Sink, func()) {
		cfg := DefaultConfig()
		cfg.Output = dir
		s, err := New(cfg, Options{Node: "bench", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Dedupe: true})
		if err != nil {
			b.Fatal(err)
		}
		return s, func() { _ = s.Close() }
	})
}

func benchSinkRecs(b *testing.B, recs []schemas.Flow, mk func(dir string) (pipeline.Sink, func())) {
	var diskBytes int64
	var cpu time.Duration
	for b.Loop() {
		b.StopTimer()
		dir, err := os.MkdirTemp(b.TempDir(), "run")
		if err != nil {
			b.Fatal(err)
		}
		s, closeSink := mk(dir)
		var ok, failed atomic.Int64
		in := make(chan *pipeline.Batch, 16)
		cpu0 := cpuTime()
		b.StartTimer()

		done := make(chan error, 1)
		go func() { done <- s.Run(context.Background(), in) }()
		for i := 0; i < len(recs); i += benchBatch {
			bt := pipeline.NewBatch(recs[i:min(i+benchBatch, len(recs))], func(err error) {
				if err != nil {
					failed.Add(1)
				} else {
					ok.Add(1)
				}
			})
			bt.Seq = int64(i/benchBatch) + 1
			in <- bt
		}
		close(in)
		if err := <-done; err != nil {
			b.Fatal(err)
		}

		b.StopTimer()
		cpu += cpuTime() - cpu0
		if want := int64((len(recs) + benchBatch - 1) / benchBatch); ok.Load() != want || failed.Load() != 0 {
			b.Fatalf("acks: %d ok, %d failed; want %d ok", ok.Load(), failed.Load(), want)
		}
		diskBytes = 0
		_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				if info, err := d.Info(); err == nil {
					diskBytes += info.Size()
				}
			}
			return nil
		})
		closeSink()
		_ = os.RemoveAll(dir)
		b.StartTimer()
	}
	n := float64(len(recs) * b.N)
	b.ReportMetric(n/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(n/cpu.Seconds(), "records/cpu-s")
	b.ReportMetric(float64(diskBytes)/float64(len(recs)), "B/record")
}

// cpuTime is the CPU time (user + system) of the process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
