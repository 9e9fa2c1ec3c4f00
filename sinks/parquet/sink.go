package parquet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
}

// Remote is an object store the sink uploads committed files to.
type Remote interface {
	Committed
	// Upload stores the local file path as rel (relative to the output
	// root: flows/dt=…/hour=…/name.parquet), whole or not at all.
	Upload(ctx context.Context, path, rel string) error
	// String names the store for logs (s3://bucket/prefix).
	String() string
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
	pieces   map[pieceKey]bool    // scratch: pieces of the batch being written → duplicate?
	seen     map[int64]struct{}   // scratch: hours of the batch being checked
	cur      *pipeline.BatchOf[T] // the batch being written, not yet in acks
	rejLog   failLog
}

// file is one open partition file.
type file[T any] struct {
	hour        int64
	dir, tmp    string
	final       string // set once renamed
	f           *os.File
	out         countingWriter
	w           *pq.GenericWriter[T]
	rows        int64 // rows written
	flushedRows int64 // rows in row groups already written out
	groupRows   int64 // rows in the current row group
	seqs        []int64
	batches     map[batchID]struct{} // agent batches with records in the file
}

type countingWriter struct {
	f *os.File
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.f.Write(p)
	c.n += int64(n)
	return n, err
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
		},
	}
	if schema.Version != "" {
		s.wopts = append(s.wopts, pq.KeyValueMetadata(schemas.VersionKey, schema.Version))
	}
	for _, c := range schema.SkipPageBounds {
		s.wopts = append(s.wopts, pq.SkipPageBounds(c))
	}
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

func (s *Sink[T]) write(b *pipeline.BatchOf[T]) {
	recs := b.Records
	if len(recs) == 0 {
		b.Ack(nil) // nothing to make durable
		return
	}
	if err := s.checkHours(b); err != nil {
		s.reject(b, err)
		return
	}
	if s.ledger != nil {
		var err error
		if recs, err = s.dedupe(recs); err != nil {
			s.m.commitErrors.Inc()
			if now := time.Now(); now.Sub(s.dedupLog.at) > 30*time.Second {
				s.log.Warn("cannot tell whether a batch is already committed; failed for redelivery", "seq", b.Seq, "err", err,
					"same_failures_not_logged", s.dedupLog.suppressed)
				s.dedupLog.at, s.dedupLog.suppressed = now, 0
			} else {
				s.dedupLog.suppressed++
			}
			b.Ack(fmt.Errorf("parquet sink %s: dedupe: %w", s.root, err))
			return
		}
		if len(recs) == 0 {
			// Every record is committed (or in an open file: then wait for
			// that file's commit before acking).
			if len(s.files) > 0 {
				s.hold(b)
			} else {
				b.Ack(nil)
			}
			return
		}
	}
	timeEnd := s.schema.TimeEnd
	s.hours = s.hours[:0]
	last := int64(math.MinInt64)
	for i := range recs {
		if h := hourOf(timeEnd(&recs[i])); h != last {
			if !slices.Contains(s.hours, h) {
				s.hours = append(s.hours, h)
			}
			last = h
		}
	}
	opening := 0
	for _, h := range s.hours {
		if s.files[h] == nil {
			opening++
		}
	}
	if opening > 0 && len(s.files) > 0 && len(s.files)+opening > s.cfg.MaxOpenFiles {
		s.roll("max open files")
	}

	// b is not held (acks) until its last record is written: a commit
	// forced while it is being written (it spans more hours than
	// MaxOpenFiles) must not ack it; fail acks it with the others.
	s.cur = b
	for i := 0; i < len(recs); {
		h := hourOf(timeEnd(&recs[i]))
		j := i + 1
		for j < len(recs) && hourOf(timeEnd(&recs[j])) == h {
			j++
		}
		f := s.files[h]
		if f == nil {
			if len(s.files) >= s.cfg.MaxOpenFiles {
				// Commit before opening more: the batch's earlier hours are
				// durable now (the ledger knows them: a redelivery skips
				// them); the batch is acked with the commit of its last.
				s.roll("max open files within a batch")
				if s.cur == nil {
					return // the commit failed, and b with it
				}
			}
			var err error
			if f, err = s.open(h); err != nil {
				s.fail(err)
				return
			}
		}
		if n := len(f.seqs); n == 0 || f.seqs[n-1] != b.Seq {
			f.seqs = append(f.seqs, b.Seq)
		}
		if s.ledger != nil {
			s.notePieces(f, recs[i:j])
		}
		if err := s.writeRows(f, recs[i:j]); err != nil {
			s.fail(err)
			return
		}
		i = j
	}
	s.cur = nil
	s.hold(b)
	for _, f := range s.files {
		if f.estimate(s.bpr) >= int64(s.cfg.RollSize) {
			s.roll("size")
			return
		}
	}
}

