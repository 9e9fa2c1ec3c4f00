package compat

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/internal/app"
	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/schemas"
)

// TestRealPipelineOutput runs `tapflow run` in-process (synthetic source →
// attribution → Arrow over an embedded JetStream → collector → Parquet)
// for a few seconds, then checks with DuckDB that the output has every
// record parquet-go reads from the same files, once, with the same sums,
// and that the cookbook's audit holds.
func TestRealPipelineOutput(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	cfg.Node, cfg.DataDir = "compat-node", dir
	cfg.Metrics.Listen = ""
	cfg.Synthetic.Tenants, cfg.Synthetic.VMsPerTenant, cfg.Synthetic.LoadBalancers = 4, 6, 2
	cfg.Synthetic.FlowsPerSecond, cfg.Synthetic.RecordsPerSecond = 500, 20000
	cfg.Synthetic.BatchRecords = 2000
	cfg.Synthetic.BatchMaxAge = units.Duration(200 * time.Millisecond)
	cfg.Collector.Parquet.RollAge = units.Duration(time.Second)
	cfg.Agent.ShutdownTimeout = units.Duration(20 * time.Second)
	cfg.Resolve()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := app.RunAll(ctx, cfg, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}

	// parquet-go's view of the files.
	var want struct{ rows, bytes, packets int64 }
	files, _ := filepath.Glob(filepath.Join(dir, "flows", "dt=*", "hour=*", "*.parquet"))
	if len(files) == 0 {
		t.Fatal("the pipeline wrote no file")
	}
	for _, p := range files {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := f.Stat()
		rows, err := pq.Read[schemas.Flow](f, st.Size())
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		for _, r := range rows {
			want.rows++
			want.bytes += r.Bytes
			want.packets += r.Packets
		}
	}
	db := openDB(t)
	got := query(t, db, fmt.Sprintf(`SELECT count(*), count(DISTINCT (agent_id, batch_seq, record_index)), sum(bytes), sum(packets),
		count(*) FILTER (WHERE tenant_id = '' OR zone = '' OR metadata_version = 0),
		count(*) FILTER (WHERE dt <> CAST(time_end AT TIME ZONE 'UTC' AS DATE) OR CAST(hour AS INTEGER) <> hour(time_end AT TIME ZONE 'UTC'))
		FROM read_parquet('%s', hive_partitioning = true)`, glob(dir)))
	exp := fmt.Sprintf("%d|%d|%d|%d|0|0", want.rows, want.rows, want.bytes, want.packets)
	if len(got) != 1 || got[0] != exp {
		t.Fatalf("DuckDB: records|identities|bytes|packets|unattributed|misplaced = %v, want %s", got, exp)
	}
	t.Logf("%d records in %d files read back by DuckDB", want.rows, len(files))
}
