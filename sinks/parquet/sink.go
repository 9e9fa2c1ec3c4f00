package parquet

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	pq "github.com/parquet-go/parquet-go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/internal/fsx"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

// Key-value metadata written into every file besides
// schemas.MetadataKey=<Schema.Name> (flow.v1, meter.v1).
const (
	// MetadataWriter names the collector that wrote the file.
	MetadataWriter = "tapflow.writer"
	// MetadataBatchSeqs lists the Batch.Seq (JetStream stream sequences)
	// whose records the file holds, as sorted ranges: "5-9,12,20-31".
	MetadataBatchSeqs = "tapflow.batch_seqs"
)

// pageBufferSize is the in-memory buffer per column in which parquet-go
// builds a page (256 KiB, its default). 64 KiB lowered the collector's
// peak heap from 287–292 to 232–235 MiB on BenchmarkCollectorWriter, whose
// messages barely compress (116 B/row), but on realistic flow data
// (BenchmarkPipelineParquet, same run) smaller pages made the files 1.30×
// as large: 26.8 against 20.6 B/row. Months of Parquet outweigh 55 MiB of
// heap, so the sink keeps 256 KiB.
const pageBufferSize = 256 << 10

// initialBytesPerRow estimates the size of a row on disk until the first
// file or row group has been measured (flow.v1 with zstd measures ≈40).
const initialBytesPerRow = 64

const usPerHour = int64(time.Hour / time.Microsecond)

// Schema describes one record type the sink writes: where its files go,
// which column partitions them and how they are labelled.
type Schema[T any] struct {
	// Name is written as key-value metadata schemas.MetadataKey and labels
	// the metrics (schema="flow.v1").
	Name string
	// Version is written as key-value metadata schemas.VersionKey
	// ("1.1"): the minor version says which additive columns the file
	// has. Empty: not written.
	Version string
	// Dir is the directory under Config.Output: "flows", "meters".
	Dir string
	// TimeEnd returns a record's time_end in µs since the epoch (UTC); its
	// hour is the record's partition.
	TimeEnd func(*T) int64
	// SkipPageBounds are string columns whose min/max bounds are not
	// written: records are not sorted by them, so bounds cannot prune, and
	// computing them costs CPU (~10% of the write CPU for flow.v1).
	SkipPageBounds []string
	// Identity returns the agent batch a record came in (agent_id,
	// batch_seq). With Options.Dedupe, every file records the batches it
	// holds (MetadataBatches) and the sink never writes a batch's records
	// of one partition twice: redeliveries of committed batches are acked
	// without writing (see ledger).
	Identity func(*T) (agent string, batchSeq int64)

	// rows, set only for T = schemas.Row (FlowRowSchema, MeterRowSchema),
	// writes through the Parquet column writers (columns.go).
	rows *schemas.Table[schemas.Row]
}

func (sc Schema[T]) validate() error {
	switch {
	case sc.Name == "":
		return fmt.Errorf("schema has no name")
	case sc.Dir == "" || sc.Dir != filepath.Base(sc.Dir) || sc.Dir == "." || sc.Dir == "..":
		return fmt.Errorf("schema %s: directory %q is not one path element", sc.Name, sc.Dir)
	case sc.TimeEnd == nil:
		return fmt.Errorf("schema %s: no TimeEnd accessor", sc.Name)
	}
	return nil
}

// FlowSchema writes schemas.Flow (flow.v1) under <output>/flows.
var FlowSchema = Schema[schemas.Flow]{
	Name:           schemas.SchemaName,
	Version:        schemas.FlowTable.Version(),
	Dir:            "flows",
	TimeEnd:        func(f *schemas.Flow) int64 { return f.TimeEnd },
	SkipPageBounds: []string{"ifname", "vm_mac", "peer_mac", "src_ip", "dst_ip", "server_id", "port_id"},
	Identity:       func(f *schemas.Flow) (string, int64) { return f.AgentID, f.BatchSeq },
}

