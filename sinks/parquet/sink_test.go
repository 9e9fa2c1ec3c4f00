package parquet

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	pq "github.com/parquet-go/parquet-go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/internal/testkit/parquettest"
	"github.com/tapflow/tapflow/internal/testkit/prereq"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name        string
		records     int
		batch       int
		span        time.Duration
		compression string
		rowGroup    int
		partitions  int
	}{
		{"zstd across 4 hours", 40000, 1000, 3 * time.Hour, CompressionZstd, 4096, 4},
		{"zstd-default", 12000, 777, 90 * time.Minute, CompressionZstdDefault, 1024, 3},
		{"snappy one hour", 5000, 5000, 10 * time.Minute, CompressionSnappy, 1024, 1},
		{"uncompressed small batches", 3000, 7, 2 * time.Hour, CompressionNone, 1024, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Compression, cfg.RowGroupRows = tc.compression, tc.rowGroup
			e := newSink(t, cfg)
			want := parquettest.Flows(parquettest.Spec{Records: tc.records, Span: tc.span})
			a := newAcks()
			r := start(t.Context(), e.sink)
			r.send(a.batches(want, tc.batch, 1000)...)
			r.close(t)

			nBatches := (tc.records + tc.batch - 1) / tc.batch
			if ok, failed := a.state(); ok != nBatches || failed != 0 {
				t.Fatalf("acks: %d ok, %d failed; want %d ok", ok, failed, nBatches)
			}
			got := readOutput(t, cfg.Output, "node-a")
			if len(got.rows) != tc.records {
				t.Fatalf("read %d rows, wrote %d", len(got.rows), tc.records)
			}
			wp, wb := sums(want)
			if gp, gb := sums(got.rows); gp != wp || gb != wb {
				t.Errorf("sums: packets %d bytes %d, want %d %d", gp, gb, wp, wb)
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
			if len(got.temps) != 0 {
				t.Errorf("temp files left: %v", got.temps)
			}
			if v := testutil.ToFloat64(e.sink.m.rows); v != float64(tc.records) {
				t.Errorf("rows_committed_total = %v, want %d", v, tc.records)
			}
			if v := testutil.ToFloat64(e.sink.m.files); v != float64(len(got.files)) {
				t.Errorf("files_committed_total = %v, want %d", v, len(got.files))
			}
			if v := testutil.ToFloat64(e.sink.m.bytes); v != float64(got.bytes) {
				t.Errorf("bytes_committed_total = %v, want %d on disk", v, got.bytes)
			}
			if v := testutil.ToFloat64(e.sink.m.open); v != 0 {
				t.Errorf("open_files = %v after the input closed", v)
			}
			// Row groups stay within row_group_rows (the memory bound) and
			// pages carry the configured codec.
			for _, rel := range got.files {
				p := filepath.Join(cfg.Output, "flows", rel)
				pf := openParquet(t, p)
				for _, rg := range pf.Metadata().RowGroups {
					if rg.NumRows > int64(tc.rowGroup) {
						t.Errorf("%s: row group of %d rows > row_group_rows %d", rel, rg.NumRows, tc.rowGroup)
					}
					if c := rg.Columns[0].MetaData.Codec.String(); !strings.HasPrefix(strings.ToLower(c), map[string]string{
						CompressionZstd: "zstd", CompressionZstdDefault: "zstd", CompressionSnappy: "snappy", CompressionNone: "uncompressed"}[tc.compression]) {
						t.Errorf("%s: codec %s, want %s", rel, c, tc.compression)
					}
				}
			}
		})
	}
}

func openParquet(t *testing.T, p string) *pq.File {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	st, _ := f.Stat()
	pf, err := pq.OpenFile(f, st.Size())
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return pf
}

