package audit

import (
	"context"
	"testing"
	"time"

	"github.com/tapflow/tapflow/internal/dataset"
	"github.com/tapflow/tapflow/internal/report"
	"github.com/tapflow/tapflow/internal/testkit/metered"
)

// BenchmarkAudit audits ~150k flow records and ~40k meter records (16
// taps × 2 directions over 2 h) and, as the baseline in the same run,
// sums the same flow files per node, ifname, direction and hour with
// tapflow report's column reader. records/s counts flow and meter rows.
func BenchmarkAudit(b *testing.B) {
	ctx := context.Background()
	d := metered.Generate(metered.Spec{Nodes: 4, Taps: 4, MeanGap: 200 * time.Millisecond, MeterInterval: 5 * time.Second})
	dir := b.TempDir()
	if err := metered.Write(ctx, dir, d, nil); err != nil {
		b.Fatal(err)
	}
	out, err := dataset.Open(ctx, dir, dataset.Options{})
	if err != nil {
		b.Fatal(err)
	}
	rows := float64(len(d.Flows) + len(d.Meters))
	b.Run("audit", func(b *testing.B) {
		for b.Loop() {
			r, err := Run(ctx, out, Options{})
			if err != nil || !r.OK() {
				b.Fatalf("%v %v", err, r.Mismatches)
			}
		}
		b.ReportMetric(rows*float64(b.N)/b.Elapsed().Seconds(), "records/s")
	})
	b.Run("report_baseline", func(b *testing.B) {
		for b.Loop() {
			if _, err := report.ReadOutput(ctx, out, report.Options{By: []string{"node", "ifname", "direction", "hour"}}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(d.Flows))*float64(b.N)/b.Elapsed().Seconds(), "records/s")
	})
}