// Options are the collaborators of the sink.
type Options struct {
	// Node names the writer when Config.Writer is empty.
	Node string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registry receives the tapflow_parquet_* metrics; nil registers none.
	Registry prometheus.Registerer
	// Dedupe turns on the committed-batch ledger (with Schema.Identity):
	// a batch piece already committed is not written again. It relies on
	// the transport contract: all records of one Batch carry the same
	// (agent_id, batch_seq), and no other message carries it (transport/publish
	// stamps them so). The collector sets it.
	Dedupe bool
	// LedgerRefresh is how old a partition's listing may be when a batch
	// touches it (default 10s). Other collectors' commits are seen only
	// after a re-list, so it must be shorter than the earliest redelivery
	// after a crash: the collector sets it to ack_wait/3 (redeliveries come
	// ≥ 2/3 ack_wait after the last in-progress ack).
	LedgerRefresh time.Duration
	// Committed lists the files already committed, for the dedupe ledger;
	// nil reads the local output directory (or Remote).
	Committed Committed
	// Remote receives every committed file when Config.Output is s3://…
	// (required then): batches are acked only after their files are
	// uploaded; staged copies are deleted after upload.
	Remote Remote
	// CommitDue, when set, is asked after each batch the sink holds
	// whether to commit the open files now, before roll_size or roll_age:
	// a non-empty reason commits them (the collector's source says so when
	// its unacked messages near its share of the stream:
	// consume.SourceOf.CommitDue).
	CommitDue func() (reason string)
}

// MeterSchema writes schemas.Meter (meter.v1) under <output>/meters.
var MeterSchema = Schema[schemas.Meter]{
	Name:     schemas.MeterSchemaName,
	Version:  schemas.MeterTable.Version(),
	Dir:      "meters",
	TimeEnd:  func(m *schemas.Meter) int64 { return m.TimeEnd },
	Identity: func(m *schemas.Meter) (string, int64) { return m.AgentID, m.BatchSeq },
}

// Sink writes batches of T into hourly partitions of Parquet files and
// acks every batch once each file holding its records is committed.
// Sink[schemas.Flow] is a pipeline.Sink; Run is called once.
type Sink[T any] struct {
	cfg    Config
	schema Schema[T]
	writer string
	root   string // <output>/<schema.Dir>
	nonce  string // makes temp names unique across restarts
	gid    int    // collector.file_group, or fsx.NoGroup
	wopts  []pq.WriterOption
	log    *slog.Logger
	reg    prometheus.Registerer
	m      *metrics
	once   sync.Once

	// Owned by Run's goroutine.
	files    map[int64]*file[T] // open files by hour (time_end µs / 1h)
	acks     pipeline.AckGroupOf[T]
	timer    *time.Timer
	timerC   <-chan time.Time // nil while no file is open
	bpr      float64          // measured bytes per row on disk
	tmpSeq   int
	syncDirs map[string]struct{} // parents of directories created since the last commit
	hours    []int64
	fails    failLog
	ledger   *ledger // nil without Schema.Identity
	remote   Remote
	runCtx   context.Context
	upLog    failLog
	dedupLog failLog
	crashAt  int // failpoint: SIGKILL self after this many commits, before acking (0: off)
	commits  int
	// writeCalls counts write(2) calls on committed files (benchmarks).
	writeCalls int64
	// valuePath writes every column value by value (benchmarks: the
	// path the direct paths of columnWriter replace).
	valuePath bool
	pieces    map[pieceKey]bool    // scratch: pieces of the batch being written → duplicate?
	seen      map[int64]struct{}   // scratch: hours of the batch being checked
	cur       *pipeline.BatchOf[T] // the batch being written, not yet in acks
	rejLog    failLog
	commitDue func() string
	fresh     *freshness
	ends      ends  // time_end seconds of the records in the open files
	step      int64 // byte budget of a commit after a full disk (space.go); 0: off
}