// TestAckOnlyAfterRename checks that no batch is acked while its file is
// open, and that when the acks come the file is already under its final
// name with no temp file left.
func TestAckOnlyAfterRename(t *testing.T) {
	cfg := testConfig(t)
	e := newSink(t, cfg)
	recs := parquettest.Flows(parquettest.Spec{Records: 6000, Span: 90 * time.Minute})
	a := newAcks()
	var atAck []readBack
	a.hook = func(seq int64, err error) { atAck = append(atAck, readOutput(t, cfg.Output, "node-a")) }
	r := start(t.Context(), e.sink)
	r.send(a.batches(recs, 500, 1)...)
	r.sync(t)

	if ok, failed := a.state(); ok+failed != 0 {
		t.Fatalf("%d batches acked before any roll", ok+failed)
	}
	before := readOutput(t, cfg.Output, "node-a")
	if len(before.files) != 0 || len(before.temps) != 3 {
		t.Fatalf("before the roll: files %v, temps %v; want none and 3 temps", before.files, before.temps)
	}
	if v := testutil.ToFloat64(e.sink.m.open); v != 3 {
		t.Errorf("open_files = %v, want 3", v)
	}
	r.close(t)
	if len(atAck) != 12 {
		t.Fatalf("%d acks, want 12", len(atAck))
	}
	for i, rb := range atAck {
		if len(rb.files) != 3 || len(rb.temps) != 0 || len(rb.rows) != len(recs) {
			t.Fatalf("ack %d came with files %v, temps %v, %d rows readable; want both files committed", i, rb.files, rb.temps, len(rb.rows))
		}
	}
}

func TestAgeRoll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		cfg.RollAge = DefaultConfig().RollAge // 5m
		// No zstd inside the bubble: parquet-go pools its zstd encoders and
		// decoders process-wide, and one created here (with goroutines and
		// channels of the bubble) reused by a later test outside it is a
		// fatal "receive on synctest channel from outside bubble".
		cfg.Compression = CompressionNone
		e := newSink(t, cfg)
		recs := parquettest.Flows(parquettest.Spec{Records: 3000, Start: time.Date(2026, 11, 29, 10, 5, 0, 0, time.UTC), Span: 30 * time.Minute})
		a := newAcks()
		r := start(t.Context(), e.sink)
		r.send(a.batches(recs[:1000], 100, 1)...)
		time.Sleep(4 * time.Minute)
		r.send(a.batches(recs[1000:2000], 100, 11)...) // joins the open file
		time.Sleep(59 * time.Second)
		synctest.Wait()
		if ok, failed := a.state(); ok+failed != 0 {
			t.Fatalf("acked %d batches before roll_age", ok+failed)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if ok, failed := a.state(); ok != 20 || failed != 0 {
			t.Fatalf("after roll_age: %d ok, %d failed; want 20 ok", ok, failed)
		}
		if got := readOutput(t, cfg.Output, "node-a"); len(got.files) != 1 || len(got.rows) != 2000 {
			t.Fatalf("after roll_age: files %v with %d rows; want 1 file of 2000", got.files, len(got.rows))
		}
		// The next file starts its own age.
		r.send(a.batches(recs[2000:], 100, 21)...)
		time.Sleep(4 * time.Minute)
		synctest.Wait()
		if ok, _ := a.state(); ok != 20 {
			t.Fatalf("second file acked early: %d ok", ok)
		}
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		if ok, _ := a.state(); ok != 30 {
			t.Fatalf("second age roll: %d ok, want 30", ok)
		}
		r.close(t)
		if got := readOutput(t, cfg.Output, "node-a"); len(got.files) != 2 || len(got.rows) != 3000 {
			t.Fatalf("files %v with %d rows; want 2 files, 3000 rows", got.files, len(got.rows))
		}
	})
}

func TestSizeRoll(t *testing.T) {
	cfg := testConfig(t)
	cfg.RollSize = 64 << 10
	cfg.RowGroupRows = 1024
	e := newSink(t, cfg)
	recs := parquettest.Flows(parquettest.Spec{Records: 30000, Span: 20 * time.Minute})
	a := newAcks()
	r := start(t.Context(), e.sink)
	r.send(a.batches(recs, 250, 1)...)
	r.sync(t)
	ok, failed := a.state()
	if failed != 0 || ok == 0 {
		t.Fatalf("before close: %d ok, %d failed; want size rolls to have acked some", ok, failed)
	}
	r.close(t)
	got := readOutput(t, cfg.Output, "node-a")
	if len(got.rows) != len(recs) {
		t.Fatalf("%d rows read, %d written", len(got.rows), len(recs))
	}
	if len(got.files) < 8 {
		t.Fatalf("%d files for ~%d KiB; want size rolls at 64KiB", len(got.files), got.bytes>>10)
	}
	for _, rel := range got.files[1:] {
		st, err := os.Stat(filepath.Join(cfg.Output, "flows", rel))
		if err != nil {
			t.Fatal(err)
		}
		// One batch (250 rows) may overshoot the estimate; the first file
		// is cut on the initial bytes/row guess, the others on the measure.
		if st.Size() > int64(cfg.RollSize)+32<<10 {
			t.Errorf("%s: %d bytes, roll_size %d", rel, st.Size(), cfg.RollSize)
		}
	}
	// Names sort in seq order and seq ranges do not overlap.
	prevLast := ""
	for _, rel := range got.files {
		m := fileName.FindStringSubmatch(filepath.Base(rel))
		if m[2] <= prevLast {
			t.Errorf("%s: first seq %s not after previous last %s", rel, m[2], prevLast)
		}
		prevLast = m[3]
	}
}

