// Package parquet is the collector's sink: it writes batches of records as
// Parquet files that DuckDB, Spark or Trino can query, and acks each batch
// only once the files holding its records are durable (DESIGN §4–§5).
//
// [Sink] is generic over the record type; a [Schema] names the top
// directory, the time_end accessor that picks the hour partition, the schema
// name written as metadata and the columns without page bounds.
// [FlowSchema] (flow.v1, "flows") is the one [New] uses; [NewFor] takes any.
//
// Layout: <output>/<dir>/dt=YYYY-MM-DD/hour=HH/<writer>-<first>-<last>.parquet,
// partitioned by time_end (UTC). first and last are the lowest and highest
// Batch.Seq (the JetStream stream sequence) of the batches in the file,
// zero-padded to 20 digits so names sort. Files are written with parquet-go
// (GenericWriter[T], or its column writers for schemas.Row): zstd (fastest level by default), dictionary
// encoding on low-cardinality strings, delta encoding on times, INT64
// TIMESTAMP(MICROS) times, row groups of Config.RowGroupRows rows, and
// key-value metadata tapflow.schema=<schema name>, tapflow.writer and
// tapflow.batch_seqs.
//
// One file is open per partition. All open files roll together — when one
// reaches Config.RollSize (estimated as bytes flushed + buffered rows ×
// measured bytes/row), when the oldest is Config.RollAge old, when a batch
// would open more than Config.MaxOpenFiles partitions, and when the input
// closes. A batch spanning more hours than MaxOpenFiles is grouped by hour
// and commits the open files before opening more (its earlier hours are
// committed; it is acked with the commit of its last), so no more than
// MaxOpenFiles are ever open. A batch with a time_end outside
// [MinTimeEnd, MaxTimeEnd) is refused whole with a *RangeError: no bogus
// partition (year −144169) is ever created. A commit writes each file under a temp name in its partition
// directory (".<writer>@<nonce>-<n>.parquet.tmp": dot-prefixed, so globs
// such as flows/**/*.parquet never see it), closes it, fsyncs it, renames it,
// fsyncs the directory, and only then acks every batch held.
//
// Failures (unwritable directory, full disk, …) remove the open files and
// ack every held batch with a [*CommitError] naming the path and the fix;
// the sink logs that once, counts it and keeps running, and the source
// redelivers. After a failure for lack of space (ENOSPC, EDQUOT) it commits
// in small steps that fit the free space until commits succeed again
// (space.go), so the redelivered backlog drains file by file with little
// room. Temp files of this writer left by a crash are removed when Run
// starts; with a Remote that can (s3out), so are this writer's incomplete
// multipart uploads, again after an upload succeeds following failures.
//
// Two record forms: T = a generated record struct (FlowSchema, MeterSchema:
// GenericWriter[T]), and T = schemas.Row (FlowRowSchema, MeterRowSchema:
// the collector's path), where every batch is a decoded message kept in
// its Arrow columns and columns.go writes the values straight into the
// file's Parquet column writers, no row struct in between; both write the
// same files. A column dictionary-encoded on the wire goes into the
// Parquet dictionary page as indices: each message entry a piece of rows
// uses is inserted into the row group's dictionary once, not every row's
// value (dictindex.go; the value path stays for plain wire columns and
// whatever parquet-go layout it does not know). Everything else (hours, dedupe, roll, commit, upload) is the
// same generic code.
//
// Memory: records stream into the open files' row groups as batches
// arrive, and the sink lets go of a batch's records (Batch.Records = nil)
// once they are written; what waits for the commit is the batch's ack, its
// identity in the file's metadata lists and per-file counts. So memory is
// bounded by MaxOpenFiles × (one row group, ≈40 B/row compressed, + page
// buffers and dictionaries), not by RollSize: measured ≈30 MiB of heap per
// open file at the default 262144-row row groups (BenchmarkCollectorRSS).
// Config.Validate refuses settings whose estimate exceeds MemoryBudget.
// For schemas.Row batches the sink is also where a message's decode
// buffers end: once a batch's rows are written (or refused, deduplicated
// or failed) it calls schemas.ReleaseRows, and a pooling decoder
// (consume's) recycles them for the next messages; the column writers
// keep copies, never the rows (TestPooledRowsReleasedOnlyWhenWritten).
//
// Exactly once (Options.Dedupe, set by the collector): every file also
// records the agent batches it holds (tapflow.batches = "agent:5-9,12;…").
// A ledger per hour partition, rebuilt lazily from those footers the first
// time a batch touches the partition and re-listed when a batch finds the
// listing older than Options.LedgerRefresh (ack_wait/3, at most 10 s, in the
// collector: shorter than the earliest redelivery after a crash) to see the
// commits of other collectors sharing the output, tells which pieces —
// one agent batch's records of one hour — are committed or in an open
// file. A redelivered batch's committed pieces are not written again; its
// other pieces are (a crash between the renames of one roll leaves some
// hours committed and not others); a batch wholly committed is acked
// without writing, one whose copy is in an open file is acked with that
// file's commit. This relies on the transport contract: all records of one
// message carry one (agent_id, batch_seq) that no other message carries.
// Partitions untouched for long are forgotten (at most 48 kept).
//
// Metrics: tapflow_parquet_{files_committed_total, bytes_committed_total,
// rows_committed_total, commit_errors_total, open_files, commit_seconds,
// duplicate_records_total, duplicate_batches_total, rejected_batches_total},
// labelled schema=<schema name>.
package parquet
