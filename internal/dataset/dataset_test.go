package dataset

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/testkit/parquettest"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/schemas/columns"
)

// TestListLocal: only committed files are listed (no temp names, nothing
// under a dot directory), sorted, with their partition; a missing schema
// directory is ErrNoDir; a file that is not a directory is refused.
func TestListLocal(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{
		"flows/dt=2026-12-01/hour=10/a-1-2.parquet",
		"flows/dt=2026-12-01/hour=09/b-1-2.parquet",
		"flows/dt=2026-12-01/hour=10/.a-3-4.parquet.tmp",
		"flows/dt=2026-12-01/hour=10/notes.txt",
		"flows/.staging/x.parquet",
	} {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	out, err := Open(ctx, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	files, err := out.List(ctx, "flows")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range files {
		got = append(got, f.Rel+" "+f.Partition())
	}
	want := []string{"flows/dt=2026-12-01/hour=09/b-1-2.parquet dt=2026-12-01/hour=09", "flows/dt=2026-12-01/hour=10/a-1-2.parquet dt=2026-12-01/hour=10"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if _, err := out.List(ctx, "meters"); !errors.Is(err, ErrNoDir) {
		t.Fatalf("meters: %v, want ErrNoDir", err)
	}
	r, err := out.Open(ctx, files[0])
	if err != nil || r.Size() != 1 {
		t.Fatalf("open: %v", err)
	}
	r.Close()
	for _, bad := range []struct{ arg, want string }{
		{"", "no data given"},
		{filepath.Join(dir, "nope"), "no such file"},
		{filepath.Join(dir, "flows/dt=2026-12-01/hour=10/a-1-2.parquet"), "is not a directory"},
		{"s3://", "collector.output"},
	} {
		if _, err := Open(ctx, bad.arg, Options{}); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Open(%q): %v, want %q", bad.arg, err, bad.want)
		}
	}
}

// TestReadRowsOlderMinor: ReadRows decodes whole flow.v1 rows from files
// of every minor version (flow.v1.0 has no pool_id, member_id or lb_tap:
// they read as empty strings), every row once, and refuses a file of another schema
// naming it.
func TestReadRowsOlderMinor(t *testing.T) {
	recs := parquettest.Flows(parquettest.Spec{Records: 3000, Span: 30 * time.Minute})
	for minor := range columns.FlowMinor + 1 {
		t.Run(fmt.Sprintf("flow.v1.%d", minor), func(t *testing.T) {
			dir := t.TempDir()
			if _, err := parquettest.WriteOlderMinor(dir, "old", minor, recs); err != nil {
				t.Fatal(err)
			}
			out, err := Open(context.Background(), dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			files, err := out.List(context.Background(), "flows")
			if err != nil {
				t.Fatal(err)
			}
			var n, bytes int64
			pools := 0
			for _, f := range files {
				k, err := ReadRows(context.Background(), out, f, schemas.SchemaName, func(r *schemas.Flow) {
					bytes += r.Bytes
					if r.PoolID != "" {
						pools++
					}
				})
				if err != nil {
					t.Fatal(err)
				}
				n += k
			}
			var want int64
			for _, r := range recs {
				want += r.Bytes
			}
			if n != int64(len(recs)) || bytes != want || (minor == 0) != (pools == 0) {
				t.Fatalf("%d rows, %d bytes, %d with pool_id; want %d rows, %d bytes", n, bytes, pools, len(recs), want)
			}
			if _, err := ReadRows(context.Background(), out, files[0], schemas.MeterSchemaName, func(*schemas.Meter) {}); err == nil || !strings.Contains(err.Error(), files[0].Rel) {
				t.Fatalf("a flow file read as meters: %v", err)
			}
		})
	}
}