func TestMaxOpenFiles(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxOpenFiles = 2
	e := newSink(t, cfg)
	base := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	hour := func(h int) []schemas.Flow {
		return parquettest.Flows(parquettest.Spec{Records: 100, Start: base.Add(time.Duration(h) * time.Hour), Span: time.Minute, Seed: uint64(h + 1)})
	}
	a := newAcks()
	r := start(t.Context(), e.sink)
	r.send(a.batch(1, hour(0)), a.batch(2, hour(1)))
	r.sync(t)
	if ok, _ := a.state(); ok != 0 {
		t.Fatalf("%d acked with 2 files open (max 2)", ok)
	}
	r.send(a.batch(3, hour(2)))
	r.sync(t)
	for seq, want := range map[int64]bool{1: true, 2: true, 3: false} {
		if _, acked := a.get(seq); acked != want {
			t.Errorf("batch %d acked=%v, want %v once a third partition opened", seq, acked, want)
		}
	}
	r.close(t)
	if got := readOutput(t, cfg.Output, "node-a"); len(got.files) != 3 || len(got.rows) != 300 {
		t.Fatalf("files %v, %d rows", got.files, len(got.rows))
	}
}

func TestHardStop(t *testing.T) {
	cfg := testConfig(t)
	e := newSink(t, cfg)
	recs := parquettest.Flows(parquettest.Spec{Records: 4000})
	a := newAcks()
	ctx, cancel := context.WithCancel(t.Context())
	r := start(ctx, e.sink)
	bs := a.batches(recs, 500, 1)
	r.send(bs[:6]...)
	r.sync(t)
	cancel()
	r.send(bs[6:]...) // still arriving: failed too
	r.close(t)
	if ok, failed := a.state(); ok != 0 || failed != len(bs) {
		t.Fatalf("acks: %d ok, %d failed; want all %d failed", ok, failed, len(bs))
	}
	err, _ := a.get(1)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "redelivered") {
		t.Errorf("hard-stop error %q: want context.Canceled and the redelivery note", err)
	}
	if got := readOutput(t, cfg.Output, "node-a"); len(got.files)+len(got.temps) != 0 {
		t.Errorf("after hard stop: files %v temps %v; want none", got.files, got.temps)
	}
}

func TestStaleTempFilesRemoved(t *testing.T) {
	cfg := testConfig(t)
	dir := filepath.Join(cfg.Output, "flows", "dt=2026-11-29", "hour=09")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]bool{ // name: removed at start
		".node-a@abc-1.parquet.tmp":                                true,
		".node-a@zz-17.parquet.tmp":                                true,
		".node-a-2@abc-1.parquet.tmp":                              false, // writer node-a-2 is another collector
		".node-b@abc-1.parquet.tmp":                                false,
		"node-a-00000000000000000001-00000000000000000002.parquet": false,
	}
	for name := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e := newSink(t, cfg)
	r := start(t.Context(), e.sink)
	r.close(t)
	for name, removed := range files {
		_, err := os.Stat(filepath.Join(dir, name))
		if gone := errors.Is(err, os.ErrNotExist); gone != removed {
			t.Errorf("%s: removed=%v, want %v", name, gone, removed)
		}
	}
}

// TestNameNeverReplaced: a batch range written again (redelivery) gets a
// suffix instead of replacing the committed file.
func TestNameNeverReplaced(t *testing.T) {
	cfg := testConfig(t)
	e := newSink(t, cfg)
	recs := parquettest.Flows(parquettest.Spec{Records: 100, Span: time.Minute})
	a := newAcks()
	r := start(t.Context(), e.sink)
	r.send(a.batch(5, recs))
	r.close(t)
	r = start(t.Context(), e.sink)
	r.send(a.batch(5, recs))
	r.close(t)
	got := readOutput(t, cfg.Output, "node-a")
	if len(got.files) != 2 || len(got.rows) != 200 {
		t.Fatalf("files %v with %d rows; want the first file kept and a suffixed second", got.files, len(got.rows))
	}
}

