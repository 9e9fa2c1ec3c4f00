package dataset

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
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