// hold keeps b's ack until the next commit and lets go of its records:
// they are in the open files' row groups now, and the ack is all a commit
// needs. Holding the decoded records until the commit made the collector's
// memory grow with roll_size × max_open_files (GBs at the defaults).
func (s *Sink[T]) hold(b *pipeline.BatchOf[T]) {
	s.acks.Add(b)
	b.Records = nil
}

// Partitions the sink creates: time_end in [MinTimeEnd, MaxTimeEnd). A
// record outside (a clock reset to 1970, a corrupt or hostile time_end
// such as year −144169) would make a bogus partition directory; the
// collector's source dead-letters such messages first, and the sink
// refuses what still gets through.
var (
	MinTimeEnd = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	MaxTimeEnd = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

var (
	minHour = hourOf(MinTimeEnd.UnixMicro())
	maxHour = hourOf(MaxTimeEnd.UnixMicro()) // exclusive
)

// checkHours refuses a batch with a record outside [MinTimeEnd,
// MaxTimeEnd), and groups b's records by hour (a stable sort, only when
// an hour comes back after another) so each hour's records of the batch —
// one dedupe piece — are written as one run into one file.
func (s *Sink[T]) checkHours(b *pipeline.BatchOf[T]) error {
	recs, timeEnd := b.Records, s.schema.TimeEnd
	clear(s.seen)
	grouped := true
	last := int64(math.MinInt64)
	for i := range recs {
		us := timeEnd(&recs[i])
		h := hourOf(us)
		if h == last {
			continue
		}
		if h < minHour || h >= maxHour {
			return &RangeError{Seq: b.Seq, Index: i, TimeEnd: us}
		}
		if _, ok := s.seen[h]; ok {
			grouped = false
		}
		s.seen[h] = struct{}{}
		last = h
	}
	if !grouped {
		slices.SortStableFunc(recs, func(a, b T) int { return cmp.Compare(hourOf(timeEnd(&a)), hourOf(timeEnd(&b))) })
	}
	return nil
}

// reject acks b with err (a batch that must not be written at all),
// counts it and logs it (at most every 30 s, with the count of others).
func (s *Sink[T]) reject(b *pipeline.BatchOf[T], err error) {
	s.m.rejected.Inc()
	if now := time.Now(); now.Sub(s.rejLog.at) > 30*time.Second {
		s.log.Error("batch refused: not written", "seq", b.Seq, "records", len(b.Records), "err", err, "same_refusals_not_logged", s.rejLog.suppressed)
		s.rejLog.at, s.rejLog.suppressed = now, 0
	} else {
		s.rejLog.suppressed++
	}
	b.Ack(fmt.Errorf("parquet sink %s: %w", s.root, err))
}

// dedupe returns recs without the records whose piece (hour, agent batch)
// is committed or already in an open file; it counts what it drops.
func (s *Sink[T]) dedupe(recs []T) ([]T, error) {
	id, timeEnd := s.schema.Identity, s.schema.TimeEnd
	clear(s.pieces)
	dropped := 0
	var last pieceKey
	lastDup := false
	for i := range recs {
		a, q := id(&recs[i])
		k := pieceKey{hourOf(timeEnd(&recs[i])), batchID{a, q}}
		if i == 0 || k != last {
			dup, ok := s.pieces[k]
			if !ok {
				var err error
				if dup, err = s.ledger.known(k); err != nil {
					return nil, err
				}
				s.pieces[k] = dup
			}
			last, lastDup = k, dup
		}
		if lastDup {
			dropped++
		}
	}
	if dropped == 0 {
		return recs, nil
	}
	dupPieces := 0
	for _, dup := range s.pieces {
		if dup {
			dupPieces++
		}
	}
	s.m.dupRecords.Add(float64(dropped))
	s.m.dupPieces.Add(float64(dupPieces))
	kept := make([]T, 0, len(recs)-dropped)
	for i := range recs {
		a, q := id(&recs[i])
		if !s.pieces[pieceKey{hourOf(timeEnd(&recs[i])), batchID{a, q}}] {
			kept = append(kept, recs[i])
		}
	}
	s.log.Info("redelivered batch already committed; its committed records are not written again", "records_dropped", dropped, "records_kept", len(kept), "pieces", dupPieces)
	return kept, nil
}

// notePieces records the agent batches of rows (all in f's hour) in f and
// marks them open in the ledger.
func (s *Sink[T]) notePieces(f *file[T], rows []T) {
	if f.batches == nil {
		f.batches = map[batchID]struct{}{}
	}
	var last batchID
	for i := range rows {
		a, q := s.schema.Identity(&rows[i])
		id := batchID{a, q}
		if i > 0 && id == last {
			continue
		}
		last = id
		if _, ok := f.batches[id]; !ok {
			f.batches[id] = struct{}{}
			s.ledger.markOpen(pieceKey{f.hour, id})
		}
	}
}

// estimate is the size the file would have if committed now.
func (f *file[T]) estimate(bpr float64) int64 {
	if f.flushedRows > 0 {
		bpr = float64(f.out.n) / float64(f.flushedRows)
	}
	return f.out.n + int64(float64(f.rows-f.flushedRows)*bpr)
}

func (s *Sink[T]) writeRows(f *file[T], rows []T) error {
	limit := int64(s.cfg.RowGroupRows)
	for len(rows) > 0 {
		n := min(int64(len(rows)), limit-f.groupRows)
		if _, err := f.w.Write(rows[:n]); err != nil {
			return commitError("write", f.tmp, err)
		}
		f.rows += n
		f.groupRows += n
		rows = rows[n:]
		if f.groupRows >= limit {
			if err := f.w.Flush(); err != nil {
				return commitError("write", f.tmp, err)
			}
			f.flushedRows, f.groupRows = f.rows, 0
		}
	}
	return nil
}

func (s *Sink[T]) open(hour int64) (*file[T], error) {
	dir := filepath.Join(s.root, partition(hour))
	if err := s.mkdir(dir); err != nil {
		return nil, err
	}
	s.tmpSeq++
	tmp := filepath.Join(dir, fmt.Sprintf(".%s@%s-%d.parquet.tmp", s.writer, s.nonce, s.tmpSeq))
	fd, err := fsx.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fsx.DataFile, s.gid)
	if err != nil {
		return nil, commitError("create", tmp, err)
	}
	f := &file[T]{hour: hour, dir: dir, tmp: tmp, f: fd}
	f.out.f = fd
	f.w = pq.NewGenericWriter[T](&f.out, s.wopts...)
	if len(s.files) == 0 {
		s.startTimer()
	}
	s.files[hour] = f
	s.m.open.Set(float64(len(s.files)))
	return f, nil
}

