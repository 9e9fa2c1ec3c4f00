package report

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/sinks/parquet"
	"github.com/tapflow/tapflow/sinks/parquet/parquettest"
)

// writeWithSink commits recs through the real Parquet sink under a new
// data directory, in batches of 1000, and returns the directory.
func writeWithSink(t *testing.T, recs []schemas.Flow, rollSize int64) string {
	return writeData(t, recs, rollSize)
}

func writeWithSinkB(b *testing.B, recs []schemas.Flow) string { return writeData(b, recs, 0) }

func writeData(t testing.TB, recs []schemas.Flow, rollSize int64) string {
	t.Helper()
	dir := t.TempDir()
	cfg := parquet.DefaultConfig()
	cfg.Output = dir
	if rollSize > 0 {
		cfg.RowGroupRows = 2048
		cfg.RollSize = 1 << 16
	}
	s, err := parquet.New(cfg, parquet.Options{Node: "test", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	in := make(chan *pipeline.Batch, 4)
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background(), in) }()
	failed := 0
	for i := 0; i < len(recs); i += 1000 {
		b := pipeline.NewBatch(recs[i:min(i+1000, len(recs))], func(err error) {
			if err != nil {
				failed++
			}
		})
		b.Seq = int64(i/1000) + 1
		in <- b
	}
	close(in)
	if err := <-done; err != nil || failed > 0 {
		t.Fatalf("sink: %v, %d batches failed", err, failed)
	}
	return dir
}

func hourStart(us int64) time.Time { return time.UnixMicro(us).UTC().Truncate(time.Hour) }

// expect computes the report rows straight from the records.
func expect(recs []schemas.Flow, keep func(*schemas.Flow) bool) (map[key]Row, Row) {
	m := map[key]Row{}
	var total Row
	for i := range recs {
		f := &recs[i]
		if !keep(f) {
			continue
		}
		k := key{f.TenantID, f.Zone, f.Direction}
		r := m[k]
		r.Tenant, r.Zone, r.Direction = k.tenant, k.zone, k.dir
		r.Records++
		r.Packets += f.Packets
		r.Bytes += f.Bytes
		m[k] = r
		total.Records++
		total.Packets += f.Packets
		total.Bytes += f.Bytes
	}
	return m, total
}

