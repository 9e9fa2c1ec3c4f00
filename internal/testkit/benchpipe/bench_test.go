package benchpipe

import (
	"context"
	"hash/maphash"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/testkit/jsonl"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/sinks/parquet"
	"github.com/tapflow/tapflow/synthetic"
	"github.com/tapflow/tapflow/transport"
	"github.com/tapflow/tapflow/transport/consume"
	"github.com/tapflow/tapflow/transport/publish"
)

const benchRecords = 500_000

var quiet = slog.New(slog.DiscardHandler)

var (
	genOnce sync.Once
	genRecs [][]schemas.Flow
	genSum  uint64 // fingerprint of genRecs (unchanged)
)

// records generates benchRecords attributed synthetic records once, in
// batches of 16384 (the default batch size).
func records(b *testing.B) [][]schemas.Flow {
	genOnce.Do(func() {
		cfg := synthetic.DefaultConfig()
		cfg.RecordsPerSecond, cfg.Attributed = 0, true
		src, err := synthetic.New(cfg, synthetic.Options{Node: "bench", Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		out := make(chan *pipeline.Batch, 4)
		go func() { _ = src.Run(ctx, out); close(out) }()
		n := 0
		for bt := range out {
			if n < benchRecords {
				genRecs = append(genRecs, bt.Records)
				n += len(bt.Records)
			} else {
				cancel()
			}
			bt.Ack(nil)
		}
		cancel()
		genSum = fingerprint(genRecs)
	})
	return genRecs
}

// The pipelines are handed the generated batches themselves: neither
// writes to its input records (the publisher encodes them, the JSON-lines
// sink encodes them as they are: the synthetic records carry their text
// as well as the binary form, so its FillText writes nothing), and
// unchanged checks that after each benchmark. A copy per batch
// (7.5 MB, with its garbage) was a third of the Parquet pipeline's CPU
// in the run, for work neither pipeline does.
func batchOf(recs []schemas.Flow) *pipeline.Batch {
	return pipeline.NewBatch(recs[:len(recs):len(recs)], nil)
}

// fingerprint hashes the records' bytes (their string headers included).
func fingerprint(batches [][]schemas.Flow) uint64 {
	var h maphash.Hash
	h.SetSeed(fingerprintSeed)
	for _, recs := range batches {
		if len(recs) > 0 {
			h.Write(unsafe.Slice((*byte)(unsafe.Pointer(&recs[0])), len(recs)*int(unsafe.Sizeof(recs[0]))))
		}
	}
	return h.Sum64()
}

var fingerprintSeed = maphash.MakeSeed()

// unchanged fails b when a pipeline wrote to the generated records.
func unchanged(b *testing.B) {
	if fingerprint(genRecs) != genSum {
		b.Fatal("the pipeline wrote to its input records: the benchmark must copy them")
	}
}

// replay is a source sending the pre-generated batches once.
type replay struct{ batches [][]schemas.Flow }

func (r *replay) Name() string { return "replay" }
func (r *replay) Run(ctx context.Context, out chan<- *pipeline.Batch) error {
	for _, recs := range r.batches {
		out <- batchOf(recs)
	}
	<-ctx.Done()
	return nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

func report(b *testing.B, n int, wall, cpu time.Duration, diskBytes int64) {
	recs := float64(n) * float64(b.N)
	b.ReportMetric(recs/wall.Seconds(), "records/s")
	b.ReportMetric(recs/cpu.Seconds(), "records/cpu-s")
	b.ReportMetric(float64(diskBytes)/float64(n), "disk-B/record")
	b.ReportMetric(0, "ns/op")
}

func count(batches [][]schemas.Flow) int {
	n := 0
	for _, b := range batches {
		n += len(b)
	}
	return n
}

// BenchmarkPipelineParquet: records → Arrow IPC (the default wire codec,
// lz4) → JetStream (embedded, in-process) → durable consumer → Parquet
// (zstd), the path of `tapflow run`, in one process: the collector keeps
// every message in its Arrow columns (schemas.Row) and writes them
// straight into the Parquet column writers.
func BenchmarkPipelineParquet(b *testing.B) { benchPipelineParquet(b, true, "", false) }

// BenchmarkPipelineParquetRows is the same pipeline with the collector's
// former record path (messages decoded into schemas.Flow, written by
// GenericWriter[Flow]), kept as the baseline of the columnar one.
func BenchmarkPipelineParquetRows(b *testing.B) { benchPipelineParquet(b, false, "", false) }

// BenchmarkPipelineCodec is BenchmarkPipelineParquet with each wire codec
// (nats.codec): agent encode, NATS and collector decode CPU together, and
// wire-B/record (stream bytes per record, headers included).
// <codec>-plain is the same with the plain utf8 wire strings of agents
// before wire dictionaries: the baseline of the dictionary form.
func BenchmarkPipelineCodec(b *testing.B) {
	for _, c := range schemas.Codecs {
		b.Run(c, func(b *testing.B) { benchPipelineParquet(b, true, c, false) })
		b.Run(c+"-plain", func(b *testing.B) { benchPipelineParquet(b, true, c, true) })
	}
}

// collectorFor builds the collector pipeline of either path.
func collectorFor(b *testing.B, s *transporttest.Server, out string, cols bool) interface{ Run(context.Context) error } {
	pcfg := parquet.DefaultConfig()
	pcfg.Output = out
	jcfg := consume.DefaultConfig()
	jcfg.AckWait = units.Duration(10 * time.Minute)
	opts := parquet.Options{Node: "bench", Logger: quiet, Registry: prometheus.NewRegistry()}
	copts := consume.Options{Drain: true, Logger: quiet}
	if cols {
		sink, err := parquet.NewFor(pcfg, parquet.FlowRowSchema, opts)
		if err != nil {
			b.Fatal(err)
		}
		src, err := consume.NewRows(s.JS, jcfg, copts)
		if err != nil {
			b.Fatal(err)
		}
		coll, err := pipeline.NewRunnerOf(pipeline.Config{Name: "collector"}, src, nil, sink, nil, quiet)
		if err != nil {
			b.Fatal(err)
		}
		return coll
	}
	sink, err := parquet.New(pcfg, opts)
	if err != nil {
		b.Fatal(err)
	}
	src, err := consume.New(s.JS, jcfg, copts)
	if err != nil {
		b.Fatal(err)
	}
	coll, err := pipeline.NewRunner(pipeline.Config{Name: "collector"}, src, nil, sink, nil, quiet)
	if err != nil {
		b.Fatal(err)
	}
	return coll
}

func benchPipelineParquet(b *testing.B, cols bool, codec string, plain bool) {
	batches := records(b)
	n := count(batches)
	s := transporttest.Run(b, "")
	var wall, cpu time.Duration
	var disk int64
	for i := 0; b.Loop(); i++ {
		out := b.TempDir()
		ncfg := transport.DefaultConfig()
		if codec != "" {
			ncfg.Codec = codec
		}
		pub, err := publish.New(s.JS, publish.Options{AgentID: "bench", Node: "bench", StateDir: b.TempDir(), NATS: ncfg, Logger: quiet, PlainStrings: plain})
		if err != nil {
			b.Fatal(err)
		}
		agent, _ := pipeline.NewRunner(pipeline.Config{Name: "agent"}, &replay{batches}, nil, pub, nil, quiet)
		coll := collectorFor(b, s, out, cols)

		startWall, startCPU := time.Now(), cpuTime()
		aCtx, aStop := context.WithCancel(context.Background())
		cCtx, cStop := context.WithCancel(context.Background())
		cDone := make(chan error, 1)
		go func() { cDone <- coll.Run(cCtx) }()
		go func() {
			// the replay source returns after its context ends; stop it
			// once every batch is acked by JetStream
			for sentAll := false; !sentAll; {
				time.Sleep(5 * time.Millisecond)
				sentAll = pubDone(s, n)
			}
			aStop()
		}()
		if err := agent.Run(aCtx); err != nil {
			b.Fatal(err)
		}
		cStop()
		if err := <-cDone; err != nil {
			b.Fatal(err)
		}
		wall += time.Since(startWall)
		cpu += cpuTime() - startCPU
		disk = dirSize(filepath.Join(out, "flows"))
		// purge so every iteration starts from an empty stream
		st, _ := s.JS.Stream(context.Background(), transport.FlowsStream)
		_ = st.Purge(context.Background())
	}
	unchanged(b)
	report(b, n, wall, cpu, disk)
	if codec != "" {
		b.ReportMetric(wireBytes(b, batches, codec, plain)/float64(n), "wire-B/record")
	}
}

// wireBytes is what the message bodies of batches weigh with codec (the
// stream's retention drops acked messages, so it is computed, not read).
func wireBytes(b *testing.B, batches [][]schemas.Flow, codec string, plain bool) float64 {
	enc, err := schemas.NewEncoder(codec)
	if err != nil {
		b.Fatal(err)
	}
	if plain {
		enc = enc.PlainStrings()
	}
	var n int
	for _, recs := range batches {
		body, err := enc.Encode(nil, recs)
		if err != nil {
			b.Fatal(err)
		}
		n += len(body)
	}
	return float64(n)
}

// pubDone reports whether the stream has received n records' worth of
// messages (one message per 16384-record batch, rounded up per batch).
func pubDone(s *transporttest.Server, n int) bool {
	st, err := s.JS.Stream(context.Background(), transport.FlowsStream)
	if err != nil {
		return false
	}
	info, err := st.Info(context.Background())
	return err == nil && info.State.Msgs >= uint64(len(genRecs)) && n > 0
}

// BenchmarkPipelineJSONLines is the naive baseline: the same records
// written as JSON lines (encoding/json) to one file.
func BenchmarkPipelineJSONLines(b *testing.B) {
	batches := records(b)
	n := count(batches)
	var wall, cpu time.Duration
	var disk int64
	for b.Loop() {
		path := filepath.Join(b.TempDir(), "flows.jsonl")
		sink, err := jsonl.New(path)
		if err != nil {
			b.Fatal(err)
		}
		startWall, startCPU := time.Now(), cpuTime()
		in := make(chan *pipeline.Batch, 16)
		go func() {
			for _, recs := range batches {
				in <- batchOf(recs)
			}
			close(in)
		}()
		if err := sink.Run(context.Background(), in); err != nil {
			b.Fatal(err)
		}
		wall += time.Since(startWall)
		cpu += cpuTime() - startCPU
		st, _ := os.Stat(path)
		disk = st.Size()
	}
	unchanged(b)
	report(b, n, wall, cpu, disk)
}
