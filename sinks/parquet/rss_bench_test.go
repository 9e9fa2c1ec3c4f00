package parquet

import (
	"bufio"
	"context"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/testkit/parquettest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/synthetic"
	"github.com/tapflow/tapflow/transport/consume"
)

const (
	rssBatch = 16384 // records per NATS message (agent batch)
	rssHours = 8     // every message spans 8 hours: 8 open files
)

// rssMessages is 320 messages (5.2 M records) per iteration, or
// TAPFLOW_BENCH_RSS_MESSAGES: fewer for interleaved repeats on a loaded
// machine (the peak RSS figures need the 320).
var rssMessages = func() int {
	if n, err := strconv.Atoi(os.Getenv("TAPFLOW_BENCH_RSS_MESSAGES")); err == nil && n > 0 {
		return n
	}
	return 320
}()

// rssMessagesWire are the wire bodies (Arrow IPC) of 8 distinct
// messages (≈15 MiB in all with zstd, part of the RSS measured), each of
// rssBatch records spread over rssHours hours in time_end order, per
// codec: zstd (the agent's default until lz4 became it; the edge=N
// history is measured with it) and lz4 (columns-lz4: today's default).
//
// Messages are in the agent's wire form, dictionary-encoded strings; the
// "-plain" keys are the utf8 form of agents before wire dictionaries
// (the baseline of the dictionary path, same run).
var rssMessagesWire = map[string]func() [][]byte{}

func init() {
	for _, codec := range []string{schemas.CodecZstd, schemas.CodecLZ4, schemas.CodecNone} {
		rssMessagesWire[codec] = sync.OnceValue(func() [][]byte { return encodeRSSMessages(codec, false) })
		rssMessagesWire[codec+"-plain"] = sync.OnceValue(func() [][]byte { return encodeRSSMessages(codec, true) })
	}
}

func encodeRSSMessages(codec string, plain bool) [][]byte {
	const distinct = 8
	all := parquettest.Flows(parquettest.Spec{Records: distinct * rssBatch, Span: rssHours*time.Hour - time.Minute})
	enc, err := schemas.NewEncoder(codec)
	if err != nil {
		panic(err)
	}
	if plain {
		enc = enc.PlainStrings()
	}
	out := make([][]byte, distinct)
	for k := range out {
		recs := make([]schemas.Flow, 0, rssBatch)
		for j := k; j < len(all); j += distinct {
			recs = append(recs, all[j])
		}
		for i := range recs {
			recs[i].AgentID, recs[i].RecordIndex = "agent-bench", int32(i)
		}
		if out[k], err = enc.Encode(nil, recs); err != nil {
			panic(err)
		}
	}
	return out
}

// rssSource plays the collector's JetStream source: it decodes every
// message into fresh records (as consume does) and stamps its batch_seq.
type rssSource struct {
	msgs  [][]byte
	n     int
	acked *atomic.Int64
	nacks *atomic.Int64
}

func (s *rssSource) Name() string { return "bench-source" }