// TestFailureThenRecovery makes the output unwritable in several ways,
// checks that the batches fail with an error naming the path and the fix,
// that nothing partial is visible, that the failure is logged once, and
// that the sink commits again once the cause is fixed.
func TestFailureThenRecovery(t *testing.T) {
	for _, tc := range []struct {
		name    string
		root    bool // needs mount(2)
		break_  func(t *testing.T, output string) (fix func())
		errno   syscall.Errno
		inPath  string // the error names a path under output ending in this
		records int
		// steps: the failure is a full disk; the sink commits in small
		// steps what fits in the room left (files that fit are expected).
		steps bool
	}{
		{
			name: "output is a regular file",
			break_: func(t *testing.T, output string) func() {
				mustRemove(t, output)
				if err := os.WriteFile(output, []byte("not a dir"), 0o644); err != nil {
					t.Fatal(err)
				}
				return func() { mustRemove(t, output); mustMkdir(t, output) }
			},
			errno: syscall.ENOTDIR, inPath: "", records: 5000,
		},
		{
			name: "read-only filesystem", root: true,
			break_: func(t *testing.T, output string) func() {
				mount(t, output, syscall.MS_RDONLY, "size=1m")
				return func() { remount(t, output, 0, "size=1m") }
			},
			errno: syscall.EROFS, inPath: "/flows", records: 5000,
		},
		{
			name: "disk full", root: true,
			break_: func(t *testing.T, output string) func() {
				mount(t, output, 0, "size=256k")
				return func() { remount(t, output, 0, "size=64m") }
			},
			errno: syscall.ENOSPC, inPath: ".parquet.tmp", records: 30000, steps: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root {
				prereq.Root(t, "to mount a tmpfs")
			}
			cfg := testConfig(t)
			cfg.Output = filepath.Join(cfg.Output, "out")
			mustMkdir(t, cfg.Output)
			cfg.RowGroupRows = 1024
			fix := tc.break_(t, cfg.Output)
			e := newSink(t, cfg)
			recs := parquettest.Flows(parquettest.Spec{Records: tc.records, Span: 20 * time.Minute})
			a := newAcks()
			bs := a.batches(recs, 1000, 1)
			orig := make([][]schemas.Flow, len(bs)) // the sink lets go of a batch's records once written
			for j, b := range bs {
				orig[j] = b.Records
			}
			r := start(t.Context(), e.sink)

			// Send everything; batches fail, some perhaps commit (disk full
			// frees its space when the failed file is removed).
			var failed []int
			for _, b := range bs {
				r.send(b)
				r.sync(t)
			}
			for j, b := range bs {
				if err, acked := a.get(b.Seq); acked && err != nil {
					failed = append(failed, j)
				}
			}
			if len(failed) == 0 {
				t.Fatal("no batch failed")
			}
			err, _ := a.get(bs[failed[0]].Seq)
			var ce *CommitError
			if !errors.As(err, &ce) || !errors.Is(err, tc.errno) {
				t.Fatalf("batch failed with %v; want a *CommitError wrapping %v", err, tc.errno)
			}
			if !strings.HasPrefix(ce.Path, cfg.Output) || !strings.HasSuffix(ce.Path, tc.inPath) || !strings.Contains(err.Error(), ce.Path) {
				t.Errorf("error %q: path %q is not under %s ending in %q", err, ce.Path, cfg.Output, tc.inPath)
			}
			if !strings.Contains(err.Error(), "collector.output") || !strings.Contains(err.Error(), "redelivered") {
				t.Errorf("error %q does not say how to fix it and that messages are redelivered", err)
			}
			if _, serr := os.Stat(ce.Path); strings.HasSuffix(ce.Path, ".tmp") && !errors.Is(serr, os.ErrNotExist) {
				t.Errorf("failed temp file %s still there (%v)", ce.Path, serr)
			}
			if got := readOutput(t, cfg.Output, "node-a"); (len(got.files) != 0 && !tc.steps) || len(got.temps) > 1 {
				t.Errorf("after the failures: files %v, temps %v; want no file and at most the one being written", got.files, got.temps)
			} else if tc.steps {
				t.Logf("on the full disk: %d files committed in small steps", len(got.files))
			}
			if n := testutil.ToFloat64(e.sink.m.commitErrors); n < 3 {
				t.Errorf("commit_errors_total = %v, want ≥ 3", n)
			}
			if n := e.logs.count(slog.LevelError); n != 1 {
				t.Errorf("%d error logs for one repeated cause, want 1: %v", n, e.logs.msgs)
			}

			// Fix it; redeliver every failed batch and send the rest.
			fix()
			var again []*pipeline.Batch
			for _, j := range failed {
				again = append(again, a.batch(bs[j].Seq, orig[j]))
			}
			r.send(again...)
			r.close(t)
			if ok, nok := a.state(); ok != len(bs) || nok != 0 {
				t.Fatalf("after the fix: %d seqs ok, %d failed; want all %d ok", ok, nok, len(bs))
			}
			got := readOutput(t, cfg.Output, "node-a")
			if len(got.rows) != len(recs) || len(got.temps) != 0 {
				t.Fatalf("after the fix: %d rows (want %d), temps %v", len(got.rows), len(recs), got.temps)
			}
			wp, wb := sums(recs)
			if gp, gb := sums(got.rows); gp != wp || gb != wb {
				t.Errorf("sums %d/%d, want %d/%d", gp, gb, wp, wb)
			}
		})
	}
}

