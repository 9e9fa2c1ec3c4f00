package parquet

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/testkit/parquettest"
)

// TestStatistics checks the statistics readers prune with: min/max on
// time_end (and the other columns) in every column chunk and in the page
// index, none on the unsorted high-cardinality strings.
func TestStatistics(t *testing.T) {
	cfg := testConfig(t)
	cfg.RowGroupRows = 4096
	e := newSink(t, cfg)
	recs := parquettest.Flows(parquettest.Spec{Records: 20000, Span: 10 * time.Minute})
	a := newAcks()
	r := start(t.Context(), e.sink)
	r.send(a.batches(recs, 2000, 1)...)
	r.close(t)
	files, _ := filepath.Glob(filepath.Join(cfg.Output, "flows", "dt=*", "hour=*", "*.parquet"))
	if len(files) != 1 {
		t.Fatalf("files %v", files)
	}
	pf := openParquet(t, files[0])
	for _, name := range []string{"time_end", "time_start", "tenant_id", "zone", "bytes", "ifname", "src_ip"} {
		leaf, _ := pf.Schema().Lookup(name)
		wantBounds := !slices.Contains(FlowSchema.SkipPageBounds, name)
		for i, rg := range pf.RowGroups() {
			st := pf.Metadata().RowGroups[i].Columns[leaf.ColumnIndex].MetaData.Statistics
			if has := len(st.MinValue) > 0 && len(st.MaxValue) > 0; has != wantBounds {
				t.Errorf("%s row group %d: column chunk min/max present=%v, want %v", name, i, has, wantBounds)
			}
			ci, err := rg.ColumnChunks()[leaf.ColumnIndex].ColumnIndex()
			if err != nil {
				t.Fatalf("%s: page index: %v", name, err)
			}
			if has := ci.NumPages() > 0 && len(ci.MinValue(0).Bytes()) > 0; has != wantBounds {
				t.Errorf("%s row group %d: page index min present=%v, want %v", name, i, has, wantBounds)
			}
		}
	}
}
