package parquet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
	"weak"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/schemas"
)

// liveHeap is the heap in use after a full GC.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestMemoryBounded shows that the records of written batches are let go
// while their file is open (only their acks wait for the commit), and that
// pushing many times roll_size through keeps the live heap bounded, with
// every record committed once.
func TestMemoryBounded(t *testing.T) {
	const perBatch = 4096
	const bound = 24 << 20 // live-heap growth allowed, bytes
	base := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		rollSize int64
		batches  int
		hours    int
		open     bool // roll_size and roll_age large: the file stays open until the input closes
	}{
		{name: "one open file holds many batches", rollSize: 1 << 30, batches: 64, hours: 1, open: true},
		{name: "10x roll_size over several hours", rollSize: 64 << 10, batches: 96, hours: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent := uint64(tc.batches*perBatch) * uint64(unsafe.Sizeof(schemas.Flow{}))
			if tc.open && sent < 3*bound {
				t.Fatalf("test too small to fail: %d bytes of records sent, bound %d", sent, bound)
			}
			cfg := testConfig(t)
			cfg.RollSize = units.ByteSize(tc.rollSize)
			cfg.RollAge = units.Duration(time.Hour)
			cfg.RowGroupRows = 4096
			e := env{reg: prometheus.NewRegistry(), logs: &logCounter{}}
			s, err := New(cfg, Options{Node: "node-a", Logger: slog.New(e.logs), Registry: e.reg, Dedupe: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			a := newAcks()
			r := start(t.Context(), s)
			before := liveHeap()
			var released []weak.Pointer[schemas.Flow]
			maxGrowth := int64(0)
			for i := range tc.batches {
				recs := agentBatch("agent-a", int64(i+1), perBatch, tc.hours, base)
				released = append(released, weak.Make(&recs[0]))
				r.send(a.batch(int64(i+1), recs))
				if i%16 == 15 {
					r.sync(t)
					maxGrowth = max(maxGrowth, settledGrowth(before))
				}
			}
			r.sync(t)
			maxGrowth = max(maxGrowth, settledGrowth(before))
			if tc.open {
				if ok, failed := a.state(); ok+failed != 0 {
					t.Fatalf("%d batches acked before the commit; want none (the file is open)", ok+failed)
				}
				kept := 0
				for _, w := range released {
					if w.Value() != nil {
						kept++
					}
				}
				if kept > 0 {
					t.Errorf("%d of %d written batches still have their records in memory while the file is open; want 0", kept, len(released))
				}
			}
			if maxGrowth > bound {
				t.Errorf("live heap grew by %d MiB while %d MiB of records went through; want at most %d MiB", maxGrowth>>20, sent>>20, bound>>20)
			}
			r.close(t)
			if ok, failed := a.state(); ok != tc.batches || failed != 0 {
				t.Fatalf("%d batches acked ok, %d failed; want %d ok", ok, failed, tc.batches)
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
			t.Logf("%d records (%d MiB in memory, %v bytes committed): live heap growth at most %d KiB", tc.batches*perBatch, sent>>20, committed, maxGrowth>>10)
		})
	}
}

// commitSizes is a slog.Handler recording the file count of every commit.
type commitSizes struct {
	mu    sync.Mutex
	files []int64
}

func (h *commitSizes) Enabled(context.Context, slog.Level) bool { return true }
func (h *commitSizes) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "committed parquet files" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "files" {
			h.mu.Lock()
			h.files = append(h.files, a.Value.Int64())
			h.mu.Unlock()
		}
		return true
	})
	return nil
}
func (h *commitSizes) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *commitSizes) WithGroup(string) slog.Handler      { return h }

// spanBatch returns perHour records in each of hours hours from base, in
// a shuffled order (a hostile batch: hours not grouped).
func spanBatch(agent string, seq int64, hours, perHour int, base time.Time) []schemas.Flow {
	recs := make([]schemas.Flow, 0, hours*perHour)
	for h := range hours {
		for k := range perHour {
			end := base.Add(time.Duration(h)*time.Hour + time.Duration(k)*time.Second)
			recs = append(recs, schemas.Flow{TimeStart: end.UnixMicro() - 1000, TimeEnd: end.UnixMicro(), AgentID: agent, BatchSeq: seq,
				Bytes: int64(h), Packets: 1, TenantID: "t", Direction: "tx", Node: "n"})
		}
	}
	rand.New(rand.NewPCG(uint64(seq), 7)).Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
	for i := range recs {
		recs[i].RecordIndex = int32(i)
	}
	return recs
}