func TestRead(t *testing.T) {
	start := time.Date(2026, 11, 29, 10, 40, 0, 0, time.UTC)
	recs := parquettest.Flows(parquettest.Spec{Records: 30000, Start: start, Span: 150 * time.Minute}) // hours 10..13
	dir := writeWithSink(t, recs, 1<<16)
	tenant := recs[17].TenantID
	for _, tc := range []struct {
		name       string
		opts       Options
		keep       func(*schemas.Flow) bool
		partitions []string
	}{
		{
			name: "everything", keep: func(*schemas.Flow) bool { return true },
			partitions: []string{"dt=2026-11-29/hour=10", "dt=2026-11-29/hour=11", "dt=2026-11-29/hour=12", "dt=2026-11-29/hour=13"},
		},
		{
			name: "from 11:30 to 13:00",
			opts: Options{From: start.Add(50 * time.Minute), To: start.Add(140 * time.Minute).Truncate(time.Hour)},
			keep: func(f *schemas.Flow) bool {
				h := hourStart(f.TimeEnd)
				return h.Hour() == 11 || h.Hour() == 12
			},
			partitions: []string{"dt=2026-11-29/hour=11", "dt=2026-11-29/hour=12"},
		},
		{
			name: "one tenant", opts: Options{Tenant: tenant},
			keep:       func(f *schemas.Flow) bool { return f.TenantID == tenant },
			partitions: []string{"dt=2026-11-29/hour=10", "dt=2026-11-29/hour=11", "dt=2026-11-29/hour=12", "dt=2026-11-29/hour=13"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Read(dir, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			want, total := expect(recs, tc.keep)
			got := map[key]Row{}
			for i, r := range rep.Rows {
				got[key{r.Tenant, r.Zone, r.Direction}] = r
				if i > 0 {
					p := rep.Rows[i-1]
					if p.Tenant > r.Tenant || p.Tenant == r.Tenant && (p.Zone > r.Zone || p.Zone == r.Zone && p.Direction >= r.Direction) {
						t.Errorf("rows not sorted: %v before %v", p, r)
					}
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %d rows, want %d; totals %+v, want %+v", len(got), len(want), rep.Total, total)
			}
			if rep.Total != total {
				t.Errorf("total %+v, want %+v", rep.Total, total)
			}
			var names []string
			var files int
			var rows, size int64
			for _, p := range rep.Partitions {
				names = append(names, p.Name)
				files += p.Files
				rows += p.Rows
				size += p.Bytes
			}
			if !reflect.DeepEqual(names, tc.partitions) {
				t.Errorf("partitions %v, want %v", names, tc.partitions)
			}
			if files != rep.Files || rows != rep.FileRows || size != rep.DiskBytes || rep.Files < len(tc.partitions)*2 {
				t.Errorf("files %d rows %d bytes %d; partitions add up to %d %d %d (want ≥ 2 files per partition: roll_size is small)",
					rep.Files, rep.FileRows, rep.DiskBytes, files, rows, size)
			}
			if disk := diskUsage(t, dir, tc.partitions); disk != rep.DiskBytes {
				t.Errorf("bytes on disk %d, files sum to %d", rep.DiskBytes, disk)
			}
		})
	}
}

func diskUsage(t *testing.T, dir string, parts []string) int64 {
	t.Helper()
	var n int64
	for _, p := range parts {
		m, _ := filepath.Glob(filepath.Join(dir, "flows", p, "*.parquet"))
		for _, f := range m {
			st, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			n += st.Size()
		}
	}
	return n
}

func TestRunPrintsAlignedTable(t *testing.T) {
	recs := parquettest.Flows(parquettest.Spec{Records: 5000, Tenants: 3, Start: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC), Span: 90 * time.Minute})
	dir := writeWithSink(t, recs, 0)
	// Temp files and dot directories are not committed data.
	part := filepath.Join(dir, "flows", "dt=2026-11-29", "hour=10")
	for _, p := range []string{filepath.Join(part, ".test@x-9.parquet.tmp"), filepath.Join(dir, "flows", ".trash", "old.parquet")} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("garbage"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := Run(&out, dir, Options{}); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	lines := strings.Split(text, "\n")
	want, total := expect(recs, func(*schemas.Flow) bool { return true })
	if len(lines) < len(want)+4 {
		t.Fatalf("%d lines for %d rows:\n%s", len(lines), len(want), text)
	}
	table := lines[:len(want)+4] // header, rule, rows, rule, total
	for i, l := range table {
		if len(l) != len(table[0]) {
			t.Errorf("table line %d is %d wide, header %d:\n%s", i, len(l), len(table[0]), text)
			break
		}
	}
	if f := strings.Fields(table[0]); !reflect.DeepEqual(f, []string{"tenant_id", "zone", "direction", "records", "packets", "bytes"}) {
		t.Errorf("header %q", table[0])
	}
	if f := strings.Fields(table[len(table)-1]); !reflect.DeepEqual(f, []string{"TOTAL", itoa(total.Records), itoa(total.Packets), itoa(total.Bytes)}) {
		t.Errorf("totals line %q, want %d %d %d", table[len(table)-1], total.Records, total.Packets, total.Bytes)
	}
	for _, l := range table[2 : len(table)-2] {
		f := strings.Fields(l)
		r, ok := want[key{f[0], f[1], f[2]}]
		if !ok || itoa(r.Records) != f[3] || itoa(r.Packets) != f[4] || itoa(r.Bytes) != f[5] {
			t.Errorf("line %q: want %+v", l, r)
		}
	}
	for _, s := range []string{"files: 2  rows: 5000  bytes on disk: ", "partitions (2):", "dt=2026-11-29/hour=10", "dt=2026-11-29/hour=11"} {
		if !strings.Contains(text, s) {
			t.Errorf("output lacks %q:\n%s", s, text)
		}
	}
}

func TestReadErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the path the error must name
		want  string
	}{
		{
			name:  "no flows directory",
			setup: func(t *testing.T, dir string) string { return filepath.Join(dir, "flows") },
			want:  "point --data at the collector output",
		},
		{
			name: "truncated file",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "flows", "dt=2026-11-29", "hour=10", "x-1-1.parquet")
				writeFlows(t, p, schemas.SchemaName)
				b, _ := os.ReadFile(p)
				if err := os.WriteFile(p, b[:len(b)/2], 0o644); err != nil {
					t.Fatal(err)
				}
				return p
			},
			want: "move it out of",
		},
		{
			name: "not flow.v1",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "flows", "dt=2026-11-29", "hour=10", "x-1-1.parquet")
				writeFlows(t, p, "flow.v0")
				return p
			},
			want: `tapflow.schema="flow.v0"`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := tc.setup(t, dir)
			err := Run(io.Discard, dir, Options{})
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v; want it to name %s and say %q", err, path, tc.want)
			}
		})
	}
}

func writeFlows(t *testing.T, p, schema string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := pq.NewGenericWriter[schemas.Flow](f, pq.KeyValueMetadata(schemas.MetadataKey, schema))
	if _, err := w.Write(parquettest.Flows(parquettest.Spec{Records: 3000})); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestHuman(t *testing.T) {
	for in, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 40 << 20: "40.0 MiB", 3 << 30: "3.0 GiB"} {
		if got := human(in); got != want {
			t.Errorf("human(%d) = %q, want %q", in, got, want)
		}
	}
}

// TestReadLargeRowGroups reads row groups whose column chunks span many
// pages, with page boundaries at different rows in each column.
func TestReadLargeRowGroups(t *testing.T) {
	recs := parquettest.Flows(parquettest.Spec{Records: 300_000, Span: 30 * time.Minute, Start: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)})
	dir := writeWithSink(t, recs, 0)
	rep, err := Read(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want, total := expect(recs, func(*schemas.Flow) bool { return true })
	got := map[key]Row{}
	for _, r := range rep.Rows {
		got[key{r.Tenant, r.Zone, r.Direction}] = r
	}
	if rep.Total != total || !reflect.DeepEqual(got, want) {
		t.Fatalf("total %+v, want %+v; %d rows, want %d", rep.Total, total, len(got), len(want))
	}
	// The data really spans several pages per column chunk.
	m, _ := filepath.Glob(filepath.Join(dir, "flows", "*", "*", "*.parquet"))
	if len(m) != 1 {
		t.Fatalf("files %v", m)
	}
	f, err := os.Open(m[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	pf, err := pq.OpenFile(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := pf.Schema().Lookup("packets")
	oi, err := pf.RowGroups()[0].ColumnChunks()[leaf.ColumnIndex].OffsetIndex()
	if err != nil || oi.NumPages() < 3 {
		t.Fatalf("packets chunk has %v pages (%v); want several", oi, err)
	}
}

func TestNoFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "flows", "dt=2026-11-29", "hour=10"), 0o755); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Run(&out, dir, Options{}); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "no committed Parquet files\n" {
		t.Fatalf("output %q", got)
	}
}