func (s *rssSource) Run(ctx context.Context, out chan<- *pipeline.Batch) error {
	dec := schemas.NewDecoder()
	for i := range s.n {
		recs, err := dec.Decode(nil, s.msgs[i%len(s.msgs)])
		if err != nil {
			return err
		}
		seq := int64(i + 1)
		for j := range recs {
			recs[j].BatchSeq = seq
		}
		b := pipeline.NewBatch(recs, func(err error) {
			if err != nil {
				s.nacks.Add(1)
			} else {
				s.acked.Add(1)
			}
		})
		b.Seq = seq
		select {
		case out <- b:
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}

// rssRowSource is rssSource for the columnar path: messages decoded into
// schemas.Row (FlowRows), batch_seq stamped in the decoded column, with
// the decode buffers recycled through a pool of the collector's default
// cap (the sink releases the rows it wrote), as consume does.
type rssRowSource struct {
	msgs  [][]byte
	n     int
	acked *atomic.Int64
	nacks *atomic.Int64
	pool  *schemas.BufferPool
}

func (s *rssRowSource) Name() string { return "bench-source" }

func (s *rssRowSource) Run(ctx context.Context, out chan<- *pipeline.BatchOf[schemas.Row]) error {
	dec := schemas.NewDecoderFor(schemas.FlowRows).WithPool(s.pool)
	col := schemas.FlowRows.ColumnIndex("batch_seq")
	for i := range s.n {
		rows, err := dec.Decode(nil, s.msgs[i%len(s.msgs)])
		if err != nil {
			return err
		}
		seq := int64(i + 1)
		if len(rows) > 0 {
			// The body was decompressed (zstd, lz4) into fresh memory:
			// the column is this message's own.
			v := rows[0].Chunk().Int64s(col)
			for j := range v {
				v[j] = seq
			}
		}
		b := pipeline.NewBatchOf(rows, func(err error) {
			if err != nil {
				s.nacks.Add(1)
			} else {
				s.acked.Add(1)
			}
		})
		b.Seq = seq
		select {
		case out <- b:
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}

// BenchmarkCollectorRSS runs the collector's flow pipeline (decode →
// runner edges → Parquet sink with dedupe) at
// the default sink config over messages of 16,384 records from one agent,
// each spanning 8 hours, so 8 files stay open. The feed is not paced: at
// 200k records/s and more, files roll by size (not age), so what the sink
// holds between commits is the same as at any paced rate above that.
//
// edge=16 is the runner's edge capacity the collector uses today
// (agent.edge_capacity): up to ~35 decoded batches (≈9 MiB each) wait
// between source and sink. edge=2 shows what a collector-specific small
// queue would give (JetStream is the collector's buffer).
//
// edge=N is today's record path (messages decoded into schemas.Flow,
// written with GenericWriter[Flow]), kept as the baseline;
// columns/edge=N is the collector's path (schemas.Row: Arrow columns
// written straight into the Parquet column writers, FlowRowSchema), all
// on zstd messages; columns-lz4/edge=2 is the collector's path on lz4
// messages, the agent's default wire codec now. Messages carry
// dictionary-encoded strings (the agent's wire form since issue 16);
// columns-<codec>-plain/edge=2 is the same on the plain utf8 form of
// older agents, the baseline of the wire dictionaries (codec none, lz4,
// zstd; columns-none/edge=2 the dictionary form without compression).
//
// Reported: records/s (wall), records/cpu-s (≈ per core), peak-RSS-MiB
// (VmHWM of the process, reset before each run via /proc/self/clear_refs),
// peak-heap-MiB (live heap objects sampled every 10 ms) and B/record on
// disk.
func BenchmarkCollectorRSS(b *testing.B) {
	for _, edge := range []int{16, 2} {
		b.Run("edge="+strconv.Itoa(edge), func(b *testing.B) {
			benchCollectorRSS(b, collectorBench{edge: edge, codec: schemas.CodecZstd, compression: CompressionZstd})
		})
	}
	for _, edge := range []int{16, 2} {
		b.Run("columns/edge="+strconv.Itoa(edge), func(b *testing.B) {
			benchCollectorRSS(b, collectorBench{edge: edge, cols: true, codec: schemas.CodecZstd, compression: CompressionZstd})
		})
	}
	b.Run("columns-lz4/edge=2", func(b *testing.B) {
		benchCollectorRSS(b, collectorBench{edge: 2, cols: true, codec: schemas.CodecLZ4})
	})
	b.Run("columns-none/edge=2", func(b *testing.B) {
		benchCollectorRSS(b, collectorBench{edge: 2, cols: true, codec: schemas.CodecNone})
	})
	for _, codec := range []string{schemas.CodecZstd, schemas.CodecLZ4, schemas.CodecNone} {
		b.Run("columns-"+codec+"-plain/edge=2", func(b *testing.B) {
			benchCollectorRSS(b, collectorBench{edge: 2, cols: true, codec: codec + "-plain"})
		})
	}
}

// BenchmarkCollectorWriter is the collector's path of BenchmarkCollectorRSS
// (columns, lz4 messages, edge 2, 8 hours open, dedupe) on 128 messages
// (2.1 M records: one full row group per file), once per Parquet
// writer setting, so settings can be compared in one run (interleave
// them with a shell loop over -test.bench, -test.count 1):
//
//   - compression=<c>: collector.compression, everything else default
//     (lz4_raw: Parquet's LZ4_RAW, measured but not offered);
//   - write-buffer=<n>: the default compression with the writer's output
//     buffer (parquet-go WriteBufferSize; its default is 32KiB) at n;
//   - page-buffer=<n>: the default compression with the column page
//     buffers (PageBufferSize; the sink's pageBufferSize, 64KiB; 256KiB
//     is parquet-go's default and was the sink's until measured here) at n.
//
// Reported as BenchmarkCollectorRSS (KiB/write: the mean size of the
// write(2) calls on the Parquet files).
func BenchmarkCollectorWriter(b *testing.B) {
	for _, c := range Compressions {
		b.Run("compression="+c, func(b *testing.B) {
			benchCollectorRSS(b, collectorBench{edge: 2, cols: true, codec: schemas.CodecLZ4, compression: c, messages: 128})
		})
	}
	// LZ4_RAW (not offered: see Compressions), with recycled compressors.
	b.Run("compression=lz4_raw", func(b *testing.B) {
		benchCollectorRSS(b, collectorBench{edge: 2, cols: true, codec: schemas.CodecLZ4, messages: 128,
			wopts: []pq.WriterOption{pq.Compression(lz4RawCodec)}})
	})
	for _, n := range []int{32 << 10, 256 << 10, 1 << 20, 4 << 20} {
		b.Run("write-buffer="+units.ByteSize(n).String(), func(b *testing.B) {
			benchCollectorRSS(b, collectorBench{edge: 2, cols: true, codec: schemas.CodecLZ4, messages: 128,
				wopts: []pq.WriterOption{pq.WriteBufferSize(n)}})
		})
	}
	for _, n := range []int{16 << 10, 64 << 10, 256 << 10, 1 << 20} {
		b.Run("page-buffer="+units.ByteSize(n).String(), func(b *testing.B) {
			benchCollectorRSS(b, collectorBench{edge: 2, cols: true, codec: schemas.CodecLZ4, messages: 128,
				wopts: []pq.WriterOption{pq.PageBufferSize(n)}})
		})
	}
}

// BenchmarkCollectorDictIndices is the collector's path of
// BenchmarkCollectorWriter (default settings, lz4 messages, 128 of them)
// with the wire's dictionary indices written into the Parquet
// dictionary pages and integers as slices (indices: the collector's
// path) and with every value a pq.Value, hashed into the dictionary
// again for strings (values: the path it replaces), on
// two feeds: agent (the synthetic source's batches of one node, as
// BenchmarkPipelineParquet publishes them: one hour, ~1000 ports per
// message) and spread (BenchmarkCollectorRSS's messages: 200 nodes and
// 8 hours in every message, so each piece a file gets has ~5000 ports
// and little repeats). Interleave with a shell loop over -test.bench,
// -test.count 1. Reported as BenchmarkCollectorRSS.
func BenchmarkCollectorDictIndices(b *testing.B) {
	for _, feed := range []string{"agent", "spread"} {
		wire := agentMessagesLZ4
		if feed == "spread" {
			wire = rssMessagesWire[schemas.CodecLZ4]
		}
		for _, values := range []bool{false, true} {
			name := feed + "/indices"
			if values {
				name = feed + "/values"
			}
			b.Run(name, func(b *testing.B) {
				benchCollectorRSS(b, collectorBench{edge: 2, cols: true, wire: wire, messages: 128, valuePath: values})
			})
		}
	}
}

// agentMessagesLZ4 are 32 lz4 messages of the synthetic source's
// batches (node "bench", attributed, as fast as it can).
var agentMessagesLZ4 = sync.OnceValue(func() [][]byte {
	cfg := synthetic.DefaultConfig()
	cfg.RecordsPerSecond, cfg.Attributed = 0, true
	src, err := synthetic.New(cfg, synthetic.Options{Node: "bench", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	enc, err := schemas.NewEncoder(schemas.CodecLZ4)
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan *pipeline.Batch, 4)
	go func() { _ = src.Run(ctx, out); close(out) }()
	var msgs [][]byte
	for bt := range out {
		if len(msgs) < 32 {
			body, err := enc.Encode(nil, bt.Records)
			if err != nil {
				panic(err)
			}
			msgs = append(msgs, body)
		} else {
			cancel()
		}
		bt.Ack(nil)
	}
	return msgs
})

// collectorBench is one collector pipeline to measure.
type collectorBench struct {
	edge        int
	cols        bool   // the columnar path (schemas.Row), else the record path
	codec       string // wire codec of the messages
	compression string // collector.compression; "" the default
	messages    int    // messages per run; 0: rssMessages
	wopts       []pq.WriterOption
	valuePath   bool            // Sink.valuePath
	wire        func() [][]byte // the messages; nil: rssMessagesWire[codec]
}

// collectorRun is one pipeline of either path.
type collectorRun interface {
	Run(ctx context.Context) error
}

func benchCollectorRSS(b *testing.B, cb collectorBench) {
	wire := cb.wire
	if wire == nil {
		wire = rssMessagesWire[cb.codec]
	}
	msgs := wire()
	nmsg := cb.messages
	if nmsg == 0 {
		nmsg = rssMessages
	}
	var writes int64
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var peakRSS, peakHeap uint64
	var diskBytes int64
	var cpu time.Duration
	var allocated uint64
	var pool *schemas.BufferPool
	for b.Loop() {
		b.StopTimer()
		dir := b.TempDir()
		cfg := DefaultConfig()
		cfg.Output = dir
		if cb.compression != "" {
			cfg.Compression = cb.compression
		}
		var acked, nacks atomic.Int64
		pcfg := pipeline.Config{Name: "collector", EdgeCapacity: cb.edge, ShutdownTimeout: time.Minute}
		var r collectorRun
		var closeSink func() error
		var countWrites func() int64
		if cb.cols {
			sink, err := NewFor(cfg, FlowRowSchema, Options{Node: "bench", Logger: log, Dedupe: true})
			if err != nil {
				b.Fatal(err)
			}
			sink.wopts = append(sink.wopts, cb.wopts...)
			sink.valuePath = cb.valuePath
			countWrites = func() int64 { return sink.writeCalls }
			closeSink = sink.Close
			pool = schemas.NewBufferPool(consume.DefaultDecodePoolBytes)
			src := &rssRowSource{msgs: msgs, n: nmsg, acked: &acked, nacks: &nacks, pool: pool}
			if r, err = pipeline.NewRunnerOf(pcfg, src, nil, sink, pipeline.NewMetrics(prometheus.NewRegistry()), log); err != nil {
				b.Fatal(err)
			}
		} else {
			sink, err := New(cfg, Options{Node: "bench", Logger: log, Dedupe: true})
			if err != nil {
				b.Fatal(err)
			}
			sink.wopts = append(sink.wopts, cb.wopts...)
			countWrites = func() int64 { return sink.writeCalls }
			closeSink = sink.Close
			src := &rssSource{msgs: msgs, n: nmsg, acked: &acked, nacks: &nacks}
			if r, err = pipeline.NewRunner(pcfg, src, nil, sink, pipeline.NewMetrics(prometheus.NewRegistry()), log); err != nil {
				b.Fatal(err)
			}
		}
		// Two collections: the first moves sync.Pools (parquet-go's
		// buffers, the earlier runs') to their victim caches, the second
		// drops them, so a run's peaks are its own.
		runtime.GC()
		runtime.GC()
		debug.FreeOSMemory()
		resetPeakRSS(b)
		stop := make(chan struct{})
		heapDone := make(chan uint64)
		go func() { heapDone <- sampleHeapPeak(stop) }()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		cpu0 := cpuTime()
		b.StartTimer()

		if err := r.Run(context.Background()); err != nil {
			b.Fatal(err)
		}

		b.StopTimer()
		cpu += cpuTime() - cpu0
		runtime.ReadMemStats(&m1)
		allocated += m1.TotalAlloc - m0.TotalAlloc
		close(stop)
		peakHeap = max(peakHeap, <-heapDone)
		peakRSS = max(peakRSS, vmHWM(b))
		if acked.Load() != int64(nmsg) || nacks.Load() != 0 {
			b.Fatalf("acks: %d ok, %d failed; want %d ok", acked.Load(), nacks.Load(), nmsg)
		}
		writes = countWrites()
		diskBytes = dirBytes(dir)
		_ = closeSink()
		b.StartTimer()
	}
	n := float64(nmsg * rssBatch * b.N)
	b.ReportMetric(n/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(n/cpu.Seconds(), "records/cpu-s")
	b.ReportMetric(float64(peakRSS)/(1<<20), "peak-RSS-MiB")
	b.ReportMetric(float64(peakHeap)/(1<<20), "peak-heap-MiB")
	b.ReportMetric(float64(diskBytes)/float64(nmsg*rssBatch), "B/record")
	b.ReportMetric(float64(allocated)/n, "alloc_B/record") // what the collector's GC pays for
	if writes > 0 {
		b.ReportMetric(float64(diskBytes)/float64(writes)/1024, "KiB/write")
	}
	if pool != nil {
		st := pool.Stats()
		if st.Messages != 0 || st.Out != 0 {
			b.Fatalf("decode pool: %d messages (%d bytes) never released", st.Messages, st.Out)
		}
		if st.Gets > 0 {
			b.ReportMetric(100*float64(st.Hits)/float64(st.Gets), "pool-hit-%")
		}
	}
}

func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// resetPeakRSS makes VmHWM restart from the current RSS (Linux ≥ 4.0).
func resetPeakRSS(b *testing.B) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Fatalf("reset peak RSS: %v", err)
	}
}

// vmHWM is the peak resident set size of the process in bytes.
func vmHWM(b *testing.B) uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmHWM in /proc/self/status")
	return 0
}

// sampleHeapPeak returns the largest live-heap figure seen until stop.
func sampleHeapPeak(stop <-chan struct{}) uint64 {
	s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var peak uint64
	for {
		rtmetrics.Read(s)
		peak = max(peak, s[0].Value.Uint64())
		select {
		case <-stop:
			return peak
		case <-t.C:
		}
	}
}