// mkdir creates dir and its missing parents, remembering the parents whose
// entries must be fsynced at the next commit.
func (s *Sink[T]) mkdir(dir string) error {
	st, err := os.Stat(dir)
	if err == nil {
		if !st.IsDir() {
			return commitError("mkdir", dir, syscall.ENOTDIR)
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := s.mkdir(parent); err != nil {
			return err
		}
	}
	if err := fsx.Mkdir(dir, fsx.DataDir, s.gid); err != nil {
		return commitError("mkdir", dir, err)
	}
	s.syncDirs[parent] = struct{}{}
	return nil
}

func (s *Sink[T]) startTimer() {
	if s.timer == nil {
		s.timer = time.NewTimer(s.cfg.RollAge.D())
	} else {
		s.timer.Reset(s.cfg.RollAge.D())
	}
	s.timerC = s.timer.C
}

func (s *Sink[T]) stopTimer() {
	if s.timer != nil {
		s.timer.Stop()
	}
	s.timerC = nil
}

// roll commits every open file, then acks every batch held.
func (s *Sink[T]) roll(reason string) {
	s.stopTimer()
	if len(s.files) == 0 {
		return
	}
	files := make([]*file[T], 0, len(s.files))
	for _, f := range s.files {
		files = append(files, f)
	}
	slices.SortFunc(files, func(a, b *file[T]) int { return cmp.Compare(a.hour, b.hour) })
	start := time.Now()
	if err := s.commit(files); err != nil {
		s.fail(err)
		return
	}
	took := time.Since(start)
	var rows, bytes int64
	for _, f := range files {
		rows += f.rows
		bytes += f.out.n
	}
	s.m.commitSeconds.Observe(took.Seconds())
	s.m.files.Add(float64(len(files)))
	s.m.rows.Add(float64(rows))
	s.m.bytes.Add(float64(bytes))
	if rows > 0 {
		s.bpr = float64(bytes) / float64(rows)
	}
	if s.ledger != nil {
		for _, f := range files {
			s.ledger.committedFile(f.hour, filepath.Base(f.final), f.batches)
		}
	}
	clear(s.files)
	s.m.open.Set(0)
	if s.remote != nil {
		if err := s.uploadAll(files); err != nil {
			// Hard stop while S3 is unreachable: the files stay staged
			// (uploaded at the next start), the batches are redelivered
			// and deduplicated against the uploaded objects.
			clear(s.files)
			s.m.open.Set(0)
			if s.ledger != nil {
				s.ledger.dropOpen()
			}
			batches, records := s.acks.Len()
			s.failHeld(err)
			s.log.Warn("stopped before every committed file was uploaded; they stay staged for the next start", "batches", batches, "records", records, "err", err)
			return
		}
	}
	s.commits++
	if s.crashAt > 0 && s.commits >= s.crashAt {
		s.log.Warn("failpoint: killing the process after a commit, before its acks", "failpoint", FailpointEnv, "commits", s.commits)
		crashNow() // failpoint: files committed, batches not acked
	}
	batches, _ := s.acks.Len()
	s.acks.Ack(nil)
	s.log.Info("committed parquet files", "reason", reason, "files", len(files), "rows", rows, "bytes", bytes,
		"batches", batches, "commit_seconds", took.Seconds())
	if s.fails.failures > 0 {
		s.log.Info("parquet commits recovered", "failed_attempts", s.fails.failures)
		s.fails = failLog{}
	}
}

// commit makes files durable under their final names: footer, fsync,
// close; rename; fsync of the directories. On error the caller aborts.
func (s *Sink[T]) commit(files []*file[T]) error {
	for _, f := range files {
		f.w.SetKeyValueMetadata(MetadataWriter, s.writer)
		f.w.SetKeyValueMetadata(MetadataBatchSeqs, seqRanges(f.seqs))
		if s.ledger != nil {
			f.w.SetKeyValueMetadata(MetadataBatches, formatBatches(f.batches))
		}
		if err := f.w.Close(); err != nil {
			return commitError("write", f.tmp, err)
		}
		if err := f.f.Sync(); err != nil {
			return commitError("fsync", f.tmp, err)
		}
		err := f.f.Close()
		f.f = nil
		if err != nil {
			return commitError("close", f.tmp, err)
		}
	}
	dirs := make(map[string]struct{}, len(files)+len(s.syncDirs))
	for _, f := range files {
		final, err := s.finalName(f)
		if err != nil {
			return err
		}
		if err := os.Rename(f.tmp, final); err != nil {
			return commitError("rename", f.tmp, err)
		}
		f.final = final
		dirs[f.dir] = struct{}{}
	}
	for d := range s.syncDirs {
		dirs[d] = struct{}{}
	}
	for d := range dirs {
		if err := fsx.SyncDir(d); err != nil {
			return commitError("fsync dir", d, err)
		}
	}
	clear(s.syncDirs)
	return nil
}

// finalName is <writer>-<first seq>-<last seq>.parquet, seqs zero-padded
// to 20 digits so names sort. An existing file is never replaced: the
// name gets a -N suffix instead (a redelivered batch range).
func (s *Sink[T]) finalName(f *file[T]) (string, error) {
	first, last := slices.Min(f.seqs), slices.Max(f.seqs)
	base := fmt.Sprintf("%s-%020d-%020d", s.writer, first, last)
	for n := 0; ; n++ {
		name := base + ".parquet"
		if n > 0 {
			name = fmt.Sprintf("%s-%d.parquet", base, n)
		}
		p := filepath.Join(f.dir, name)
		_, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			if n > 0 {
				s.log.Warn("parquet file name taken (redelivered batches?); using a suffix", "taken", filepath.Join(f.dir, base+".parquet"), "file", p)
			}
			return p, nil
		}
		if err != nil {
			return "", commitError("stat", p, err)
		}
	}
}