// TestMaxOpenFilesInsideBatch sends one batch whose records span many
// hours (the 3,000-hour batch, scaled to 500 hours = 62×
// max_open_files: each file costs ~0.1 s under -race) between two
// ordinary ones: the sink commits early instead of opening more than
// max_open_files, acks the batch only once its last hour is committed, and
// every record is committed once.
func TestMaxOpenFilesInsideBatch(t *testing.T) {
	const hours = 500
	cfg := testConfig(t)
	commits := &commitSizes{}
	s, err := New(cfg, Options{Node: "node-a", Logger: slog.New(commits), Dedupe: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	want := [][]schemas.Flow{
		agentBatch("agent-a", 1, 10, 1, base.Add(hours*time.Hour)),
		spanBatch("agent-b", 2, hours, 2, base),
		agentBatch("agent-a", 3, 10, 2, base),
	}
	a := newAcks()
	a.hook = func(seq int64, err error) {
		if seq != 2 || err != nil {
			return
		}
		files, _ := filepath.Glob(filepath.Join(cfg.Output, "flows", "*", "*", "*.parquet"))
		if len(files) < hours {
			t.Errorf("the %d-hour batch was acked with %d files committed; want its %d hours committed first", hours, len(files), hours)
		}
	}
	r := start(t.Context(), s)
	for i, recs := range want {
		r.send(a.batch(int64(i+1), append([]schemas.Flow(nil), recs...)))
	}
	r.close(t)
	for seq := int64(1); seq <= 3; seq++ {
		if err, acked := a.get(seq); !acked || err != nil || a.calls[seq] != 1 {
			t.Fatalf("batch %d: acked=%v err=%v calls=%d; want acked once with nil", seq, acked, err, a.calls[seq])
		}
	}
	total := int64(0)
	for _, n := range commits.files {
		if n > int64(cfg.MaxOpenFiles) {
			t.Fatalf("a commit held %d files; max_open_files is %d", n, cfg.MaxOpenFiles)
		}
		total += n
	}
	if total < hours || len(commits.files) < hours/cfg.MaxOpenFiles {
		t.Fatalf("%d commits of %d files in all; want ≥ %d commits of ≤ %d files covering ≥ %d hours", len(commits.files), total, hours/cfg.MaxOpenFiles, cfg.MaxOpenFiles, hours)
	}
	exactlyOnce(t, cfg.Output, want)
}

// TestMaxOpenFilesInsideBatchFailure fails a wide batch after some of its
// early commits (a partition directory cannot be created): the batch is
// failed, its committed hours stay, and its redelivery writes only the
// rest: every record once.
func TestMaxOpenFilesInsideBatchFailure(t *testing.T) {
	const hours = 40
	e, s := dedupeSink(t, t.TempDir(), "node-a")
	output := s.cfg.Output
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// A dangling symlink where hour 20's partition directory would go:
	// the ledger lists it as empty, creating the temp file in it fails.
	block := filepath.Join(output, "flows", partition(hourOf(base.Add(20*time.Hour).UnixMicro())))
	mustMkdir(t, filepath.Dir(block))
	if err := os.Symlink(filepath.Join(output, "nowhere"), block); err != nil {
		t.Fatal(err)
	}
	want := spanBatch("agent-a", 1, hours, 3, base)
	a := newAcks()
	r := start(t.Context(), s)
	r.send(a.batch(1, append([]schemas.Flow(nil), want...)))
	r.sync(t)
	err, acked := a.get(1)
	var ce *CommitError
	if !acked || !errors.As(err, &ce) || ce.Op != "create" || filepath.Dir(ce.Path) != block {
		t.Fatalf("batch acked=%v with %v; want a create *CommitError in %s", acked, err, block)
	}
	if files, _ := filepath.Glob(filepath.Join(output, "flows", "*", "*", "*.parquet")); len(files) < 16 {
		t.Fatalf("%d files committed before the failure; want the 16 hours of the early commits", len(files))
	}
	mustRemove(t, block)
	r.send(a.batch(1, append([]schemas.Flow(nil), want...))) // redelivery
	r.close(t)
	if err, _ := a.get(1); err != nil || a.calls[1] != 2 {
		t.Fatalf("redelivery acked with %v (calls %d); want nil, 2 calls in all", err, a.calls[1])
	}
	if n := testutil.ToFloat64(e.sink.m.dupRecords); n < 16*3 {
		t.Errorf("duplicate_records_total = %v; want ≥ 48 (the committed hours skipped)", n)
	}
	exactlyOnce(t, output, [][]schemas.Flow{want})
}

// TestTimeOutOfRange refuses batches with a time_end the sink must not
// make a partition of, without writing any record or directory, and
// accepts the edges of the range.
func TestTimeOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		name string
		us   int64
		ok   bool
	}{
		{"year -144169", time.Date(-144169, 5, 1, 0, 0, 0, 0, time.UTC).UnixMicro(), false},
		{"min int64", math.MinInt64, false},
		{"max int64", math.MaxInt64, false},
		{"epoch", 0, false},
		{"just before the range", MinTimeEnd.UnixMicro() - 1, false},
		{"end of the range", MaxTimeEnd.UnixMicro(), false},
		{"start of the range", MinTimeEnd.UnixMicro(), true},
		{"last µs of the range", MaxTimeEnd.UnixMicro() - 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			e := newSink(t, cfg)
			recs := agentBatch("agent-a", 1, 3, 1, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			recs[1].TimeEnd = tc.us
			a := newAcks()
			r := start(t.Context(), e.sink)
			r.send(a.batch(1, recs))
			r.close(t)
			err, acked := a.get(1)
			if !acked {
				t.Fatal("batch not acked")
			}
			rb := readOutput(t, cfg.Output, "node-a")
			if tc.ok {
				if err != nil || len(rb.rows) != 3 {
					t.Fatalf("acked with %v, %d rows committed; want nil and 3", err, len(rb.rows))
				}
				return
			}
			var re *RangeError
			if !errors.Is(err, ErrTimeOutOfRange) || !errors.As(err, &re) || re.Index != 1 || re.TimeEnd != tc.us {
				t.Fatalf("acked with %v; want a *RangeError for record 1 wrapping ErrTimeOutOfRange", err)
			}
			for _, s := range []string{fmt.Sprint(tc.us), MinTimeEnd.Format(time.DateOnly), "clock", "replay"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			if entries, _ := os.ReadDir(filepath.Join(cfg.Output, "flows")); len(entries) != 0 || len(rb.files) != 0 {
				t.Fatalf("refused batch left %d entries under flows/ (%v files)", len(entries), rb.files)
			}
			if n := testutil.ToFloat64(e.sink.m.rejected); n != 1 {
				t.Errorf("rejected_batches_total = %v, want 1", n)
			}
		})
	}
}
