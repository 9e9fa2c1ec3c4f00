package compat

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/testkit/metered"
)

// conservationQuery returns the setup view and the audit-query block of
// docs/queries.md.
func conservationQuery(t *testing.T) (setup, block string) {
	t.Helper()
	_, queries := cookbook(t)
	b := readQueries(t)
	m := regexp.MustCompile("(?s)<!-- audit-query: conservation -->\\s*```sql\\n(.*?)```").FindStringSubmatch(b)
	if m == nil {
		t.Fatal("docs/queries.md has no <!-- audit-query: conservation --> block")
	}
	return queries["setup"], m[1]
}

// TestConservationQuery runs the cookbook's conservation query with DuckDB
// on collector output written by the real Parquet sink (flows and meters
// over three hours, records crossing meter ticks and hour boundaries, some
// packets lost): conserved output returns no row; with 20 minutes of one
// tap's records missing it returns that tap's hour with the missing bytes
// as the running difference at the end of the data.
func TestConservationQuery(t *testing.T) {
	setup, block := conservationQuery(t)
	data := metered.Generate(metered.Spec{MeanGap: 2 * time.Second, MeterInterval: 30 * time.Second})
	skip := map[int]bool{}
	var missing int64
	for i, f := range data.Flows {
		if hm := time.UnixMicro(f.TimeEnd).UTC().Format("15:04"); f.Node == "cmp2" && f.Ifname == "tap201-aa" && f.Direction == "rx" && hm >= "10:20" && hm < "10:40" {
			skip[i] = true
			missing += f.Bytes
		}
	}
	tests := []struct {
		name string
		skip map[int]bool
		want []string // row prefixes
	}{
		{"conserved", nil, nil},
		{"rows missing", skip, []string{"cmp2|tap201-aa|rx|2026-12-01T10Z|", "cmp2|tap201-aa|rx|2026-12-01T11Z|"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := metered.Write(context.Background(), dir, data, tc.skip); err != nil {
				t.Fatal(err)
			}
			db := openDB(t)
			stmts := strings.Split(strings.ReplaceAll(setup+block, placeholder, dir), ";")
			var last string
			for _, s := range stmts {
				if strings.TrimSpace(s) == "" {
					continue
				}
				if last != "" {
					if _, err := db.Exec(last); err != nil {
						t.Fatalf("%v\n%s", err, last)
					}
				}
				last = s
			}
			got := query(t, db, last)
			t.Logf("conservation query: %d rows %q", len(got), got)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d rows %q, want %d", len(got), got, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(got[i], w) {
					t.Errorf("row %d = %q, want prefix %q", i, got[i], w)
				}
			}
			if len(got) > 0 {
				// The end of the data: running = −missing, no carry allowed.
				if want := fmt.Sprintf("|%d|0|0", -missing); !strings.HasSuffix(got[len(got)-1], want) {
					t.Errorf("last row %q, want suffix %q", got[len(got)-1], want)
				}
			}
		})
	}
}

func readQueries(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "queries.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