func remoteName(r Remote) string {
	if r == nil {
		return "none"
	}
	return r.String()
}

// rel is a committed file's path relative to the output root.
func (s *Sink[T]) rel(hour int64, name string) string {
	return s.schema.Dir + "/" + partition(hour) + "/" + name
}

// uploadAll uploads committed files and deletes the staged copies; it
// retries each until it is stored and returns an error only when the run
// context ends first.
func (s *Sink[T]) uploadAll(files []*file[T]) error {
	for _, f := range files {
		if err := s.uploadOne(f.final, s.rel(f.hour, filepath.Base(f.final))); err != nil {
			return err
		}
	}
	return nil
}

func (s *Sink[T]) uploadOne(path, rel string) error {
	delay := 500 * time.Millisecond
	start := time.Now()
	for attempt := 1; ; attempt++ {
		err := s.remote.Upload(s.runCtx, path, rel)
		if err == nil {
			if attempt > 1 {
				s.log.Info("upload succeeded after retries; acks resume", "object", rel, "attempts", attempt, "waited", time.Since(start).Round(time.Millisecond))
				s.upLog = failLog{}
			}
			if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				s.log.Warn("cannot remove an uploaded staged file; remove it by hand", "path", path, "err", rerr)
			}
			return nil
		}
		s.m.uploadRetries.Inc()
		if now := time.Now(); now.Sub(s.upLog.at) > 30*time.Second {
			s.log.Error("upload to object store failed; holding acks and retrying (messages stay in-progress in JetStream)",
				"remote", s.remote.String(), "object", rel, "attempt", attempt, "retry_in", delay, "err", err, "failures_not_logged", s.upLog.suppressed)
			s.upLog.at, s.upLog.suppressed = now, 0
		} else {
			s.upLog.suppressed++
		}
		t := time.NewTimer(delay)
		select {
		case <-s.runCtx.Done():
			t.Stop()
			return fmt.Errorf("parquet sink: upload of %s to %s not done at stop (%w): %v", rel, s.remote, context.Cause(s.runCtx), err)
		case <-t.C:
		}
		maxDelay := 30 * time.Second
		if b, ok := s.remote.(interface{ MaxBackoff() time.Duration }); ok && b.MaxBackoff() > 0 {
			maxDelay = b.MaxBackoff()
		}
		delay = min(delay*2, maxDelay)
	}
}