func mustRemove(t *testing.T, p string) {
	t.Helper()
	if err := os.RemoveAll(p); err != nil {
		t.Fatal(err)
	}
}

func mustMkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mount(t *testing.T, dir string, flags uintptr, data string) {
	t.Helper()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", flags, data); err != nil {
		prereq.Require(t, "a tmpfs on "+dir, err, "run as root with CAP_SYS_ADMIN, not in a container that forbids mounts")
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

func remount(t *testing.T, dir string, flags uintptr, data string) {
	t.Helper()
	if err := syscall.Mount("", dir, "", syscall.MS_REMOUNT|flags, data); err != nil {
		t.Fatalf("remount %s: %v", dir, err)
	}
}

func TestHourAndPartition(t *testing.T) {
	for _, tc := range []struct {
		t    time.Time
		want string
	}{
		{time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC), "dt=2026-11-29/hour=00"},
		{time.Date(2026, 11, 29, 23, 59, 59, 999999000, time.UTC), "dt=2026-11-29/hour=23"},
		{time.Date(2026, 12, 31, 23, 0, 0, 1000, time.UTC), "dt=2026-12-31/hour=23"},
		{time.Date(2027, 1, 1, 1, 30, 0, 0, time.FixedZone("CET", 3600)), "dt=2027-01-01/hour=00"},
		{time.Date(1969, 12, 31, 23, 59, 59, 0, time.UTC), "dt=1969-12-31/hour=23"},
		{time.Unix(0, 0), "dt=1970-01-01/hour=00"},
	} {
		if got := partition(hourOf(tc.t.UnixMicro())); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.t, got, tc.want)
		}
	}
}

func TestSeqRanges(t *testing.T) {
	for _, tc := range []struct {
		in   []int64
		want string
	}{
		{[]int64{7}, "7"},
		{[]int64{3, 1, 2}, "1-3"},
		{[]int64{1, 2, 3, 7, 9, 10, 10, 9}, "1-3,7,9-10"},
		{[]int64{18446744073709551 / 2, 5}, "5,9223372036854775"},
	} {
		if got := seqRanges(tc.in); got != tc.want {
			t.Errorf("seqRanges(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestUnderRunner(t *testing.T) {
	cfg := testConfig(t)
	e := newSink(t, cfg)
	recs := parquettest.Flows(parquettest.Spec{Records: 20000, Span: 2 * time.Hour})
	src := &sliceSource{recs: recs, size: 1000, sent: make(chan struct{})}
	runner, err := pipeline.NewRunner(pipeline.Config{Name: "collector"}, src, nil, e.sink, pipeline.NewMetrics(e.reg), slog.New(e.logs))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- runner.Run(ctx) }()
	<-src.sent
	cancel() // graceful: the sink commits what it holds as its input closes
	if err := <-done; err != nil {
		t.Fatalf("runner: %v", err)
	}
	if src.ok.Load() != int64(len(recs)) || src.failed.Load() != 0 {
		t.Fatalf("source saw %d records acked ok, %d failed; want %d ok", src.ok.Load(), src.failed.Load(), len(recs))
	}
	if got := readOutput(t, cfg.Output, "node-a"); len(got.rows) != len(recs) {
		t.Fatalf("%d rows, want %d", len(got.rows), len(recs))
	}
}
