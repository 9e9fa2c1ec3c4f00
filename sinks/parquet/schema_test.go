package parquet

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
)

// gauge is a record type other than flow.v1: the sink must partition it by
// its own time_end accessor, write it under its own directory and label it
// with its own schema name.
type gauge struct {
	TimeEnd int64  `parquet:"time_end,timestamp(microsecond)"`
	Name    string `parquet:"name,dict"`
	Value   int64  `parquet:"value"`
}

var gaugeSchema = Schema[gauge]{
	Name:    "gauge.v1",
	Dir:     "gauges",
	TimeEnd: func(g *gauge) int64 { return g.TimeEnd },
}

func TestSchemaValidate(t *testing.T) {
	te := func(*gauge) int64 { return 0 }
	for _, tc := range []struct {
		name   string
		schema Schema[gauge]
		want   string // "" = valid
	}{
		{"valid", Schema[gauge]{Name: "g", Dir: "gauges", TimeEnd: te}, ""},
		{"no name", Schema[gauge]{Dir: "gauges", TimeEnd: te}, "no name"},
		{"no dir", Schema[gauge]{Name: "g", TimeEnd: te}, "not one path element"},
		{"nested dir", Schema[gauge]{Name: "g", Dir: "a/b", TimeEnd: te}, "not one path element"},
		{"dot dot", Schema[gauge]{Name: "g", Dir: "..", TimeEnd: te}, "not one path element"},
		{"no accessor", Schema[gauge]{Name: "g", Dir: "gauges"}, "no TimeEnd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			s, err := NewFor(cfg, tc.schema, Options{Node: "n"})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("NewFor: %v", err)
				}
				_ = s.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewFor error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestOtherSchema writes a second record type next to flows on the same
// registry: its own directory, hour partitions from its accessor, its
// schema name in the metadata and the metrics.
func TestOtherSchema(t *testing.T) {
	cfg := testConfig(t)
	e := newSink(t, cfg) // flow sink on the same registry
	gs, err := NewFor(cfg, gaugeSchema, Options{Node: "node-a", Registry: e.reg})
	if err != nil {
		t.Fatalf("a gauge sink next to a flow sink: %v", err)
	}
	t.Cleanup(func() { _ = gs.Close() })

	t0 := time.Date(2025, 3, 1, 10, 59, 59, 0, time.UTC).UnixMicro()
	recs := []gauge{
		{TimeEnd: t0, Name: "a", Value: 1},
		{TimeEnd: t0 + 2e6, Name: "b", Value: 2}, // 11:00:01
		{TimeEnd: t0 + 1, Name: "c", Value: 3},
	}
	in := make(chan *pipeline.BatchOf[gauge], 1)
	var acked []error
	b := pipeline.NewBatchOf(recs, func(err error) { acked = append(acked, err) })
	b.Seq = 7
	in <- b
	close(in)
	if err := gs.Run(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	if len(acked) != 1 || acked[0] != nil {
		t.Fatalf("acks %v, want one nil", acked)
	}
	want := map[string][]string{
		"gauges/dt=2025-03-01/hour=10/node-a-00000000000000000007-00000000000000000007.parquet": {"a", "c"},
		"gauges/dt=2025-03-01/hour=11/node-a-00000000000000000007-00000000000000000007.parquet": {"b"},
	}
	files, _ := filepath.Glob(filepath.Join(cfg.Output, "*", "dt=*", "hour=*", "*.parquet"))
	if len(files) != len(want) {
		t.Fatalf("files %v, want %d", files, len(want))
	}
	for _, p := range files {
		rel, _ := filepath.Rel(cfg.Output, p)
		names, ok := want[rel]
		if !ok {
			t.Errorf("unexpected file %s", rel)
			continue
		}
		pf := openParquet(t, p)
		if v, _ := pf.Lookup(schemas.MetadataKey); v != "gauge.v1" {
			t.Errorf("%s: %s=%q, want gauge.v1", rel, schemas.MetadataKey, v)
		}
		fd, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := fd.Stat()
		rows, err := pq.Read[gauge](fd, st.Size())
		_ = fd.Close()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range rows {
			got = append(got, r.Name)
		}
		if !slices.Equal(got, names) {
			t.Errorf("%s: rows %v, want %v", rel, got, names)
		}
	}
	rows := gatherValue(t, e.reg, "tapflow_parquet_rows_committed_total", "gauge.v1")
	if rows != 3 {
		t.Errorf("rows_committed{schema=gauge.v1} = %v, want 3", rows)
	}
	if flows := gatherValue(t, e.reg, "tapflow_parquet_rows_committed_total", schemas.SchemaName); flows != 0 {
		t.Errorf("rows_committed{schema=flow.v1} = %v, want 0", flows)
	}
}

func gatherValue(t *testing.T, reg *prometheus.Registry, name, schema string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "schema" && l.GetValue() == schema {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("metric %s{schema=%q} not found", name, schema)
	return 0
}