// uploadStaged uploads the committed files a previous run left in staging.
func (s *Sink[T]) uploadStaged(ctx context.Context) {
	var staged []string
	_ = filepath.WalkDir(s.root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !strings.HasPrefix(d.Name(), ".") && strings.HasSuffix(d.Name(), ".parquet") {
			staged = append(staged, p)
		}
		return nil
	})
	if len(staged) == 0 {
		return
	}
	s.log.Info("uploading files a previous run committed but did not upload", "files", len(staged), "staging", s.root)
	for _, p := range staged {
		rel, err := filepath.Rel(filepath.Dir(s.root), p)
		if err != nil {
			continue
		}
		if err := s.uploadOne(p, filepath.ToSlash(rel)); err != nil {
			return // hard stop; Run notices ctx
		}
	}
}

// abort closes and removes every open file (temp or, after a partial
// commit, final). It does not ack.
func (s *Sink[T]) abort() {
	for _, f := range s.files {
		if f.f != nil {
			_ = f.f.Close()
		}
		p := f.tmp
		if f.final != "" {
			p = f.final
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.log.Error("cannot remove an uncommitted parquet file; remove it by hand", "path", p, "err", err)
		}
	}
	clear(s.files)
	s.m.open.Set(0)
	s.stopTimer()
	if s.ledger != nil {
		s.ledger.dropOpen()
	}
}