// file is one open partition file.
type file[T any] struct {
	hour        int64
	dir, tmp    string
	final       string // set once renamed
	f           *os.File
	out         countingWriter
	w           fileWriter[T]
	rows        int64 // rows written
	flushedRows int64 // rows in row groups already written out
	groupRows   int64 // rows in the current row group
	seqs        []int64
	batches     map[batchID]struct{} // agent batches with records in the file
}

type failLog struct {
	key        string
	at         time.Time
	suppressed int
	failures   int
}

// New returns the flow.v1 sink: NewFor(cfg, FlowSchema, opts).
func New(cfg Config, opts Options) (*Sink[schemas.Flow], error) {
	return NewFor(cfg, FlowSchema, opts)
}

// NewFor validates cfg and schema and registers the metrics (labelled
// schema=<schema.Name>, so sinks of different schemas share a registry). It
// touches no file and starts nothing: Run does.
func NewFor[T any](cfg Config, schema Schema[T], opts Options) (*Sink[T], error) {
	if err := schema.validate(); err != nil {
		return nil, fmt.Errorf("parquet sink: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("parquet sink config: %w", err)
	}
	writer := cfg.Writer
	if writer == "" {
		writer = opts.Node
	}
	root := filepath.Join(cfg.Output, schema.Dir)
	if IsRemote(cfg.Output) {
		if opts.Remote == nil {
			return nil, fmt.Errorf("parquet sink: output %s needs an object store client (Options.Remote)", cfg.Output)
		}
		root = filepath.Join(cfg.StagingDir, schema.Dir)
	}
	if !writerName.MatchString(writer) {
		return nil, fmt.Errorf("parquet sink: writer name %q (from collector.writer, else node) is empty or has characters other than letters, digits, '.', '_' and '-'; set collector.writer", writer)
	}
	codec, err := codecFor(cfg.Compression)
	if err != nil {
		return nil, err
	}
	gid, err := fsx.LookupGroup(cfg.FileGroup)
	if err != nil {
		return nil, fmt.Errorf("parquet sink: collector.file_group: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Sink[T]{
		cfg:      cfg,
		schema:   schema,
		writer:   writer,
		root:     root,
		remote:   opts.Remote,
		nonce:    strconv.FormatInt(time.Now().UnixNano(), 36),
		gid:      gid,
		log:      log.With("component", "sinks/parquet"),
		reg:      opts.Registry,
		m:        newMetrics(schema.Name),
		files:    make(map[int64]*file[T]),
		bpr:      initialBytesPerRow,
		syncDirs: make(map[string]struct{}),
		seen:     make(map[int64]struct{}),
		wopts: []pq.WriterOption{
			pq.Compression(codec),
			pq.KeyValueMetadata(schemas.MetadataKey, schema.Name),
			pq.MaxRowsPerRowGroup(int64(cfg.RowGroupRows)),
			// Min/max per page stay in the page index (ColumnIndex), which
			// readers use; the legacy copy in every page header would cost
			// another ~10% of the write CPU.
			pq.DataPageStatistics(false),
			pq.PageBufferSize(pageBufferSize),
		},
	}
	if schema.Version != "" {
		s.wopts = append(s.wopts, pq.KeyValueMetadata(schemas.VersionKey, schema.Version))
	}
	for _, c := range schema.SkipPageBounds {
		s.wopts = append(s.wopts, pq.SkipPageBounds(c))
	}
	s.fresh, s.commitDue = s.m.fresh, opts.CommitDue
	s.crashAt = failpointAfterCommit()
	if schema.Identity != nil && opts.Dedupe {
		src := opts.Committed
		switch {
		case src != nil:
		case opts.Remote != nil:
			src = opts.Remote
		default:
			src = localCommitted{root: cfg.Output}
		}
		s.ledger = newLedger(src, schema.Dir)
		if opts.LedgerRefresh > 0 {
			s.ledger.refresh = opts.LedgerRefresh
		}
		s.pieces = map[pieceKey]bool{}
	}
	if s.reg != nil {
		for i, c := range s.m.collectors() {
			if err := s.reg.Register(c); err != nil {
				for _, r := range s.m.collectors()[:i] {
					s.reg.Unregister(r)
				}
				return nil, fmt.Errorf("parquet sink: register metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Name implements pipeline.Sink.
func (s *Sink[T]) Name() string { return "parquet" }

// Writer returns the writer name used in file names.
func (s *Sink[T]) Writer() string { return s.writer }

// Close unregisters the metrics. Call it after Run has returned; it is
// idempotent.
func (s *Sink[T]) Close() error {
	s.once.Do(func() {
		if s.reg != nil {
			for _, c := range s.m.collectors() {
				s.reg.Unregister(c)
			}
		}
	})
	return nil
}

// Run implements pipeline.Sink. It first removes temp files a previous run
// of this writer left behind, then writes every batch from in into the
// file of its records' partition (hour of time_end, UTC), and commits all
// open files together when one reaches RollSize, when the oldest is
// RollAge old, when a batch would open more than MaxOpenFiles, and when in
// is closed. Only then are the batches held acked (nil).
//
// A failed write or commit removes every open file and acks every batch
// held with a *CommitError naming the path and the fix; Run logs it, counts
// it and keeps going, so later batches commit once the cause is fixed. It
// never returns an error: the source redelivers what was failed.
//
// When ctx is cancelled (hard stop) Run removes the open files, acks what
// it holds with an error, acks every batch still arriving with an error
// until in is closed, and returns nil.
//
// With a Remote, a roll uploads every committed file (retrying with
// backoff until it is stored or ctx ends: the sink reads no input
// meanwhile, so the source's bounded queue and max_ack_pending hold the
// stream back) and only then acks; files committed in staging but not
// uploaded (a crash, a hard stop) are uploaded when Run starts, before any
// input is read.
func (s *Sink[T]) Run(ctx context.Context, in <-chan *pipeline.BatchOf[T]) error {
	s.log.Info("parquet sink starting", "schema", s.schema.Name, "root", s.root, "writer", s.writer, "roll_size", s.cfg.RollSize.String(),
		"roll_age", s.cfg.RollAge.String(), "compression", s.cfg.Compression, "row_group_rows", s.cfg.RowGroupRows, "remote", remoteName(s.remote))
	s.runCtx = ctx
	s.removeStale()
	if s.remote != nil {
		s.abortIncomplete(ctx)
		s.uploadStaged(ctx)
	}
	defer s.stopTimer()
	for {
		if ctx.Err() != nil { // a hard stop wins over work that is ready too
			s.hardStop(ctx, in)
			return nil
		}
		select {
		case <-ctx.Done():
			s.hardStop(ctx, in)
			return nil
		case b, ok := <-in:
			if !ok {
				if ctx.Err() != nil {
					s.hardStop(ctx, in)
					return nil
				}
				s.roll("input closed")
				return nil
			}
			s.write(b)
		case <-s.timerC:
			s.roll("age")
		}
	}
}

// hardStop discards the open files, fails every batch held and every batch
// still arriving until in is closed.
func (s *Sink[T]) hardStop(ctx context.Context, in <-chan *pipeline.BatchOf[T]) {
	n := len(s.files)
	err := fmt.Errorf("parquet sink %s: stopped before commit (%w); %d open files discarded; messages stay unacked and will be redelivered",
		s.root, context.Cause(ctx), n)
	batches, records := s.acks.Len()
	s.abort()
	s.acks.Ack(err)
	s.log.Warn("hard stop: open files discarded, held batches failed", "files", n, "batches", batches, "records", records)
	for b := range in {
		b.Ack(err)
	}
}

// hourOf returns the partition of a time_end in µs: hours since the epoch.
func hourOf(us int64) int64 {
	h := us / usPerHour
	if us%usPerHour < 0 {
		h--
	}
	return h
}

// partition returns the partition directory of an hour, relative to the
// schema's root (flows, meters): dt=YYYY-MM-DD/hour=HH.
func partition(hour int64) string {
	return time.UnixMicro(hour * usPerHour).UTC().Format("dt=2006-01-02/hour=15")
}
