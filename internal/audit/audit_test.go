package audit

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/internal/testkit/metered"
)

// TestAudit writes a conserved output (flows and meters over three hours,
// records straddling meter ticks and hour boundaries, some packets lost)
// through the real Parquet sink, then tampers with it: the audit passes the
// untouched output and names the node, tap, direction, hour and difference
// of every tampering.
func TestAudit(t *testing.T) {
	ctx := context.Background()
	data := metered.Generate(metered.Spec{MeanGap: 2 * time.Second, MeterInterval: 30 * time.Second})
	// The records of cmp2 tap201-aa rx ending 10:20-10:40 go missing.
	skip := map[int]bool{}
	var vb, vp int64
	for i, f := range data.Flows {
		if hm := time.UnixMicro(f.TimeEnd).UTC().Format("15:04"); f.Node == "cmp2" && f.Ifname == "tap201-aa" && f.Direction == "rx" && hm >= "10:20" && hm < "10:40" {
			skip[i] = true
			vb += f.Bytes
			vp += f.Packets
		}
	}
	if len(skip) < 10 {
		t.Fatalf("%d records to drop", len(skip))
	}

	tests := []struct {
		name   string
		skip   map[int]bool
		tamper func(t *testing.T, dir string)
		opts   Options
		want   []string // substrings of the output; none means it passes
	}{
		{name: "conserved"},
		{name: "conserved, one hour", opts: Options{From: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), To: time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC)}},
		{
			// Flagged in its hour, and in the next (the running difference
			// stays): the end of the data must be exact.
			name: "rows missing", skip: skip,
			want: []string{"MISMATCH node cmp2 tap tap201-aa rx hour 2026-12-01T10Z: ", "MISMATCH node cmp2 tap tap201-aa rx hour 2026-12-01T11Z: ",
				signed(-vb) + " / " + signed(-vp) + " running, outside [-0, +0]", "FAILED: 2 mismatches"},
		},
		{
			name: "flow file removed",
			tamper: func(t *testing.T, dir string) {
				removeOne(t, filepath.Join(dir, "flows", "dt=2026-12-01", "hour=10"))
			},
			want: []string{"MISMATCH node cmp1 tap tap100-aa tx hour 2026-12-01T10Z", "MISMATCH node cmp2 tap tap201-aa rx hour 2026-12-01T10Z"},
		},
		{
			name: "meter file removed",
			tamper: func(t *testing.T, dir string) {
				removeOne(t, filepath.Join(dir, "meters", "dt=2026-12-01", "hour=11"))
			},
			want: []string{"MISMATCH node cmp1 tap tap100-aa rx hour 2026-12-01T11Z", "difference +"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := metered.Write(ctx, dir, data, tc.skip); err != nil {
				t.Fatal(err)
			}
			if tc.tamper != nil {
				tc.tamper(t, dir)
			}
			out, err := dataset.Open(ctx, dir, dataset.Options{})
			if err != nil {
				t.Fatal(err)
			}
			r, err := Run(ctx, out, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			if err := r.Print(&b, false); err != nil {
				t.Fatal(err)
			}
			text := b.String()
			if r.FlowRecords == 0 || r.MeterRecords == 0 || r.Lost.Bytes == 0 {
				t.Fatalf("nothing read, or nothing lost:\n%s", text)
			}
			if len(tc.want) == 0 {
				if !r.OK() {
					t.Fatalf("conserved output fails the audit:\n%s", text)
				}
				// Hour boundaries were crossed and carried.
				carried := false
				for _, h := range r.Hours {
					carried = carried || h.Carry.Bytes != 0
				}
				if tc.opts.From.IsZero() && (len(r.Hours) != 8*3 || !carried) {
					t.Fatalf("%d key-hours, carried %v: the data does not cross hours as it should\n%s", len(r.Hours), carried, text)
				}
				return
			}
			if r.OK() {
				t.Fatalf("tampered output passes:\n%s", text)
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("output lacks %q:\n%s", w, text)
				}
			}
		})
	}
}

func signed(n int64) string {
	if n >= 0 {
		return "+" + itoa(n)
	}
	return "-" + itoa(-n)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// removeOne removes the first committed file of a partition directory.
func removeOne(t *testing.T, dir string) {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if strings.HasSuffix(e.Name(), ".parquet") {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no file in %s", dir)
}