// fail aborts every open file and acks every batch held with err.
func (s *Sink[T]) fail(err error) {
	s.abort()
	batches, records := s.acks.Len()
	s.failHeld(err)
	s.m.commitErrors.Inc()
	s.fails.failures++
	key := err.Error()
	var ce *CommitError
	if errors.As(err, &ce) {
		key = ce.Op + filepath.Dir(ce.Path) + ce.Err.Error()
	}
	now := time.Now()
	if key == s.fails.key && now.Sub(s.fails.at) < time.Minute {
		s.fails.suppressed++
		return
	}
	s.log.Error("parquet write failed; held batches failed for redelivery", "err", err, "batches", batches,
		"records", records, "same_failures_not_logged", s.fails.suppressed)
	s.fails.key, s.fails.at, s.fails.suppressed = key, now, 0
}

// failHeld acks every batch held, and the one being written, with err.
func (s *Sink[T]) failHeld(err error) {
	s.acks.Ack(err)
	if b := s.cur; b != nil {
		s.cur = nil
		b.Ack(err)
	}
}

// removeStale removes the temp files of this writer left by a previous
// run that did not finish (crash, kill -9). Other writers' temp files are
// theirs: '@' cannot appear in a writer name, so the prefix is exact.
func (s *Sink[T]) removeStale() {
	prefix := "." + s.writer + "@"
	removed := 0
	err := filepath.WalkDir(s.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p == s.root {
				return nil
			}
			return err
		}
		if !d.IsDir() && strings.HasPrefix(d.Name(), prefix) && strings.HasSuffix(d.Name(), ".tmp") {
			if err := os.Remove(p); err != nil {
				return err
			}
			removed++
		}
		return nil
	})
	if err != nil {
		s.log.Warn("cleaning stale temp files", "root", s.root, "err", err)
	}
	if removed > 0 {
		s.log.Info("removed stale temp files of an unfinished run", "root", s.root, "files", removed)
	}
}

// seqRanges renders seqs as sorted, merged ranges: "1-3,7,9-10".
func seqRanges(seqs []int64) string {
	v := slices.Clone(seqs)
	slices.Sort(v)
	v = slices.Compact(v)
	var b strings.Builder
	for i := 0; i < len(v); {
		j := i
		for j+1 < len(v) && v[j+1] == v[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(v[i], 10))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.FormatInt(v[j], 10))
		}
		i = j + 1
	}
	return b.String()
}
