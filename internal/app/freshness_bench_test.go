package app

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pq "github.com/parquet-go/parquet-go"
	dto "github.com/prometheus/client_model/go"

	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/obs"
	"github.com/tapflow/tapflow/internal/testkit/transporttest"
	"github.com/tapflow/tapflow/internal/units"
	"github.com/tapflow/tapflow/pipeline"
	"github.com/tapflow/tapflow/schemas"
	"github.com/tapflow/tapflow/sinks/parquet"
)

// freshnessRate is the agent's rate in BenchmarkFreshness: one node of
// docs/capacity.md's example fleet (R = 5,000 records/s). At the default
// roll_size a collector rolls by age below ~11,000 records/s.
const freshnessRate = 5000

// BenchmarkFreshness (issue 22 item 6): flow end → committed Parquet
// file through the real agent (synthetic source at freshnessRate,
// default batching: 16,384 records or 1 s), an embedded JetStream and the
// real collector, at the shipped roll settings (roll_age 5m, roll_size
// 128MiB) and with roll_age 30s. Each run lasts two roll_ages plus 15 s
// (10m15s at the defaults) and measures the files committed by then:
// p50_s and p99_s are exact (each row's time_end against its file's
// modification time, the commit), hist_p99_s is what
// tapflow_parquet_freshness_seconds says (bucket interpolation, as
// histogram_quantile). Run it with -benchtime 1x (make bench does).
func BenchmarkFreshness(b *testing.B) {
	for _, bc := range []struct {
		name    string
		rollAge time.Duration // 0: the shipped default
	}{
		{"defaults", 0},
		{"roll_age=30s", 30 * time.Second},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for range b.N {
				benchFreshness(b, bc.rollAge)
			}
		})
	}
}

func benchFreshness(b *testing.B, rollAge time.Duration) {
	dir := b.TempDir()
	s := transporttest.Run(b, "")
	cfg := config.Default()
	cfg.Node, cfg.DataDir = "bench", dir
	cfg.Synthetic.Tenants, cfg.Synthetic.VMsPerTenant, cfg.Synthetic.LoadBalancers = 4, 6, 2
	cfg.Synthetic.FlowsPerSecond, cfg.Synthetic.RecordsPerSecond = freshnessRate/10, freshnessRate
	if rollAge > 0 {
		cfg.Collector.Parquet.RollAge = units.Duration(rollAge)
	}
	cfg.Resolve()
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	rollAge = cfg.Collector.Parquet.RollAge.D()
	rt := func() *runtime {
		return &runtime{log: quiet, reg: obs.NewRegistry(), js: s.JS, pm: pipeline.NewMetrics(nil)}
	}
	crt := rt()
	coll, err := newCollector(cfg, crt, false)
	if err != nil {
		b.Fatal(err)
	}
	a, err := newAgent(cfg, rt())
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	collDone, agentDone := make(chan error, 1), make(chan error, 1)
	go func() { collDone <- coll.Run(ctx) }()
	go func() { agentDone <- a.Run(ctx) }()
	b.ResetTimer()
	time.Sleep(2*rollAge + 15*time.Second)
	b.StopTimer()
	// What is committed now: whole rolls only (the stop's commit would
	// add a fresher partial one).
	fresh, files := committedFreshness(b, filepath.Join(dir, "flows"))
	h := histogram(b, crt.reg, "tapflow_parquet_freshness_seconds", map[string]string{"schema": "flow.v1", "stage": parquet.StageCommitted})
	cancel()
	for _, ch := range []chan error{agentDone, collDone} {
		if err := <-ch; err != nil && !errors.Is(err, context.Canceled) {
			b.Fatal(err)
		}
	}
	if len(fresh) == 0 || h == nil {
		b.Fatalf("nothing committed in %s (histogram %v)", 2*rollAge+15*time.Second, h)
	}
	slices.Sort(fresh)
	q := func(p float64) float64 { return float64(fresh[min(len(fresh)-1, int(p*float64(len(fresh))))]) }
	b.ReportMetric(q(0.50), "p50_s")
	b.ReportMetric(q(0.99), "p99_s")
	b.ReportMetric(histQuantile(h, 0.99), "hist_p99_s")
	b.ReportMetric(float64(len(fresh)), "rows")
	b.ReportMetric(float64(files), "files")
	b.ReportMetric(0, "ns/op")
	if h.GetSampleCount() < uint64(len(fresh)) {
		b.Errorf("histogram counted %d rows, the committed files hold %d", h.GetSampleCount(), len(fresh))
	}
}

// committedFreshness returns, for every row of the committed files under
// root, its file's modification time (the commit) minus its time_end, in
// seconds, and the number of files.
func committedFreshness(b *testing.B, root string) ([]float32, int) {
	b.Helper()
	var out []float32
	files := 0
	buf := make([]schemas.Flow, 4096)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), ".") || filepath.Ext(p) != ".parquet" {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		files++
		commit := float64(st.ModTime().UnixNano()) / 1e9
		r := pq.NewGenericReader[schemas.Flow](f)
		defer r.Close()
		for {
			n, err := r.Read(buf)
			for i := range buf[:n] {
				out = append(out, float32(max(0, commit-float64(buf[i].TimeEnd)/1e6)))
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	return out, files
}

// histQuantile is histogram_quantile over a gathered histogram.
func histQuantile(h *dto.Histogram, q float64) float64 {
	total := float64(h.GetSampleCount())
	if total == 0 {
		return math.NaN()
	}
	rank, lo, prev := q*total, 0.0, 0.0
	for _, bk := range h.GetBucket() {
		c := float64(bk.GetCumulativeCount())
		if c >= rank && c > prev {
			return lo + (bk.GetUpperBound()-lo)*(rank-prev)/(c-prev)
		}
		lo, prev = bk.GetUpperBound(), c
	}
	return lo
}
